# Latent-proximity neighbour tables from the VQ codebook, and the EAGLE drafter of the target.


rule neighbours:
    input:
        vq=vq_ckpt(),
        # a Chameleon VQGAN is read through its layout's reader, checked against its vqgan.yaml
        **({"yaml": VQGAN_YAML} if CHAMELEON else {}),
    output:
        f"{OUT}/neighbours/{{metric}}_K{{max_k}}.pt",
    log:
        f"{OUT}/logs/neighbours/{{metric}}_K{{max_k}}.log",
    benchmark:
        f"{OUT}/benchmarks/neighbours/{{metric}}_K{{max_k}}.tsv"
    params:
        p=lambda w: as_arg({"metric": w.metric, "k": int(w.max_k)}),
    conda:
        "../../environment.yml"
    shell:
        # other worlds' command stays as it was, so that their finished tables are not rerun for a new rule text
        ("lantern chameleon-neighbours --vqgan-yaml {input.yaml:q}" if CHAMELEON else "lantern neighbours")
        + " --vq {input.vq:q} --out {output:q} --params {params.p} > {log:q} 2>&1"


# defined with shipped checkpoints too: the drafter alone can be retrained for the shipped target (see ship_toy.py
# --only drafter), while sampling reads models/toy/default/drafter.pt
if TOY:

    rule train_drafter:
        input:
            target=toy_model("default", "target"),
            # real sequences only when the recipe trains on them (toy.drafter.data real / both)
            tokens=lambda w: [] if config["toy"]["drafter"].get("data") == "self" else
            [f"{OUT}/toy/default/data/train_tokens.pt"],
        output:
            f"{OUT}/toy/default/models/drafter.pt",
        log:
            f"{OUT}/logs/train_drafter/default.log",
        benchmark:
            f"{OUT}/benchmarks/train_drafter/default.tsv"
        threads: 2
        params:
            # the recipe alone, so that --rerun-triggers params sees a change: Snakemake does not track params that
            # are functions of threads
            p=as_arg(config["toy"]["drafter"]),
            tokens=lambda w, input: f"--tokens {' '.join(map(shlex.quote, input.tokens))}" if input.tokens else "",
            threads=lambda w, threads: threads_arg(threads),
            device=config["device"],
        conda:
            "../../environment.yml"
        shell:
            "lantern-gpu-run lantern train-drafter --target {input.target:q} {params.tokens} --out {output:q}"
            " --device {params.device} --params {params.p} --threads {params.threads} > {log:q} 2>&1"
