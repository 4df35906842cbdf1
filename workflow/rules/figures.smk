# Paper figures, each drawn from the tidy tables only (the sample grids also read PNGs); one shared style file.

rule figure:
    input:
        tables=rules.tables.output,
        style=STYLE,
    output:
        report(f"{OUT}/figures/{{name}}.png", category="Figures", caption="../report/figure.rst",
               labels={"figure": "{name}"}),
    log:
        f"{OUT}/logs/figures/{{name}}.log",
    wildcard_constraints:
        name="|".join(TABLE_FIGURES) or "none",
    params:
        folder=lambda w, input: Path(input.tables[0]).parent,
    conda:
        "../../environment.yml"
    shell:
        "lantern figure {wildcards.name} --tables {params.folder:q} --style {input.style:q} --out {output:q} > {log:q} 2>&1"


rule figure_samples:
    input:
        tables=rules.tables.output,
        shards=lambda w: mode_shards([w.mode]),
        style=STYLE,
    output:
        report(f"{OUT}/figures/samples_{{mode}}.png", category="Sample galleries", caption="../report/samples.rst",
               labels={"mode": "{mode}"}),
    log:
        f"{OUT}/logs/figures/samples_{{mode}}.log",
    params:
        folder=lambda w, input: Path(input.tables[0]).parent,
        gen=lambda w, input: Path(input.shards[0]).parents[2],
        p=as_arg({"toy_class_names": TOY}),
    conda:
        "../../environment.yml"
    shell:
        "lantern figure samples --tables {params.folder:q} --gen {params.gen:q} --mode {wildcards.mode}"
        " --params {params.p} --style {input.style:q} --out {output:q} > {log:q} 2>&1"


rule figure_ambiguity:
    input:
        steps=expand(f"{OUT}/toy/{{world}}/ambiguity_steps.csv", world=WORLDS),
        style=STYLE,
    output:
        report(f"{OUT}/figures/ambiguity.png", category="Figures", caption="../report/ambiguity.rst",
               labels={"figure": "ambiguity"}),
    log:
        f"{OUT}/logs/figures/ambiguity.log",
    params:
        worlds=lambda w, input: " ".join(shlex.quote(f"{world}={path}") for world, path in zip(WORLDS, input.steps)),
    conda:
        "../../environment.yml"
    shell:
        "lantern figure ambiguity --ambiguity {params.worlds} --style {input.style:q} --out {output:q} > {log:q} 2>&1"
