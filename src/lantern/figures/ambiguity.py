"""Token selection ambiguity: distribution of the target's top-1 probability and entropy per decoding step,
default vs clean toy world, per CFG scale, from `lantern ambiguity --steps-out` files.

Those files hold one world each: name it on the command line, `--ambiguity default=A.csv clean=B.csv`
(a file that has a `world` column can be given bare)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from lantern.errors import UserError
from lantern.io import read_csv

COLUMNS = ["world", "cfg_scale", "source", "top1", "entropy"]
LABELLED = re.compile(r"^(\w[\w-]*)=(.+)$")
WORLD_COLORS = {"default": "#D55E00", "clean": "#0072B2"}
LINESTYLES = ["-", "--", ":", "-."]
SOURCES = {"samples": "on its own samples", "heldout": "teacher-forced on held-out images"}


@dataclass
class Params:
    sources: list[str] | None = None  # default: every source in the dump, own samples first
    threshold: float = 0.2  # top-1 probability marked as 'ambiguous below'
    bins: int = 40


def read_steps(entries: list[str]) -> pd.DataFrame:
    if not entries:
        raise UserError("ambiguity: pass --ambiguity WORLD=FILE ... (the `lantern ambiguity --steps-out` CSVs)")
    frames = []
    for entry in entries:
        match = LABELLED.match(str(entry))
        world, path = (match.group(1), Path(match.group(2))) if match else (None, Path(entry))
        if not path.is_file():
            raise UserError(f"ambiguity: {path} does not exist; run the ambiguity rule first")
        frames.append(read_csv(path, "ambiguity:", "rerun the ambiguity rule"))
        if world is not None:
            frames[-1]["world"] = world
        missing = [c for c in COLUMNS if c not in frames[-1].columns]
        if missing:
            raise UserError(f"ambiguity: {path} lacks column(s) {', '.join(missing)}; expected {', '.join(COLUMNS)}"
                            + ("; name its world as --ambiguity WORLD=FILE" if missing == ["world"] else ""))
    return pd.concat(frames, ignore_index=True)


def plot(inputs, p: Params):
    steps = read_steps(inputs.ambiguity)
    found = list(dict.fromkeys(steps["source"]))
    sources = p.sources or sorted(found, key=lambda s: (s != "samples", s))
    unknown = [s for s in sources if s not in found]
    if unknown:
        raise UserError(f"ambiguity: source {unknown[0]!r} is not in the dump (found: {', '.join(found)})")
    fig, axes = plt.subplots(len(sources), 2, figsize=(11, 3.8 * len(sources)), squeeze=False, layout="constrained")
    cfgs = sorted(steps["cfg_scale"].unique())
    worlds = sorted(steps["world"].unique(), key=lambda w: (w != "default", w))
    top_bins = np.linspace(0, 1, p.bins + 1)
    ent_bins = np.linspace(0, steps["entropy"].max() * 1.02, p.bins + 1)
    for r, source in enumerate(sources):
        for world in worlds:
            for i, cfg in enumerate(cfgs):
                part = steps[(steps["source"] == source) & (steps["world"] == world) & (steps["cfg_scale"] == cfg)]
                if part.empty:
                    continue
                style = dict(histtype="step", density=True, linewidth=1.8, color=WORLD_COLORS.get(world, "#555555"),
                             linestyle=LINESTYLES[i % len(LINESTYLES)])
                low = (part["top1"] < p.threshold).mean()
                axes[r, 0].hist(part["top1"], bins=top_bins, **style,
                                label=f"{world}, CFG {cfg:g}: mean {part['top1'].mean():.2f}, "
                                      f"{100 * low:.0f}% < {p.threshold:g}")
                axes[r, 1].hist(part["entropy"], bins=ent_bins, **style,
                                label=f"{world}, CFG {cfg:g}: mean {part['entropy'].mean():.2f} nats")
        axes[r, 0].axvline(p.threshold, color="black", linewidth=0.8, linestyle=":")
        axes[r, 0].set_xlabel("top-1 probability of the target's next-token distribution")
        axes[r, 1].set_xlabel("entropy of the next-token distribution (nats)")
        for ax, what, unit in zip(axes[r], ("top-1 probability", "entropy"), ("probability", "nat")):
            ax.set_ylabel(f"density of steps (per {unit})")
            ax.set_title(f"{what}, {SOURCES.get(source, source)}")
            ax.set_ylim(0, ax.get_ylim()[1] * 1.4)  # headroom, so the legend never covers a histogram
            ax.legend(loc="upper right")
    fig.suptitle("Token selection ambiguity of the target (per decoding step)")
    return fig
