# The toy world: procedural images -> VQ tokenizer -> GPT target (and, in drafter.smk / metrics.smk, its drafter
# and CLIP). With toy.checkpoints = shipped the models come from models/toy/ (made by these rules, see its
# MANIFEST.json); with train they are trained here.


rule toy_data:
    output:
        f"{OUT}/toy/{{world}}/data/{{split}}.pt",
    log:
        f"{OUT}/logs/toy_data/{{world}}_{{split}}.log",
    params:
        n=lambda w: split_range(w.world, w.split)[1],
        start=lambda w: split_range(w.world, w.split)[0],
        data=lambda w: as_arg(data_params(config, w.world)),
        seed=config["seed"],
    conda:
        "../../environment.yml"
    shell:
        "lantern make-data --out {output:q} --n {params.n} --start {params.start} --seed {params.seed}"
        " --params {params.data} > {log:q} 2>&1"


rule tokenize:
    input:
        data=f"{OUT}/toy/{{world}}/data/{{split}}.pt",
        vq=lambda w: toy_model(w.world, "vq"),
    output:
        f"{OUT}/toy/{{world}}/data/{{split}}_tokens.pt",
    log:
        f"{OUT}/logs/tokenize/{{world}}_{{split}}.log",
    threads: 1  # at 2 it kept 0.7-1.4 cores busy yet held a 2-core machine alone (docs/development.md)
    params:
        threads=lambda w, threads: threads_arg(threads),
    conda:
        "../../environment.yml"
    shell:
        "lantern tokenize --data {input.data:q} --vq {input.vq:q} --out {output:q} --threads {params.threads} > {log:q} 2>&1"


rule ambiguity:
    input:
        target=lambda w: toy_model(w.world, "target"),
        vq=lambda w: toy_model(w.world, "vq"),
        heldout=f"{OUT}/toy/{{world}}/data/val_tokens.pt",
        val=f"{OUT}/toy/{{world}}/data/val.pt",
        classifier=lambda w: classifier_input() if w.world == "default" else [],
    output:
        table=f"{OUT}/toy/{{world}}/ambiguity.csv",
        stats=f"{OUT}/toy/{{world}}/world_stats.json",
        steps=f"{OUT}/toy/{{world}}/ambiguity_steps.csv",
        grid=report(f"{OUT}/toy/{{world}}/samples.png", category="Toy world", caption="../report/toy_samples.rst"),
    log:
        f"{OUT}/logs/ambiguity/{{world}}.log",
    benchmark:
        f"{OUT}/benchmarks/ambiguity/{{world}}.tsv"
    threads: 1  # at 2 it kept 0.7-1.4 cores busy yet held a 2-core machine alone (docs/development.md)
    params:
        threads=lambda w, threads: threads_arg(threads),
        p=as_arg(config["toy"].get("ambiguity", {})),
        # the class-accuracy classifier is the default world's (trained on its images and VQ)
        classifier=lambda w: (f"--classifier {shlex.quote(classifier_ckpt())}"
                              if w.world == "default" and classifier_ckpt() else ""),
    conda:
        "../../environment.yml"
    shell:
        "lantern ambiguity --target {input.target:q} --vq {input.vq:q} --heldout {input.heldout:q} --out {output.table:q}"
        " --steps-out {output.steps:q} --grid {output.grid:q} --stats-out {output.stats:q} --val-images {input.val:q}"
        " {params.classifier} --params {params.p} --threads {params.threads} > {log:q} 2>&1"


if TRAIN_TOY:

    rule train_vq:
        input:
            data=f"{OUT}/toy/{{world}}/data/train.pt",
            val=f"{OUT}/toy/{{world}}/data/val.pt",
        output:
            f"{OUT}/toy/{{world}}/models/vq.pt",
        log:
            f"{OUT}/logs/train_vq/{{world}}.log",
        benchmark:
            f"{OUT}/benchmarks/train_vq/{{world}}.tsv"
        threads: 1
        params:
            threads=lambda w, threads: threads_arg(threads),
            p=lambda w: as_arg(vq_params(config, w.world)),
        conda:
            "../../environment.yml"
        shell:
            "lantern train-vq --data {input.data:q} --val {input.val:q} --out {output:q} --params {params.p}"
            " --threads {params.threads} > {log:q} 2>&1"

    rule train_gpt:
        input:
            tokens=lambda w: [f"{OUT}/toy/{w.world}/data/{split}_tokens.pt" for split in target_splits(w.world)],
            val=f"{OUT}/toy/{{world}}/data/val_tokens.pt",
        output:
            f"{OUT}/toy/{{world}}/models/target.pt",
        log:
            f"{OUT}/logs/train_gpt/{{world}}.log",
        benchmark:
            f"{OUT}/benchmarks/train_gpt/{{world}}.tsv"
        threads: 2
        params:
            threads=lambda w, threads: threads_arg(threads),
            p=lambda w: as_arg(target_params(config, w.world)),
        conda:
            "../../environment.yml"
        shell:
            "lantern train-gpt --tokens {input.tokens:q} --val {input.val:q} --out {output:q} --params {params.p}"
            " --threads {params.threads} > {log:q} 2>&1"
