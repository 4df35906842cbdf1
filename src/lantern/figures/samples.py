"""Sample grids: one row per method, one column per image index (the same per-image seed in every row)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from PIL import Image

from lantern.errors import UserError
from lantern.io import read_csv
from lantern.figures.common import modes, pick, read_sweep, short_label
from lantern.metrics.shards import verify_shard


@dataclass
class Params:
    indices: list[int] | None = None  # image indices (default: the first `columns` images every point has)
    columns: int = 8
    points: list[str] | None = None  # default: AR, control, exact SD, weakest/strongest relaxation per family
    toy_class_names: bool = False  # title columns with the toy world's class names instead of class ids


def image_path(gen: Path, mode: str, point: str, index: int) -> Path | None:
    hits = sorted((gen / mode / point).glob(f"shard*/images/{index:06d}.png"))
    return hits[0] if hits else None


def class_labels(gen: Path, mode: str, point: str) -> dict[int, int | str]:
    """image index -> class id (c2i) or caption (t2i), from the point's stats.csv files (every point shares them)."""
    tables = []
    for f in sorted((gen / mode / point).glob("shard*/stats.csv")):
        df = read_csv(f, "stats table", "regenerate the shard with `lantern sample`")
        column = "caption" if "caption" in df.columns else "label"
        if not {"image_index", column} <= set(df.columns):
            raise UserError(f"stats table {f} lacks image_index or {column}; regenerate the shard with `lantern sample`")
        tables.append(df[["image_index", column]].set_axis(["image_index", "condition"], axis=1))
    return dict(pd.concat(tables).itertuples(index=False)) if tables else {}


def column_title(index: int, label: int | str | None, toy_names: bool) -> str:
    if label is None:
        return f"image {index}"
    if isinstance(label, str):  # a caption: its first words, wrapped to the column's width
        words = label.split()
        return f"image {index}\n" + " ".join(words[:3]) + ("\n" + " ".join(words[3:6]) if len(words) > 3 else "") + (
            " ..." if len(words) > 6 else "")
    from lantern.worlds.toy.data import CLASS_NAMES  # imported here: only the toy world has these names

    name = CLASS_NAMES[label] if toy_names and 0 <= label < len(CLASS_NAMES) else f"class {label}"
    return f"image {index}\n{name}"


def plot(inputs, p: Params):
    if inputs.gen is None:
        raise UserError("samples: pass --gen <outdir>/gen (the folder with {mode}/{point}/shard*/images)")
    sweep = read_sweep(inputs.tables, ["n_images"])
    mode = modes(sweep, inputs.mode)[0]
    chosen = pick(sweep, p.points, mode)
    indices = p.indices or list(range(min(p.columns, int(chosen["n_images"].min()))))
    shown = {f"{i:06d}.png" for i in indices}
    paths = {}
    for point in chosen["point"]:
        for shard in sorted((inputs.gen / mode / point).glob("shard*")):  # the gallery shows what its tables measured
            if shard.is_dir() and not shard.name.endswith(".partial"):
                verify_shard(shard, digests=shown)
        for i in indices:
            paths[point, i] = image_path(inputs.gen, mode, point, i)
            if paths[point, i] is None:
                raise UserError(f"samples: no image {i:06d}.png under {inputs.gen / mode / point}/shard*/images; "
                                "pick indices every point generated")
    labels = class_labels(inputs.gen, mode, chosen["point"].iloc[0])
    cell = 1.1
    fig, axes = plt.subplots(len(chosen), len(indices), squeeze=False, layout="constrained",
                             figsize=(cell * len(indices) + 2.6, cell * len(chosen) + 0.6))
    for r, (_, row) in enumerate(chosen.iterrows()):
        for c, i in enumerate(indices):
            ax = axes[r, c]
            ax.imshow(Image.open(paths[row["point"], i]).convert("RGB"))
            ax.set_xticks([])
            ax.set_yticks([])
            ax.grid(False)
            ax.spines[:].set_visible(False)
            if r == 0:
                ax.set_title(column_title(i, labels.get(i), p.toy_class_names), fontsize=8.5, fontweight="normal")
        axes[r, 0].set_ylabel(short_label(row), rotation=0, ha="right", va="center", fontsize=8.5)
    fig.suptitle(f"Samples ({mode}); columns share the per-image seed and condition (the control row uses its own seed)")
    return fig
