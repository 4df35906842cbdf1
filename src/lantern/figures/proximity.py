"""Latent proximity (LANTERN Fig. 3): how far the decodes move when a fraction of the tokens is replaced by their
m-th nearest codebook neighbour, against random codes, from `lantern proximity` CSVs (one row of panels per world:
feature FD with its noise band, mean feature cosine, pixel PSNR, and the image strip when given).

`--proximity A.csv B.csv` (each names its world in a column) and `--strip WORLD=A_strip.png ...`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from PIL import Image

from lantern.errors import UserError
from lantern.io import read_csv
from lantern.metrics.proximity import RANDOM

COLUMNS = ["world", "fraction", "m", "fd", "fd_noise_halves", "feature_cosine", "psnr", "extractor", "strip_fraction"]
LABELLED = re.compile(r"^(\w[\w-]*)=(.+)$")
# ranks on an ordered map, nearest darkest to farthest lightest: a fixed colour list wrapped (m = 1 and m = 200
# shared one colour); viridis stops short of its yellow end, which is faint on white
RANK_MAP, RANK_SPAN = "viridis", 0.9
FEATURES = {"toyclip": "toy-CLIP features", "clip": "CLIP features", "inception-v3-compat": "Inception-v3 features"}


@dataclass
class Params:
    log_fd: bool = True  # FD on a log axis (nearest neighbours and random codes differ by orders of magnitude)


def read_tables(paths: list[str]) -> pd.DataFrame:
    if not paths:
        raise UserError("proximity: pass --proximity FILE ... (the `lantern proximity` CSVs)")
    frames = []
    for path in map(Path, paths):
        if not path.is_file():
            raise UserError(f"proximity: {path} does not exist; run the proximity rule first")
        df = read_csv(path, "proximity:", "rerun `lantern proximity`", dtype={"m": str})
        missing = [c for c in COLUMNS if c not in df.columns]
        if missing or df.empty:
            raise UserError(f"proximity: {path} lacks column(s) {', '.join(missing) or 'rows'}; is it a "
                            "`lantern proximity` CSV?")
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def read_strips(entries: list[str]) -> dict[str, np.ndarray]:
    strips = {}
    for entry in entries:
        match = LABELLED.match(entry)
        if not match:
            raise UserError(f"proximity: --strip {entry} must be WORLD=PNG (the world as in the CSV's world column)")
        path = Path(match.group(2))
        if not path.is_file():
            raise UserError(f"proximity: strip {path} does not exist; run the proximity rule first")
        with Image.open(path) as im:
            strips[match.group(1)] = np.asarray(im.convert("RGB"))
    return strips


def _ordered(ranks: list[str]) -> list[str]:
    return sorted((m for m in ranks if m != RANDOM), key=int)


def rank_label(m: str, ranks: list[str] = ()) -> str:
    """The legend's name of rank m; with the world's ranks, the farthest measured one says so."""
    if m == RANDOM:
        return "random code (control)"
    if m == "0":
        return "m = 0 (the token itself)"
    ordered = _ordered(ranks)
    if m == "1" or (ordered and m == ordered[0]):
        return f"m = {m} (nearest)"
    return f"m = {m} (farthest)" if len(ordered) > 1 and m == ordered[-1] else f"m = {m}"


def _style(m: str, ranks: list[str]) -> dict:
    if m == RANDOM:
        return dict(color="#555555", linestyle="--", marker="x")
    ordered = _ordered(ranks)
    at = ordered.index(m) / max(len(ordered) - 1, 1)
    # the two ends also differ in marker, so nearest and farthest read apart in grey print too
    mark = "v" if at == 0 and len(ordered) > 1 else "^" if at == 1 else "o"
    return dict(color=plt.get_cmap(RANK_MAP)(RANK_SPAN * at), marker=mark)


def _strip(ax, image: np.ndarray, ranks: list[str], fraction: float) -> None:
    """ranks in the CSV's order: the strip's rows follow the config's ranks, as the CSV's rows do."""
    ax.imshow(image, interpolation="nearest")
    rows = 1 + len(ranks)
    step = (image.shape[0] - 2) / rows  # make_grid: a 2-pixel border around every image
    ax.set_yticks([2 + r * step + (step - 2) / 2 for r in range(rows)],
                  ["original"] + [rank_label(m, ranks) for m in ranks])
    ax.set_xticks([])
    ax.grid(False)
    ax.set_title(f"decodes, {fraction:.0%} of the tokens replaced")


def plot(inputs, p: Params):
    df = read_tables(inputs.proximity)
    strips = read_strips(inputs.strips)
    worlds = list(dict.fromkeys(df["world"]))
    unknown = sorted(set(strips) - set(worlds))
    if unknown:
        raise UserError(f"proximity: --strip names world {unknown[0]!r}, not in the CSVs (found: {', '.join(worlds)})")
    cols = 4 if strips else 3
    fig, axes = plt.subplots(len(worlds), cols, figsize=(5.2 * cols, 4.2 * len(worlds)), squeeze=False,
                             layout="constrained", width_ratios=[1, 1, 1, 1.5][:cols])
    for r, world in enumerate(worlds):
        part = df[df["world"] == world]
        # nearest first, the random control last: the legend reads in the colour map's order
        found = list(dict.fromkeys(part["m"]))
        ranks = _ordered(found) + [m for m in found if m == RANDOM]
        noise = float(part["fd_noise_halves"].iloc[0])
        ax_fd, ax_cos, ax_psnr = axes[r, :3]
        for m in ranks:
            line = part[part["m"] == m].sort_values("fraction")
            style = dict(label=rank_label(m, ranks), **_style(m, ranks))
            # fraction 0 is the null check, 0 up to float rounding: off a log axis
            fd = line[line["fraction"] > 0] if p.log_fd else line
            ax_fd.plot(fd["fraction"], fd["fd"], **style)
            ax_cos.plot(line["fraction"], line["feature_cosine"], **style)
            finite = line[np.isfinite(line["psnr"])]  # identical decodes have infinite PSNR
            ax_psnr.plot(finite["fraction"], finite["psnr"], **style)
        low = 0.0
        if p.log_fd:
            ax_fd.set_yscale("log")
            positive = part.loc[(part["fraction"] > 0) & (part["fd"] > 0), "fd"]
            low = min([noise, *positive]) / 3
            ax_fd.set_ylim(low, max([noise, *positive]) * 3)
        ax_fd.axhspan(low, noise, color="#999999", alpha=0.2, linewidth=0,
                      label=f"noise: FD of two random halves\nof the originals ({noise:.3g})")
        n, extractor = int(part["n_images"].iloc[0]), str(part["extractor"].iloc[0])
        ax_fd.set_ylabel(f"FD to the original decodes ({FEATURES.get(extractor, extractor)})")
        ax_cos.set_ylabel("mean feature cosine to the original")
        ax_psnr.set_ylabel("PSNR to the original decode (dB)")
        for ax, what in zip((ax_fd, ax_cos, ax_psnr), ("Frechet distance", "feature cosine", "pixel PSNR")):
            ax.set_xlabel("fraction of tokens replaced")
            ax.set_title(f"{world}: {what} ({n} images)")
        ax_cos.legend(*ax_fd.get_legend_handles_labels(), loc="lower left")  # the cosine panel has room
        if strips:
            if world in strips:
                _strip(axes[r, 3], strips[world], found, float(part["strip_fraction"].iloc[0]))
            else:
                axes[r, 3].set_axis_off()
    fig.suptitle("Latent proximity: tokens replaced by their m-th nearest codebook neighbour vs random codes")
    return fig
