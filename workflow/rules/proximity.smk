# LANTERN's premise (its Fig. 3): codes near each other in the VQ latent space are interchangeable. `lantern
# proximity` replaces a fraction of held-out tokens by their m-th nearest neighbour, decodes them with the VQ and
# scores the shift with the run's FD extractor (the default toy world: also with its class-accuracy classifier,
# how often a swap keeps the decode's class). Toy world: every toy world's held-out split (its own VQ and
# neighbour table); llamagen and a Chameleon family: the tokens of the vanilla sweep point (real images may be given
# only as FID statistics, while the vanilla samples exist in every run), a Chameleon VQGAN read with its vqgan.yaml.


rule proximity:
    input:
        unpack(proximity_inputs),
    output:
        table=f"{OUT}/proximity/{{name}}.csv",
        strip=report(f"{OUT}/proximity/{{name}}_strip.png", category="Latent proximity",
                     caption="../report/proximity.rst", labels={"world": "{name}"}),
    log:
        f"{OUT}/logs/proximity/{{name}}.log",
    benchmark:
        f"{OUT}/benchmarks/proximity/{{name}}.tsv"
    wildcard_constraints:
        name="|".join(PROXIMITY_NAMES),
    threads: 1  # at 2 it kept 0.7-1.4 cores busy yet held a 2-core machine alone (docs/development.md)
    params:
        threads=lambda w, threads: threads_arg(threads),
        tokens=proximity_tokens,
        classifier=lambda w, input: optional("--classifier", input, "classifier"),
        fidelity=as_arg(PROXIMITY_FIDELITY),
        p=as_arg({k: v for k, v in PROXIMITY.items() if k != "enabled"}),
        device=config["device"],
    conda:
        "../../environment.yml"
    shell:
        # other worlds' command stays as it was, so that their finished tables are not rerun for a new rule text
        "lantern-gpu-run lantern proximity --vq {input.vq:q}" + (" --vqgan-yaml {input.yaml:q}" if CHAMELEON else "")
        + " --neighbours {input.neighbours:q} --tokens {params.tokens}"
        " --fidelity {params.fidelity} --params {params.p} --world {wildcards.name} --out {output.table:q}"
        " --strip {output.strip:q} {params.classifier} --device {params.device} --threads {params.threads} > {log:q} 2>&1"


# A toy world other than the default has its own VQ, hence its own table (the sweep's is the default VQ's): the
# neighbours rule (drafter.smk) on that world's VQ.
use rule neighbours as proximity_neighbours with:
    input:
        vq=lambda w: toy_model(w.world, "vq"),
    output:
        f"{OUT}/toy/{{world}}/neighbours/{{metric}}_K{{max_k}}.pt",
    log:
        f"{OUT}/logs/proximity/neighbours_{{world}}_{{metric}}_K{{max_k}}.log",
    benchmark:
        f"{OUT}/benchmarks/proximity/neighbours_{{world}}_{{metric}}_K{{max_k}}.tsv"


rule figure_proximity:
    input:
        tables=expand(f"{OUT}/proximity/{{name}}.csv", name=PROXIMITY_NAMES),
        strips=expand(f"{OUT}/proximity/{{name}}_strip.png", name=PROXIMITY_NAMES),
        style=STYLE,
    output:
        report(f"{OUT}/figures/proximity.png", category="Figures", caption="../report/proximity.rst",
               labels={"figure": "proximity"}),
    log:
        f"{OUT}/logs/figures/proximity.log",
    params:
        tables=lambda w, input: " ".join(map(shlex.quote, input.tables)),
        strips=lambda w, input: " ".join(shlex.quote(f"{n}={s}") for n, s in zip(PROXIMITY_NAMES, input.strips)),
    conda:
        "../../environment.yml"
    shell:
        "lantern figure proximity --proximity {params.tables} --strip {params.strips} --style {input.style:q}"
        " --out {output:q} > {log:q} 2>&1"
