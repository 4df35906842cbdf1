# One rule serves every sweep point: {point} names a method spec from config (lantern.config.expand_methods).


def neighbours_table():
    return f"{OUT}/neighbours/{config['neighbours']['metric']}_K{config['neighbours']['max_k']}.pt"


def generate_inputs(wildcards):
    method = POINTS[wildcards.point]
    inputs = {"target": target_ckpt(), "vq": vq_ckpt()}
    if method["name"] != "vanilla":
        inputs["drafter"] = drafter_ckpt()
    if method["name"] in ("lantern", "lanternpp"):
        inputs["neighbours"] = neighbours_table()
    return inputs


def shard_range(shard):
    """Contiguous, index-aligned slices: shard j of S covers images [j*n/S, (j+1)*n/S)."""
    n, S = config["sweep"]["n_images"], config["sweep"]["shards"]
    return int(shard) * n // S, (int(shard) + 1) * n // S


def optional(flag, inputs, key):
    return f"{flag} {inputs[key]}" if key in inputs.keys() else ""


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
        method=lambda w: as_arg(POINTS[w.point]),
        seed=lambda w: POINTS[w.point]["seed"],
        start=lambda w: shard_range(w.shard)[0],
        end=lambda w: shard_range(w.shard)[1],
        sampling=as_arg(config["sampling"]),
        extra=lambda w, input: " ".join(
            filter(None, [optional("--drafter", input, "drafter"), optional("--neighbours", input, "neighbours")])
        ),
    shell:
        "{GPU_RUN} {LANTERN} sample --target {input.target} --vq {input.vq} {params.extra}"
        " --method {params.method} --sampling {params.sampling} --mode {wildcards.mode} --seed {params.seed}"
        " --start {params.start} --end {params.end} --out {output} --device {config[device]} --dtype {config[dtype]}"
        " --threads {threads} > {log} 2>&1"
