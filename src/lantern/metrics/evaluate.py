"""`lantern evaluate`: one metrics row (quality + speed + protocol) for one sweep point's generated images.

Quality: FID / KID / precision-recall against a reference set (torch-fidelity; images, or FID statistics for FID
alone), CLIP score (open_clip) of each image against its caption (or its class name) and, when enabled, HPS v2.1
(hpsv2.py) of each image against its text prompt as given. Speed: the point's stats tables summarised (see
speed.py). Every row records how its numbers were made: backends and versions, extractors and weights checksums for
FID and for precision/recall, the reference's kind, checksum and size, N generated, resolution, resize filter and
crop, CLIP and HPS models, their weights checksums and formats, caption source, prompt prefix, seed.
Class accuracy (when a classifier is configured: the toy world's): the share of images that a classifier trained on
real images (classifier.py) labels with the class they were conditioned on, with its binomial standard error.
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

from lantern.errors import UserError
from lantern.io import atomic_path, read_structured, sha256_file
from lantern.metrics.captions import Captions, read_captions
from lantern.metrics.classifier import ClassAccuracyParams, class_accuracy, labels_for, load_classifier, read_labels
from lantern.metrics.clip import ClipScoreParams, Preprocess, clip_cosines, clip_score, load_clip, weights_format
from lantern.metrics.fidelity import FidelityParams, fidelity_metrics
from lantern.metrics.hpsv2 import HPSv2Params, hps_scores, load_hpsv2
from lantern.metrics.images import ImageSet
from lantern.params import params_from
from lantern.metrics.reference import FidStatistics, load_reference
from lantern.metrics.shards import shard_of, verify_shard
from lantern.metrics.speed import read_stats, summarize


@dataclass
class EvaluateParams:
    fidelity: FidelityParams = field(default_factory=FidelityParams)
    clip: ClipScoreParams = field(default_factory=ClipScoreParams)
    classifier: ClassAccuracyParams = field(default_factory=ClassAccuracyParams)
    hpsv2: HPSv2Params = field(default_factory=HPSv2Params)


HPS_OFF = "hpsv2.enabled: false (metrics.hpsv2.enabled in a pipeline config)"


def _mean_sem(values: torch.Tensor) -> tuple[float, float]:
    sem = float(values.std() / math.sqrt(len(values))) if len(values) > 1 else math.nan
    return float(values.mean()), sem


def captions_of(images: ImageSet, captions: Captions | None, metric: str, off: str) -> list[str]:
    """Each image's caption, in the image set's order; `metric` needs them, `off` is the setting that drops it."""
    if captions is None:
        raise UserError(f"{metric} needs captions: pass --captions (e.g. the sample's stats.csv), or set {off}")
    missing = [i for i in images.indices() if i not in captions.texts]
    if missing:
        raise UserError(f"{len(missing)} generated image(s) have no caption, e.g. index {missing[0]}")
    return [captions.texts[i] for i in images.indices()]


def hps_prompts(images: ImageSet, captions: Captions | None) -> list[str]:
    """Each image's text prompt for HPS v2.1: a class-conditional image (captioned by its class name) has none."""
    texts = captions_of(images, captions, "HPS v2.1", HPS_OFF)
    labelled = [i for i in images.indices() if i in captions.labelled]
    if labelled:
        raise UserError(f"HPS v2.1 scores an image against its text prompt, but image {labelled[0]} is "
                        f"class-conditional (its stats row has a label, no caption); set {HPS_OFF}")
    return texts


def model_protocol(prefix: str, model: str, weights_path: str, net, images: ImageSet, unnamed: str) -> dict:
    """How an open_clip scorer (CLIP, HPS v2.1) was run: backend, model (`unnamed` describes one read from the
    JSON config beside its weights), weights checksum and format, resize."""
    w, h = images.size
    return {f"{prefix}_backend": f"open_clip {open_clip.__version__}",
            f"{prefix}_model": model or f"{os.path.basename(weights_path)} ({unnamed}, config beside it)",
            f"{prefix}_weights_sha256": sha256_file(weights_path),
            f"{prefix}_weights_format": weights_format(weights_path),
            f"{prefix}_resize": Preprocess(net).describe(h, w)}


