# Quality metrics per sweep point: FID / KID / precision-recall (torch-fidelity), CLIP score (open_clip), HPS v2.1
# where metrics.hpsv2 enables it and, in the toy world, class accuracy (the classifier trained by train_classifier,
# or shipped in models/toy/default/).


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
            p=as_arg(config["toy"]["clip"]),
            threads=lambda w, threads: threads_arg(threads),
        conda:
            "../../environment.yml"
        shell:
            "lantern train-clip --data {input.data:q} --vq {input.vq:q} --out {output.weights:q} --params {params.p}"
            " --threads {params.threads} > {log:q} 2>&1"


# defined with shipped checkpoints too: the classifier alone can be retrained on the shipped VQ's reconstructions
# (see ship_toy.py --only classifier), while evaluate reads models/toy/default/classifier.pt
if TOY:

    rule train_classifier:
        input:
            data=f"{OUT}/toy/default/data/train.pt",
            val=f"{OUT}/toy/default/data/val.pt",
            vq=toy_model("default", "vq"),
        output:
            weights=f"{OUT}/toy/default/models/classifier.pt",
            record=f"{OUT}/toy/default/models/classifier.json",
        log:
            f"{OUT}/logs/train_classifier/default.log",
        benchmark:
            f"{OUT}/benchmarks/train_classifier/default.tsv"
        threads: 2
        params:
            p=as_arg(config["toy"]["classifier"]),
            threads=lambda w, threads: threads_arg(threads),
        conda:
            "../../environment.yml"
        shell:
            "lantern train-classifier --data {input.data:q} --val {input.val:q} --vq {input.vq:q}"
            " --out {output.weights:q} --params {params.p} --threads {params.threads} > {log:q} 2>&1"


rule evaluate:
    input:
        shards=lambda w: expand(f"{OUT}/gen/{w.mode}/{w.point}/shard{{j}}", j=SHARDS),
        reference=reference_images(),
        clip=clip_ckpt(),
        classifier=classifier_input(),
        hpsv2=[config["metrics"]["hpsv2"]["weights_path"]] if config["metrics"]["hpsv2"]["enabled"] else [],
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
        p=as_arg(evaluate_params(config, clip_ckpt(), classifier_ckpt())),
    conda:
        "../../environment.yml"
    shell:
        "lantern-gpu-run lantern evaluate --images {params.images} --reference {input.reference:q}"
        " --captions {params.captions} --out {output:q} --params {params.p} --threads {params.threads} > {log:q} 2>&1"
