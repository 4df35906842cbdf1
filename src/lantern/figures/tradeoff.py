"""Speed-up against quality (FID, CLIP score, class accuracy) for every method, Pareto front marked, AR noise band shaded.

The speed-up is the tables' headline (in-job when the sweep timed plain AR in every job). Each point carries a
horizontal bar of ± band_z standard errors (bootstrap over its images) and, for an in-job speed-up, a vertical one
(bootstrap over its timed images: the job's own spread, not the day's); the shaded band is vanilla ± band_z·√2·SE,
where a method with vanilla's distribution lands. Points carry a number (the same in every panel) resolved in the
legend; the AR runs are stars. Class accuracy is drawn where the sweep has it (a world with a classifier: the toy
world); elsewhere its panel is left out.
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from lantern.errors import UserError
from lantern.engine.methods import label
from lantern.figures.common import draw_absent, fid_label, modes, note_dropped, read_sweep, short_label, speed_label
from lantern.figures.style import DRAFT_MARKERS, color, marker
from lantern.pipeline.relative import SE_COLUMNS

METRICS = {"fid": ("FID (lower is better)", False), "clip_score": ("CLIP score (higher is better)", True),
           "precision": ("precision (higher is better)", True), "recall": ("recall (higher is better)", True),
           "class_accuracy": ("class accuracy (higher is better)", True)}
# metrics that a world may lack (no classifier on llamagen): a sweep.csv without the column has no such panel
OPTIONAL = ("class_accuracy",)


@dataclass
class Params:
    metrics: tuple[str, ...] = ("fid", "clip_score", "class_accuracy")
    band_z: float = 2.0  # standard errors in the bars and the band (the tables' band_z)


def pareto(quality: np.ndarray, speed: np.ndarray, higher_better: bool) -> np.ndarray:
    """Indices of points no other point beats on both speed and quality, ordered by quality."""
    q = quality if higher_better else -quality
    front = [i for i in range(len(q))
             if not any(q[j] >= q[i] and speed[j] >= speed[i] and (q[j] > q[i] or speed[j] > speed[i])
                        for j in range(len(q)))]
    return np.array(sorted(front, key=lambda i: quality[i]), dtype=int)


def plot(inputs, p: Params):
    bad = [m for m in p.metrics if m not in METRICS]
    if bad:
        raise UserError(f"tradeoff: unknown metric {bad[0]!r}; choose from {', '.join(METRICS)}")
    df = read_sweep(inputs.tables, ["speedup", "speedup_kind", *[m for m in p.metrics if m not in OPTIONAL]])
    for m in OPTIONAL:
        if m not in df:
            df[m] = np.nan
    metrics = [m for m in p.metrics if df[m].notna().any()]
    if not metrics:
        raise UserError(f"tradeoff: sweep.csv has no values for {', '.join(p.metrics)}; run the metrics rules first")
    rows = modes(df, inputs.mode)
    df = df[df["mode"].isin(rows)]
    dropped = [METRICS[m][0].split(" (")[0] for m in p.metrics if m not in metrics]
    # one number per point name across modes and panels (sweep.csv is already in paper order)
    number = {pt: i + 1 for i, pt in enumerate(dict.fromkeys(df.loc[df["name"] != "vanilla", "point"]))}
    labels = {r["point"]: short_label(r) for _, r in df.iterrows()}
    fig, axes = plt.subplots(len(rows), len(metrics), figsize=(5.0 * len(metrics) + 3.4, 4.0 * len(rows)),
                             squeeze=False, layout="constrained")
    for r, mode in enumerate(rows):
        part = df[(df["mode"] == mode) & df["speedup"].notna()]
        for c, metric in enumerate(metrics):
            ax = axes[r, c]
            title, higher = METRICS[metric]
            title = fid_label(df) if metric == "fid" else title
            pts = part[part[metric].notna()].reset_index(drop=True)
            if pts.empty:  # no speed-up in this mode (no image timed against plain AR), or no value of the metric
                draw_absent(ax, "speed-up" if part.empty else title.split(" (")[0])
                ax.set_title(f"{mode}: speed-up vs {title.split(' (')[0]}")
                continue
            se = pts[SE_COLUMNS[metric]].to_numpy(float) if SE_COLUMNS.get(metric) in pts else np.full(len(pts), np.nan)
            base = (pts["point"] == "vanilla").to_numpy()
            if base.any() and np.isfinite(se[base][0]):
                v, w = pts.loc[base, metric].iloc[0], p.band_z * np.sqrt(2) * se[base][0]
                ax.axvspan(v - w, v + w, color=color("vanilla"), alpha=0.18, linewidth=0)
            ax.axhline(1.0, color=color("vanilla"), linewidth=0.8, linestyle=":")
            speed = pts["speedup"].to_numpy(float)
            quality = pts[metric].to_numpy(float)
            speed_se = pts["speedup_se"].to_numpy(float) if "speedup_se" in pts else np.full(len(pts), np.nan)
            ax.errorbar(quality, speed, xerr=p.band_z * se, yerr=p.band_z * speed_se, fmt="none", ecolor="0.6",
                        elinewidth=0.8, zorder=1)
            front = pareto(quality, speed, higher)
            ax.plot(quality[front], speed[front], color="black", linewidth=1, linestyle="--", zorder=2)
            ax.scatter(quality[front], speed[front], s=150, facecolor="none", edgecolor="black", linewidth=1, zorder=4)
            for i, row in pts.iterrows():
                vanilla = row["name"] == "vanilla"
                ax.scatter(quality[i], speed[i], color=color(row["name"]), marker=marker(row["drafting"]),
                           s=110 if vanilla else 45, edgecolor="white", linewidth=0.5, zorder=3)
                if not vanilla:
                    ax.annotate(str(number[row["point"]]), (quality[i], speed[i]), xytext=(5, 3),
                                textcoords="offset points", fontsize=7.5, zorder=5)
            ax.set_xlabel(title)
            ax.set_ylabel(speed_label(part))
            ax.set_title(f"{mode}: speed-up vs {title.split(' (')[0]}")
            ax.margins(x=0.08, y=0.08)
    note_dropped(fig, dropped)
    present = df[["name", "drafting"]].drop_duplicates()
    handles = [Line2D([], [], color=color(n), marker="*" if n == "vanilla" else "o", markersize=9 if n == "vanilla" else 6,
                      linestyle="", label=label(n)) for n in dict.fromkeys(present["name"])]
    handles += [Line2D([], [], color="grey", marker=DRAFT_MARKERS.get(d, "D"), linestyle="", label=f"{d} drafts")
                for d in dict.fromkeys(present["drafting"]) if d != "none"]
    handles += [Line2D([], [], color="black", linestyle="--", marker="o", markerfacecolor="none", markersize=9,
                       label="Pareto front"),
                Patch(color=color("vanilla"), alpha=0.18, label=f"AR noise band:\nvanilla ± {p.band_z:g}·√2·SE"),
                Line2D([], [], color="0.6", label=f"± {p.band_z:g}·SE (bootstrap;\nspeed: within the job)")]
    handles += [Line2D([], [], linestyle="", label=f"{n}: {labels[pt]}") for pt, n in number.items()]
    # a long sweep's numbered list runs in two columns, so that it fits beside the panels
    fig.legend(handles=handles, loc="outside right center", handletextpad=0.4, ncols=1 if len(handles) <= 20 else 2,
               fontsize="small" if len(handles) > 20 else None)
    return fig
