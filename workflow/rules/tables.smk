# Tidy tables: one row per (mode, sweep point) with speed, quality and protocol columns, plus the paper's table;
# rounds.csv: a round's time per timer section at each batch size timed (the round_anatomy figure).

TABLES = ["sweep.csv", "positions.csv", "depths.csv", "rounds.csv", "summary.md"]


rule tables:
    input:
        shards=mode_shards(),
        metrics=mode_metrics(),
        worlds=expand(f"{OUT}/toy/{{world}}/ambiguity.csv", world=WORLDS) if TOY else [],
    output:
        sweep=report(f"{OUT}/tables/sweep.csv", category="Tables", caption="../report/sweep.rst"),
        positions=f"{OUT}/tables/positions.csv",
        depths=f"{OUT}/tables/depths.csv",
        rounds=f"{OUT}/tables/rounds.csv",
        summary=report(f"{OUT}/tables/summary.md", category="Tables", caption="../report/summary.rst"),
    log:
        f"{OUT}/logs/tables.log",
    params:
        folder=lambda w, output: Path(output.sweep).parent,
        worlds=lambda w, input: " ".join(["--worlds"] + [shlex.quote(f) for f in input.worlds]) if TOY else "",
    conda:
        "../../environment.yml"
    shell:
        "lantern tables --shards {input.shards:q} --metrics {input.metrics:q} --out {params.folder:q} {params.worlds}"
        " > {log:q} 2>&1"
