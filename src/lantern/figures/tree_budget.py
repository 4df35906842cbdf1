"""Static vs dynamic draft trees at matched node budgets (LANTERN++'s comparison under token selection ambiguity).

x = the node budget, drafts verified per target forward (chain gamma, static tree nodes, dynamic total_tokens - 1);
panels: tau, mean accepted depth per verification step, and the headline speed-up. One line per (method family,
drafting kind): a static and a dynamic line of one family at the same x spend the same verification width, so
the gap between them is what the tree's shape buys. Chain points of a family with tree points are drawn as the
budget's low end.
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt

from lantern.engine.methods import label
from lantern.errors import UserError
from lantern.figures.common import draw_absent, legend_entries, modes, read_sweep, speed_label
from lantern.figures.style import color, marker

LINESTYLES = {"chain": ":", "static": "-", "dynamic": "--"}
PANELS = (("tau_incl_bonus", "τ", "τ: tokens per target forward\n(bonus counted)"),
          ("accepted_depth_mean", "accepted depth", "accepted drafts per\nverification step"),
          ("speedup", "speed-up", None))


def budget_ticks(xs: list[float]) -> dict[float, str]:
    """One tick per group of budgets within 10% of each other (57 and 58 nodes are one matched budget)."""
    groups: list[list[float]] = []
    for x in xs:
        if groups and x <= groups[-1][0] * 1.1:
            groups[-1].append(x)
        else:
            groups.append([x])
    return {g[0]: "/".join(f"{int(x)}" for x in g) for g in groups}


@dataclass
class Params:
    families: list[str] | None = None  # default: every family with tree points


def plot(inputs, p: Params):
    df = read_sweep(inputs.tables, ["draft_nodes", "tau_incl_bonus", "accepted_depth_mean", "speedup", "speedup_kind"])
    trees = df[df["drafting"].isin(["static", "dynamic"])]
    families = p.families or list(dict.fromkeys(trees["name"]))
    pts = df[df["name"].isin(families) & df["drafting"].isin(list(LINESTYLES)) & df["draft_nodes"].notna()]
    pts = pts[pts["mode"].isin(trees["mode"])]
    if trees.empty or pts.empty:
        raise UserError("tree_budget: no static or dynamic tree points in this sweep; add some (e.g. a static tree "
                        "and a dynamic tree of the same node count) to sweep.methods")
    rows = modes(pts, inputs.mode)
    fig, axes = plt.subplots(len(rows), len(PANELS), figsize=(5.0 * len(PANELS) + 2.6, 3.8 * len(rows)),
                             squeeze=False, layout="constrained")
    for r, mode in enumerate(rows):
        part = pts[pts["mode"] == mode]
        for c, (col, title, ylabel) in enumerate(PANELS):
            ax = axes[r, c]
            ylabel = ylabel or speed_label(part)
            if part[col].isna().all():  # e.g. no speed-up: n_images <= latency_images and in_job_vanilla false
                draw_absent(ax, title)
                ax.set_title(f"{mode}: {title}")
                continue
            for (name, drafting), line in part.groupby(["name", "drafting"], sort=False):
                # one line per family and drafting kind: where several relaxation settings share a budget, the one
                # with the highest tau stands for it (exact families have one setting)
                line = line.sort_values(["draft_nodes", "tau_incl_bonus"]).groupby("draft_nodes").tail(1)
                ax.plot(line["draft_nodes"], line[col], color=color(name), marker=marker(drafting),
                        linestyle=LINESTYLES[drafting], label=f"{label(name)}, {drafting}")
            if col == "speedup":
                ax.axhline(1.0, color=color("vanilla"), linewidth=0.8, linestyle=":", label="AR (1×)")
            ax.set_xscale("log", base=2)
            ticks = budget_ticks(sorted(part["draft_nodes"].unique()))
            ax.set_xticks(list(ticks))
            ax.set_xticklabels(list(ticks.values()))
            ax.set_xlabel("node budget: drafts verified per target forward")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{mode}: {title}")
    # every panel's lines: the speed-up panel (which adds AR's 1x line) may be drawn as absent
    fig.legend(*legend_entries(axes[0]), loc="outside right center")
    fig.suptitle("Static vs dynamic draft trees at matched node budgets")
    return fig
