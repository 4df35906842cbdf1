"""Where in the image drafts are accepted: share of accepted drafts per token position on the token grid."""

from __future__ import annotations

import math
from dataclasses import dataclass

import matplotlib.pyplot as plt

from lantern.errors import UserError
from lantern.figures.common import modes, pick, read_sweep, read_table, short_label


@dataclass
class Params:
    points: list[str] | None = None  # default: every exact SD point plus the weakest/strongest relaxation per family


def plot(inputs, p: Params):
    sweep = read_sweep(inputs.tables)
    pos = read_table(inputs.tables, "positions.csv", ["mode", "point", "position", "n_tokens", "accepted_fraction"])
    rows = modes(sweep[sweep["name"] != "vanilla"], inputs.mode) if (sweep["name"] != "vanilla").any() else []
    if not rows:
        raise UserError("acceptance_map: the sweep has only vanilla points; add speculative methods")
    chosen = {mode: pick(sweep, p.points, mode, with_vanilla=False) for mode in rows}
    ncols = max(len(c) for c in chosen.values())
    n = int(pos["n_tokens"].iloc[0])
    side = math.isqrt(n)
    if side * side != n:
        raise UserError(f"acceptance_map: {n} tokens per image is not a square token grid")
    fig, axes = plt.subplots(len(rows), ncols, figsize=(2.5 * ncols + 1.4, 3.0 * len(rows) + 0.4), squeeze=False,
                             layout="constrained")
    for r, mode in enumerate(rows):
        for c in range(ncols):
            ax = axes[r, c]
            if c >= len(chosen[mode]):
                ax.axis("off")
                continue
            row = chosen[mode].iloc[c]
            frac = pos[(pos["mode"] == mode) & (pos["point"] == row["point"])].sort_values("position")
            grid = frac["accepted_fraction"].to_numpy().reshape(side, side)
            im = ax.imshow(grid, vmin=0, vmax=1, cmap="magma")
            ax.set_title(f"{short_label(row)}\nmean {grid.mean():.2f}", fontsize=8.5, fontweight="normal")
            ax.set_xticks([0, side - 1])
            ax.set_yticks([0, side - 1])
            ax.set_xlabel("token column" if r == len(rows) - 1 else "")
            ax.set_ylabel(f"{mode}\ntoken row" if c == 0 else "", fontweight="bold" if c == 0 else "normal")
            ax.grid(False)
    fig.colorbar(im, ax=axes, shrink=0.8, label="share of tokens that were accepted drafts")
    fig.suptitle("Where drafts are accepted (token grid in raster order; token 0 always comes from the target)")
    return fig
