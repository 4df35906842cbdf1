"""delta x k heatmaps of tau, speed-up and FID (one row per decoding mode and draft shape)."""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np

from lantern.errors import UserError
from lantern.figures.common import fid_label, modes, note_dropped, read_sweep, with_shape

LABELS = {"tau_incl_bonus": ("τ (bonus counted)", "viridis"), "speedup": ("speed-up over AR (×, headline)", "viridis"),
          "speedup_vs_vanilla": ("speed-up over AR (×, across jobs)", "viridis"),
          "fid": ("FID (lower is better)", "magma_r"), "clip_score": ("CLIP score", "magma"),
          "precision": ("precision", "magma"), "recall": ("recall", "magma")}
AXES = {"delta": "δ (TV budget)", "lam": "λ (relative bound)", "k": "k (neighbours)"}


@dataclass
class Params:
    method: str = "lantern"
    x: str = "delta"
    y: str = "k"
    values: tuple[str, ...] = ("tau_incl_bonus", "speedup", "fid")


def plot(inputs, p: Params):
    for key in (p.x, p.y):
        if key not in AXES:
            raise UserError(f"heatmap: axis {key!r} must be one of {', '.join(AXES)}")
    bad = [v for v in p.values if v not in LABELS]
    if bad:
        raise UserError(f"heatmap: unknown value {bad[0]!r}; choose from {', '.join(LABELS)}")
    df = read_sweep(inputs.tables, list(p.values))
    grid = with_shape(df[(df["name"] == p.method) & df[p.x].notna() & df[p.y].notna()])
    if grid.empty:
        raise UserError(f"heatmap: the sweep has no {p.method} points with both {p.x} and {p.y}")
    values = [v for v in p.values if grid[v].notna().any()]
    panels = [(mode, shape) for mode in modes(grid, inputs.mode)
              for shape in dict.fromkeys(grid[grid["mode"] == mode]["shape"])]
    xs, ys = np.sort(grid[p.x].unique()), np.sort(grid[p.y].unique())
    fig, axes = plt.subplots(len(panels), len(values), squeeze=False, layout="constrained",
                             figsize=(max(3.2, 0.75 * len(xs) + 2.2) * len(values), (0.45 * len(ys) + 1.6) * len(panels)))
    for r, (mode, shape) in enumerate(panels):
        part = grid[(grid["mode"] == mode) & (grid["shape"] == shape)]
        for c, value in enumerate(values):
            ax = axes[r, c]
            table = part.pivot_table(index=p.y, columns=p.x, values=value).reindex(index=ys, columns=xs)
            label, cmap = LABELS[value]
            label = fid_label(grid, short=True) if value == "fid" else label
            im = ax.imshow(table.to_numpy(float), cmap=cmap, aspect="auto", origin="lower")
            mid = np.nanmean([np.nanmin(table.to_numpy(float)), np.nanmax(table.to_numpy(float))])
            for (i, j), v in np.ndenumerate(table.to_numpy(float)):
                if np.isfinite(v):
                    dark = (v > mid) == cmap.endswith("_r")  # white text on the dark end of the colour map
                    ax.text(j, i, f"{v:.3g}", ha="center", va="center", fontsize=8, color="white" if dark else "black")
            ax.set_xticks(range(len(xs)), [f"{x:g}" for x in xs])
            ax.set_yticks(range(len(ys)), [f"{y:g}" for y in ys])
            ax.set_xlabel(AXES[p.x])
            ax.set_ylabel(AXES[p.y])
            ax.grid(False)
            ax.set_title(f"{mode}, {shape}: {label.split(' (')[0]}", fontsize=9.5)
            fig.colorbar(im, ax=ax, label=label, shrink=0.9)
    note_dropped(fig, [LABELS[v][0].split(" (")[0] for v in p.values if v not in values])
    return fig
