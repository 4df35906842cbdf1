"""`lantern evaluate`: one metrics row (quality + speed + protocol) for one sweep point's generated images.

Quality: FID / KID / precision-recall against a reference set (torch-fidelity) and CLIP score (open_clip) of each
image against its caption (or its class caption). Speed: the point's stats tables summarised (see speed.py).
Every row records how its numbers were made: backends and versions, extractors, weights checksums, N generated,
N reference, resolution and resize filters, prompt prefix, seed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import dataclass, field

import open_clip
import pandas as pd
import torch

from ..errors import UserError
from ..io import atomic_path, read_structured, sha256_file
from .clip import ClipScoreParams, Preprocess, class_caption, clip_scores, load_clip
from .fidelity import FidelityParams, fidelity_metrics
from .images import ImageSet
from .params import params_from
from .speed import read_stats, summarize


@dataclass
class EvaluateParams:
    fidelity: FidelityParams = field(default_factory=FidelityParams)
    clip: ClipScoreParams = field(default_factory=ClipScoreParams)


def read_captions(paths: list[str | os.PathLike]) -> dict[int, str]:
    """image_index -> caption, from CSV tables with a `caption` column, or a `label` column (class-conditional
    samples; the toy world's class names make the caption, see clip.class_caption)."""
    out: dict[int, str] = {}
    for path in paths:
        if not os.path.isfile(path):
            raise UserError(f"captions table {path} does not exist")
        df = pd.read_csv(path)
        if "image_index" not in df.columns or not {"caption", "label"} & set(df.columns):
            raise UserError(f"captions table {path} needs an image_index column and a caption or label column")
        if "caption" in df.columns:
            texts = df["caption"].astype(str)
        else:
            try:
                texts = df["label"].map(lambda v: class_caption(int(v)))
            except IndexError:
                raise UserError(f"captions table {path}: a label lies outside the toy world's classes; give a "
                                f"caption column instead") from None
        for i, text in zip(df["image_index"].astype(int), texts):
            if out.get(i, text) != text:
                raise UserError(f"image {i} has two different captions in {', '.join(map(str, paths))}")
            out[i] = text
    return out


def evaluate(images: ImageSet, reference: ImageSet, p: EvaluateParams, captions: dict[int, str] | None = None,
             stats: pd.DataFrame | None = None, verbose: bool = False) -> dict:
    row: dict = {}
    clip = None
    if p.clip.enabled:
        if captions is None:
            raise UserError("CLIP score needs captions: pass --captions (e.g. the sample's stats.csv), "
                            "or set clip.enabled: false")
        missing = [i for i in images.indices() if i not in captions]
        if missing:
            raise UserError(f"{len(missing)} generated image(s) have no caption, e.g. index {missing[0]}")
        device = "cuda" if torch.cuda.is_available() else "cpu"
        clip = load_clip(p.clip.model, p.clip.weights_path, device)  # a bad CLIP fails before the long FID pass
    row.update(fidelity_metrics(images, reference, p.fidelity, verbose=verbose))
    if clip is not None:
        net, tokenizer = clip
        texts = [captions[i] for i in images.indices()]
        scores = clip_scores(net, tokenizer, images, texts, p.clip.prompt_prefix, p.clip.batch_size)
        w, h = images.size
        row.update({
            "clip_score": float(scores.mean()),
            "clip_score_sem": float(scores.std() / math.sqrt(len(scores))) if len(scores) > 1 else math.nan,
            "clip_convention": "100 * max(cos, 0), mean over images",
            "clip_backend": f"open_clip {open_clip.__version__}",
            "clip_model": p.clip.model or f"{os.path.basename(p.clip.weights_path)} (toy CLIP, config beside it)",
            "clip_weights_sha256": sha256_file(p.clip.weights_path),
            "clip_resize": Preprocess(net).describe(h, w),
            "prompt_prefix": p.clip.prompt_prefix,
            "n_captioned": len(scores),
        })
    if stats is not None:
        row.update({f"speed_{k}" if k in ("method", "mode") else k: v for k, v in summarize(stats).items()})
    row["images"] = images.source
    return row


def write_row(row: dict, out: str) -> None:
    with atomic_path(out) as tmp:
        if out.endswith(".json"):
            tmp.write_text(json.dumps(row, indent=2, default=str) + "\n")
        else:
            pd.DataFrame([row]).to_csv(tmp, index=False)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="lantern evaluate", description=__doc__.split("\n")[0])
    ap.add_argument("--images", nargs="+", required=True, help="folder(s) of generated PNGs (shards of one point)")
    ap.add_argument("--reference", required=True, help="reference images: a folder, or a `lantern make-data` file")
    ap.add_argument("--captions", nargs="*", default=[], help="CSV(s) with image_index and caption or label "
                    "(a `lantern sample` stats.csv works)")
    ap.add_argument("--stats", nargs="*", default=[], help="`lantern sample` stats.csv file(s) for speed columns")
    ap.add_argument("--out", required=True, help="metrics row: .json or .csv")
    ap.add_argument("--params", default=None, help="EvaluateParams {fidelity: {...}, clip: {...}} as inline "
                    "JSON/YAML or a file path")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args(argv)
    if not a.out.endswith((".json", ".csv")):
        raise UserError(f"--out must end in .json or .csv, got {a.out}")
    p = params_from(read_structured(a.params), EvaluateParams)
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    images = ImageSet.from_folders(a.images, "generated images")
    reference = ImageSet.from_path(a.reference, "reference")
    captions = read_captions(a.captions) if a.captions else None
    stats = read_stats(a.stats) if a.stats else None
    row = evaluate(images, reference, p, captions, stats, verbose=a.verbose)
    write_row(row, a.out)
    shown = {k: row[k] for k in ("fid", "kid_mean", "precision", "recall", "clip_score", "tau_incl_bonus") if k in row}
    print(f"{a.out}: " + ", ".join(f"{k} {v:.4g}" for k, v in shown.items()))