def evaluate(images: ImageSet, reference: ImageSet | FidStatistics, p: EvaluateParams,
             captions: Captions | None = None, stats: pd.DataFrame | None = None, verbose: bool = False,
             labels: dict[int, int] | None = None) -> dict:
    row: dict = {}
    clip = classifier = hps = None
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if p.classifier.weights_path:  # checked before the long FID pass, like the CLIP
        if labels is None:
            raise UserError("class accuracy needs each image's label: pass --captions (the sample's stats.csv), or "
                            "leave classifier.weights_path empty")
        target = labels_for(images, labels)
        classifier = load_classifier(p.classifier.weights_path, device, "classifier.weights_path")
    if p.clip.enabled:
        texts = captions_of(images, captions, "CLIP score", "clip.enabled: false")
        clip = load_clip(p.clip.model, p.clip.weights_path, device)  # a bad CLIP fails before the long FID pass
    if p.hpsv2.enabled:
        prompts = hps_prompts(images, captions)
        hps = load_hpsv2(p.hpsv2, device)  # as the CLIP: a bad file fails before the long FID pass
    row.update(fidelity_metrics(images, reference, p.fidelity, verbose=verbose))
    if clip is not None:
        net, tokenizer = clip
        cosines = clip_cosines(net, tokenizer, images, texts, p.clip.prompt_prefix, p.clip.batch_size)
        (score, score_sem), (cosine, cosine_sem) = _mean_sem(clip_score(cosines)), _mean_sem(cosines)
        row.update({
            "clip_score": score,
            "clip_score_sem": score_sem,
            "clip_cosine": cosine,
            "clip_cosine_sem": cosine_sem,
            "clip_convention": "clip_score = 100 * max(cos, 0) (torchmetrics CLIPScore); clip_cosine = raw cos; "
                               "both mean over images",
            **model_protocol("clip", p.clip.model, p.clip.weights_path, net, images, "toy CLIP"),
            "prompt_prefix": p.clip.prompt_prefix,
            "caption_source": captions.source,
            "n_captioned": len(cosines),
        })
    if hps is not None:
        scores = hps_scores(*hps, images, prompts, p.hpsv2.batch_size)
        mean, sem = _mean_sem(scores)
        row.update({"hpsv2": mean, "hpsv2_sem": sem,
                    "hpsv2_convention": "HPS v2.1 = cos(normalised image, prompt features), the prompt as given (no "
                                        "prefix), mean over images; hpsv2_sem = its per-image SEM",
                    **model_protocol("hpsv2", p.hpsv2.model, p.hpsv2.weights_path, hps[0], images, "open_clip"),
                    "hpsv2_prompt_source": captions.source})
    if classifier is not None:
        row.update(class_accuracy(classifier, images, target, p.classifier.batch_size))
        row.update({"classifier_weights_sha256": sha256_file(p.classifier.weights_path),
                    "class_accuracy_convention": "share of images classified as their conditioning label; SE = "
                                                 "sqrt(p (1 - p) / (n - 1)) (binomial, = SEM of the hits)"})
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
    ap.add_argument("--reference", required=True, help="reference: an image folder (subfolders included), a "
                    "`lantern make-data` file, or an .npz of FID statistics (mu, sigma; then FID only)")
    ap.add_argument("--captions", nargs="*", default=[], help="CSV(s) with image_index and caption and/or label "
                    "(a `lantern sample` stats.csv works; labels are named by clip.class_names, and are the classes "
                    "class accuracy checks)")
    ap.add_argument("--stats", nargs="*", default=[], help="`lantern sample` stats.csv file(s) for speed columns")
    ap.add_argument("--out", required=True, help="metrics row: .json or .csv")
    ap.add_argument("--params", default=None, help="EvaluateParams {fidelity: {...}, clip: {...}, classifier: {...}, "
                    "hpsv2: {...}} as "
                    "inline JSON/YAML or a file path")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args(argv)
    if not a.out.endswith((".json", ".csv")):
        raise UserError(f"--out must end in .json or .csv, got {a.out}")
    p = params_from(read_structured(a.params), EvaluateParams)
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    for folder in a.images:  # a shard that lost or changed an image would give a row on fewer images, silently
        if (shard := shard_of(folder)) is not None:
            verify_shard(shard)
    images = ImageSet.from_folders(a.images, "generated images")
    reference = load_reference(a.reference)
    captions = read_captions(a.captions, p.clip.class_names) if a.captions else None
    stats = read_stats(a.stats) if a.stats else None
    labels = read_labels(a.captions) if a.captions and p.classifier.weights_path else None
    row = evaluate(images, reference, p, captions, stats, verbose=a.verbose, labels=labels)
    write_row(row, a.out)
    shown = {k: row[k] for k in ("fid", "kid_mean", "precision", "recall", "clip_score", "clip_cosine", "hpsv2",
                                 "class_accuracy", "tau_incl_bonus") if row.get(k) is not None}
    print(f"{a.out}: " + ", ".join(f"{k} {v:.4g}" for k, v in shown.items()))
