"""Static vs dynamic tree: distribution of the accepted depth per verification step.

Needs sweep points with drafting static or dynamic; schedule the rule only when the config has some.
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np

from lantern.errors import UserError
from lantern.figures.common import modes, read_sweep, read_table, short_label

TREE_COLORS = {"static": plt.get_cmap("Blues"), "dynamic": plt.get_cmap("Oranges")}


@dataclass
class Params:
    points: list[str] | None = None  # default: every tree point


def plot(inputs, p: Params):
    sweep = read_sweep(inputs.tables)
    depths = read_table(inputs.tables, "depths.csv", ["mode", "point", "drafting", "depth", "fraction"])
    trees = depths[depths["drafting"].isin(["static", "dynamic"])]
    if p.points:
        trees = trees[trees["point"].isin(p.points)]
    if trees.empty:
        raise UserError("tree_depth: no tree methods in this sweep (drafting: static or dynamic); "
                        "add some to sweep.methods or do not schedule this figure")
    rows = modes(trees, inputs.mode)
    fig, axes = plt.subplots(1, len(rows), figsize=(6.2 * len(rows), 4.2), squeeze=False, layout="constrained")
    labels = {(r["mode"], r["point"]): short_label(r) for _, r in sweep.iterrows()}
    for ax, mode in zip(axes[0], rows):
        part = trees[trees["mode"] == mode]
        points = list(dict.fromkeys(part.sort_values("drafting", key=lambda d: d != "static")["point"]))
        width = 0.8 / len(points)
        shade = {d: iter(np.linspace(0.85, 0.45, max(sum(part.drop_duplicates("point")["drafting"] == d), 1)))
                 for d in TREE_COLORS}
        for i, point in enumerate(points):
            hist = part[part["point"] == point].sort_values("depth")
            drafting = hist["drafting"].iloc[0]
            mean = float((hist["depth"] * hist["fraction"]).sum())
            ax.bar(hist["depth"] + (i - (len(points) - 1) / 2) * width, hist["fraction"], width=width,
                   color=TREE_COLORS[drafting](next(shade[drafting])), edgecolor="white", linewidth=0.4,
                   label=f"{labels.get((mode, point), point)}  (mean {mean:.2f})")
        ax.set_ylim(0, part["fraction"].max() * 1.1 + 0.05 * len(points))  # room for the legend
        ax.set_xticks(sorted(part["depth"].unique()))
        ax.set_xlabel("accepted depth per verification step (drafted tokens)")
        ax.set_ylabel("share of verification steps")
        ax.set_title(f"{mode}: accepted tree depth, static vs dynamic")
        ax.legend(loc="upper right")
    return fig
