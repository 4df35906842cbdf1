# Quality metrics per sweep point: FID / KID / precision-recall (torch-fidelity) and CLIP score (open_clip).


if TRAIN_TOY:

    rule train_clip:
        input:
            data=f"{OUT}/toy/default/data/train.pt",
            vq=toy_model("default", "vq"),
        output:
            weights=f"{OUT}/toy/default/models/clip.pt",
            config=f"{OUT}/toy/default/models/clip.json",
            metrics=f"{OUT}/toy/default/models/clip.metrics.json",
        log:
            f"{OUT}/logs/train_clip/default.log",
        benchmark:
            f"{OUT}/benchmarks/train_clip/default.tsv"
        threads: 2
        params:
            p=lambda w, threads: as_arg({**config["toy"]["clip"], "threads": threads_arg(threads)}),
        conda:
            "../../environment.yml"
        shell:
            "lantern train-clip --data {input.data:q} --vq {input.vq:q} --out {output.weights:q} --params {params.p}"
            " > {log:q} 2>&1"


rule evaluate:
    input:
        shards=lambda w: expand(f"{OUT}/gen/{w.mode}/{w.point}/shard{{j}}", j=SHARDS),
        reference=reference_images(),
        clip=clip_ckpt(),
    output:
        f"{OUT}/metrics/{{mode}}/{{point}}.json",
    log:
        f"{OUT}/logs/evaluate/{{mode}}/{{point}}.log",
    benchmark:
        f"{OUT}/benchmarks/evaluate/{{mode}}/{{point}}.tsv"
    threads: 1
    params:
        threads=lambda w, threads: threads_arg(threads),
        images=lambda w, input: " ".join(shlex.quote(f"{s}/images") for s in input.shards),
        captions=lambda w, input: " ".join(shlex.quote(f"{s}/stats.csv") for s in input.shards),
        p=as_arg(evaluate_params(config, clip_ckpt())),
    conda:
        "../../environment.yml"
    shell:
        "lantern-gpu-run lantern evaluate --images {params.images} --reference {input.reference:q}"
        " --captions {params.captions} --out {output:q} --params {params.p} --threads {params.threads} > {log:q} 2>&1"
