# The real-model world (world: llamagen): prompts -> T5 caption features per generation shard (t2i), and the
# drafter of a published target: the authors' release converted, or trained as they did on real images
# (class folders or captioned images -> centre crop -> VQ codes (+ caption features) -> teacher-forced training).
# The rules exist in every world (profiles name them); only a llamagen run asks for their outputs.


rule prompts:
    output:
        f"{OUT}/llamagen/prompts.csv",
    log:
        f"{OUT}/logs/llamagen/prompts.log",
    params:
        source=prompt_source(),
        n=config["sweep"]["n_images"],
    conda:
        "../../environment.yml"
    shell:
        "lantern prompts {params.source} --n {params.n} --out {output:q} > {log:q} 2>&1"


# One caption-feature file per generation shard, over the same image range, so a shard's job reads only its own.
rule caption_features:
    input:
        f"{OUT}/llamagen/prompts.csv",
    output:
        f"{OUT}/llamagen/captions/shard{{shard}}.pt",
    log:
        f"{OUT}/logs/llamagen/captions/shard{{shard}}.log",
    benchmark:
        f"{OUT}/benchmarks/llamagen/captions/shard{{shard}}.tsv"
    params:
        start=lambda w: shard_range(w.shard)[0],
        end=lambda w: shard_range(w.shard)[1],
        source=T5_SOURCE,
        max_length=T5["max_length"],
        device=config["device"],
    conda:
        "../../environment.yml"
    shell:
        "lantern-gpu-run lantern encode-captions --prompts {input:q} --start {params.start} --end {params.end}"
        " {params.source} --max-length {params.max_length} --device {params.device} --out {output:q} > {log:q} 2>&1"


rule drafter_images:
    input:
        vq=vq_ckpt(),
    output:
        tokens=f"{OUT}/llamagen/drafter/data/shard{{shard}}.pt",
        # captioned images: their captions, for drafter_caption_features (class folders carry none)
        **({"captions": f"{OUT}/llamagen/drafter/data/shard{{shard}}.csv"} if CAPTIONED else {}),
    log:
        f"{OUT}/logs/llamagen/drafter_images/shard{{shard}}.log",
    benchmark:
        f"{OUT}/benchmarks/llamagen/drafter_images/shard{{shard}}.tsv"
    params:
        start=lambda w: drafter_shard_range(w.shard)[0],
        end=lambda w: drafter_shard_range(w.shard)[1],
        images=shlex.quote(DRAFTER["images"]),
        captions=lambda w, output: f"--captions-out {shlex.quote(output.captions)}" if CAPTIONED else "",
        layout=DRAFTER["layout"],
        image_size=LLAMAGEN["image_size"],
        device=config["device"],
    conda:
        "../../environment.yml"
    shell:
        "lantern-gpu-run lantern encode-images --images {params.images} --layout {params.layout} --vq {input.vq:q}"
        " --image-size {params.image_size} --start {params.start} --end {params.end} --out {output.tokens:q}"
        " {params.captions} --device {params.device} > {log:q} 2>&1"


rule drafter_caption_features:
    input:
        f"{OUT}/llamagen/drafter/data/shard{{shard}}.csv",
    output:
        f"{OUT}/llamagen/drafter/data/features{{shard}}.pt",
    log:
        f"{OUT}/logs/llamagen/drafter_captions/shard{{shard}}.log",
    params:
        source=T5_SOURCE,
        max_length=T5["max_length"],
        device=config["device"],
    conda:
        "../../environment.yml"
    shell:
        "lantern-gpu-run lantern encode-captions --prompts {input:q} {params.source} --max-length {params.max_length}"
        " --device {params.device} --out {output:q} > {log:q} 2>&1"


if not TOY:  # the toy world trains its drafter in drafter.smk

    rule train_drafter:
        input:
            unpack(drafter_training_inputs),
        output:
            f"{OUT}/llamagen/drafter/trained.pt",
        log:
            f"{OUT}/logs/llamagen/train_drafter.log",
        benchmark:
            f"{OUT}/benchmarks/llamagen/train_drafter.tsv"
        threads: 2
        params:
            p=as_arg(DRAFTER["train"]),
            threads=lambda w, threads: threads_arg(threads),
            features=lambda w, input: " ".join(["--caption-features", *map(shlex.quote, input.features)]) if T2I else "",
            tokens=lambda w, input: " ".join(map(shlex.quote, input.tokens)),
            spec=SPEC_ARG,
            device=config["device"],
        conda:
            "../../environment.yml"
        shell:
            "lantern-gpu-run lantern train-drafter --target {input.target:q} {params.spec} --tokens {params.tokens}"
            " {params.features} --out {output:q} --device {params.device} --params {params.p} --threads {params.threads} > {log:q} 2>&1"


rule convert_target:
    input:
        src=LLAMAGEN["gpt_ckpt"] if not TOY and target_source(config) == "authors" else "none",
    output:
        f"{OUT}/llamagen/target/converted.pt",
    log:
        f"{OUT}/logs/llamagen/convert_target.log",
    params:
        spec=SPEC_ARG,
    conda:
        "../../environment.yml"
    shell:
        "lantern convert --kind target --src {input.src:q} {params.spec} --out {output:q} > {log:q} 2>&1"


rule convert_drafter:
    input:
        src=LLAMAGEN["authors_drafter"] or "none",
        target=target_ckpt(),
    output:
        f"{OUT}/llamagen/drafter/converted.pt",
    log:
        f"{OUT}/logs/llamagen/convert_drafter.log",
    params:
        spec=SPEC_ARG,
    conda:
        "../../environment.yml"
    shell:
        "lantern convert --kind drafter --src {input.src:q} --target {input.target:q} {params.spec} --out {output:q}"
        " > {log:q} 2>&1"
