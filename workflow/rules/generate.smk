# One rule serves every sweep point: {point} names a method spec from config (lantern.pipeline.config.expand_methods).


rule generate:
    input:
        unpack(generate_inputs),
    output:
        directory(f"{OUT}/gen/{{mode}}/{{point}}/shard{{shard}}"),
    log:
        f"{OUT}/logs/generate/{{mode}}/{{point}}/shard{{shard}}.log",
    benchmark:
        f"{OUT}/benchmarks/generate/{{mode}}/{{point}}/shard{{shard}}.tsv"
    # One thread: batch-1 decoding of small models is fastest single-threaded, and jobs then time fairly side by side.
    threads: 1
    params:
        threads=lambda w, threads: threads_arg(threads),
        method=lambda w: as_arg(decoder_spec(POINTS[w.point])),
        seed=lambda w: POINTS[w.point]["seed"],
        start=lambda w: shard_range(w.shard, w.mode)[0],
        end=lambda w: shard_range(w.shard, w.mode)[1],
        sampling=as_arg(config["sampling"]),
        device=config["device"],
        dtype=config["dtype"],
        extra=lambda w, input: " ".join(
            filter(None, [optional("--drafter", input, "drafter"), optional("--neighbours", input, "neighbours"),
                          optional("--captions", input, "captions"), optional("--prompts", input, "prompts"),
                          SPEC_ARG, CHAMELEON_ARG, IN_JOB_ARG])
        ),
        batch=lambda w: config["sweep"]["batch_size"][w.mode],
        compile=str(config["compile"]).lower(),
        latency=lambda w: latency_counts(config["sweep"], w.mode)[int(w.shard)],
        pad=config["llamagen"]["pad_semantics"],
    conda:
        "../../environment.yml"
    shell:
        "lantern-gpu-run lantern sample --target {input.target:q} --vq {input.vq:q} {params.extra}"
        " --method {params.method} --sampling {params.sampling} --mode {wildcards.mode} --seed {params.seed}"
        " --start {params.start} --end {params.end} --out {output:q} --device {params.device} --dtype {params.dtype}"
        " --compile {params.compile} --batch-size {params.batch} --latency-images {params.latency}"
        " --pad-semantics {params.pad} --threads {params.threads} > {log:q} 2>&1"
