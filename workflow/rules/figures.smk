# Paper figures, each drawn from the tidy tables only (the sample grids also read PNGs); one shared style file.

STYLE = "src/lantern/figures/lantern.mplstyle"
HAS_LANTERN = any(p["name"] == "lantern" for p in POINTS.values())
HAS_TREES = any(p.get("drafting") in ("static", "dynamic") for p in POINTS.values())
HAS_DRAFTS = any(p["name"] != "vanilla" for p in POINTS.values())
TABLE_FIGURES = ["tradeoff"] + ["tau_vs_delta", "heatmap"] * HAS_LANTERN + ["tree_depth"] * HAS_TREES
TABLE_FIGURES += ["acceptance_map"] * HAS_DRAFTS


def figure_outputs():
    figures = [f"{OUT}/figures/{name}.png" for name in TABLE_FIGURES]
    figures += expand(f"{OUT}/figures/samples_{{mode}}.png", mode=MODES)
    if TOY:
        figures.append(f"{OUT}/figures/ambiguity.png")
    return figures


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
        folder=f"{OUT}/tables",
    shell:
        "{LANTERN} figure {wildcards.name} --tables {params.folder} --style {input.style} --out {output} > {log} 2>&1"


rule figure_samples:
    input:
        tables=rules.tables.output,
        style=STYLE,
    output:
        report(f"{OUT}/figures/samples_{{mode}}.png", category="Sample galleries", caption="../report/samples.rst",
               labels={"mode": "{mode}"}),
    log:
        f"{OUT}/logs/figures/samples_{{mode}}.log",
    params:
        folder=f"{OUT}/tables",
        gen=f"{OUT}/gen",
    shell:
        "{LANTERN} figure samples --tables {params.folder} --gen {params.gen} --mode {wildcards.mode}"
        " --style {input.style} --out {output} > {log} 2>&1"


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
        worlds=lambda w, input: " ".join(f"{world}={path}" for world, path in zip(WORLDS, input.steps)),
    shell:
        "{LANTERN} figure ambiguity --ambiguity {params.worlds} --style {input.style} --out {output} > {log} 2>&1"
