"""Mean accepted length tau and speed-up against the relaxation strength (delta, or lambda), one line per k."""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np

from lantern.errors import UserError
from lantern.figures.common import draw_absent, legend_entries, modes, read_sweep, speed_label, with_shape
from lantern.figures.style import color

SYMBOLS = {"delta": "δ (TV budget)", "lam": "λ (relative bound)"}
LINESTYLES = ["-", "--", ":", "-."]
EXACT_STYLES = {"chain": (0, (5, 2)), "static": (0, (1, 1.5)), "dynamic": (0, (6, 2, 1, 2))}


@dataclass
class Params:
    method: str = "lantern"  # lantern (x = delta) or lanternpp (x = lam)
    x: str = "delta"


def plot(inputs, p: Params):
    if p.x not in SYMBOLS:
        raise UserError(f"tau_vs_delta: x must be one of {', '.join(SYMBOLS)}, got {p.x!r}")
    df = read_sweep(inputs.tables, ["tau_incl_bonus", "speedup", "speedup_kind"])
    grid = with_shape(df[(df["name"] == p.method) & df[p.x].notna()])
    if grid.empty:
        raise UserError(f"tau_vs_delta: the sweep has no {p.method} points with {p.x}; add them to sweep.methods")
    rows = modes(grid, inputs.mode)
    fig, axes = plt.subplots(len(rows), 2, figsize=(11.5, 3.6 * len(rows)), squeeze=False, layout="constrained")
    ks = sorted(grid["k"].dropna().unique())
    cmap = plt.get_cmap("viridis")
    k_color = {k: cmap(i / max(len(ks) - 1, 1) * 0.9) for i, k in enumerate(ks)}
    for r, mode in enumerate(rows):
        part = grid[grid["mode"] == mode]
        exact = df[(df["mode"] == mode) & (df["name"] == "exact")]
        shapes = list(dict.fromkeys(part["shape"]))
        for c, (col, ylabel) in enumerate((("tau_incl_bonus", "τ: tokens per target forward\n(bonus counted)"),
                                           ("speedup", speed_label(df)))):
            ax = axes[r, c]
            if part[col].isna().all():  # no speed-up in a run that timed no image against plain AR
                draw_absent(ax, "speed-up" if col == "speedup" else "τ")
                ax.set_title(f"{mode}: {'speed-up' if col == 'speedup' else 'τ'}")
                continue
            for s, shape in enumerate(shapes):
                members = part[part["shape"] == shape]
                for k, line in members.groupby("k"):
                    line = line.sort_values(p.x)
                    label = f"k={int(k)}" + (f", {shape}" if len(shapes) > 1 else "")
                    ax.plot(line[p.x], line[col], marker="o", color=k_color[k],
                            linestyle=LINESTYLES[s % len(LINESTYLES)], label=label)
            for _, row in exact.iterrows():  # exact SD = the delta -> 0 end of every line
                ax.axhline(row[col], color=color("exact"), linewidth=1.2, linestyle=EXACT_STYLES.get(row["drafting"], ":"),
                           label=f"exact SD ({row['drafting']})")
            if col == "speedup":
                ax.axhline(1.0, color=color("vanilla"), linewidth=1, label="AR (1×)")
            ax.set_xlabel(SYMBOLS[p.x])
            ax.set_ylabel(ylabel)
            ax.set_title(f"{mode}: {ylabel.splitlines()[0].split(':')[0]}")
            xs = np.sort(part[p.x].unique())
            ax.set_xticks(xs)
            ax.set_xticklabels([f"{x:g}" for x in xs])
    fig.legend(*legend_entries(axes[0]), loc="outside right center")
    fig.suptitle(f"{'LANTERN' if p.method == 'lantern' else p.method}: acceptance and speed vs relaxation")
    return fig
