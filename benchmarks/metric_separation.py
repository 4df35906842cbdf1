"""Do the toy world's metrics separate what they should? Real images, an undertrained target's samples, and the
sweep's vanilla / vanilla-control / aggressive-LANTERN points, scored by one protocol against one reference.

    python benchmarks/metric_separation.py [--config config/config.yaml] [--n 200] [--steps 40]
        [--points vanilla vanilla-control exact-chain-g2 lantern-chain-g4-d0.1-k10] [--work results/separation]

Needs a finished default run (`make run`: the reference val.pt and the sweep's metrics). It makes N fresh real
images (indices far from the training and validation splits), trains a target of the default size for only
`--steps` steps on the world's training images, samples N images from it with the sweep's sampling settings,
and scores both with `lantern evaluate` and the sweep's own evaluation parameters (toy-CLIP features for
FID/KID/precision-recall, toy CLIP score against class captions, as for generated images; one extra row scores
the real images against their full captions); the sweep points' rows are read from results/metrics/<mode>/.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import yaml

from lantern.pipeline.config import data_params, evaluate_params, target_params, validate_config
from lantern.worlds.toy.data import load_data
from lantern.errors import UserError
from lantern.io import atomic_path
from lantern.pipeline.sample import save_png

COLUMNS = ["set", "n_generated", "fid", "kid_mean", "precision", "recall", "clip_score", "clip_score_sem"]
FAR = 10_000_000  # first index of the fresh real images: no overlap with the training or validation splits


def lantern(*args: str) -> None:
    cmd = [sys.executable, "-m", "lantern", *map(str, args)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{r.stderr[-2000:]}")


def dump_pngs(data_file: Path, folder: Path) -> tuple[Path, Path]:
    """A make-data file as PNGs plus two captions tables, as `lantern evaluate` reads them: labels.csv (class
    captions, the protocol of generated images) and captions.csv (the full captions: shape, colour, background)."""
    data = load_data(data_file)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    start = int(data.get("start", 0))
    for i, image in enumerate(data["images"]):
        save_png(image.permute(1, 2, 0).numpy(), folder / "images" / f"{start + i:06d}.png")
    indices = range(start, start + len(data["captions"]))
    captions, labels = folder / "captions.csv", folder / "labels.csv"
    with atomic_path(captions) as tmp:
        pd.DataFrame({"image_index": indices, "caption": data["captions"]}).to_csv(tmp, index=False)
    with atomic_path(labels) as tmp:
        pd.DataFrame({"image_index": indices, "label": data["labels"].tolist()}).to_csv(tmp, index=False)
    return labels, captions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="config/config.yaml")
    ap.add_argument("--n", type=int, default=200, help="images per set (the sweep uses sweep.n_images)")
    ap.add_argument("--steps", type=int, default=40, help="training steps of the undertrained target")
    ap.add_argument("--train-images", type=int, default=4000)
    ap.add_argument("--points", nargs="+",
                    default=["vanilla", "vanilla-control", "exact-chain-g2", "lantern-chain-g4-d0.1-k10"])
    ap.add_argument("--mode", default="sampling")
    ap.add_argument("--work", default="results/separation")
    ap.add_argument("--out", default="results/tables/metric_separation.csv")
    a = ap.parse_args()
    cfg = validate_config(yaml.safe_load(Path(a.config).read_text()))
    if cfg["world"] != "toy":
        raise UserError("metric_separation.py runs on the toy world (world: toy)")
    out, models = Path(cfg["outdir"]), Path("models/toy/default")
    reference, clip = out / "toy/default/data/val.pt", models / "clip.pt"
    if not reference.is_file():
        raise UserError(f"{reference} does not exist: run the default pipeline first (make run)")
    point_metrics = {point: out / "metrics" / a.mode / f"{point}.json" for point in a.points}
    for point, path in point_metrics.items():  # before the training and sampling below, not after
        if not path.is_file():
            raise UserError(f"{path} does not exist: is {point} a point of this sweep, and has it run?")
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    world_params, seed = json.dumps(data_params(cfg)), cfg["seed"]
    params = json.dumps(evaluate_params(cfg, str(clip)))  # the sweep's own protocol

    # Real images the models never saw.
    lantern("make-data", "--out", work / "real.pt", "--n", a.n, "--seed", seed, "--start", FAR, "--params", world_params)
    real_labels, real_captions = dump_pngs(work / "real.pt", work / "real")
    lantern("evaluate", "--images", work / "real/images", "--reference", reference, "--captions", real_labels,
            "--out", work / "real.json", "--params", params)
    lantern("evaluate", "--images", work / "real/images", "--reference", reference, "--captions", real_captions,
            "--out", work / "real_full_captions.json", "--params", params)

    # An undertrained target of the default size, on the world's own training images.
    lantern("make-data", "--out", work / "train.pt", "--n", a.train_images, "--seed", seed, "--params", world_params)
    lantern("tokenize", "--data", work / "train.pt", "--vq", models / "vq.pt", "--out", work / "train_tokens.pt")
    lantern("tokenize", "--data", reference, "--vq", models / "vq.pt", "--out", work / "val_tokens.pt")
    target = work / f"target_{a.steps}steps.pt"
    lantern("train-gpt", "--tokens", work / "train_tokens.pt", "--val", work / "val_tokens.pt", "--out", target,
            "--params", json.dumps({**target_params(cfg), "steps": a.steps, "eval_every": a.steps,
                                    "warmup_steps": min(10, a.steps)}))
    lantern("sample", "--target", target, "--vq", models / "vq.pt", "--mode", a.mode, "--seed", seed, "--end", a.n,
            "--sampling", json.dumps(cfg["sampling"]), "--out", work / "undertrained", "--threads", 1)
    lantern("evaluate", "--images", work / "undertrained/images", "--reference", reference,
            "--captions", work / "undertrained/stats.csv", "--out", work / "undertrained.json", "--params", params)

    rows = [{"set": "real (held out)", **json.loads((work / "real.json").read_text())},
            {"set": "real, full captions (CLIP score only)", **json.loads((work / "real_full_captions.json").read_text())},
            {"set": f"undertrained target ({a.steps} steps)", **json.loads((work / "undertrained.json").read_text())}]
    for point, path in point_metrics.items():
        rows.append({"set": f"{a.mode}/{point}", **json.loads(path.read_text())})
    table = pd.DataFrame(rows)[COLUMNS + ["fid_extractor", "n_reference"]]
    with atomic_path(a.out) as tmp:
        table.to_csv(tmp, index=False)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(f"-> {a.out}")


if __name__ == "__main__":
    try:
        main()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
