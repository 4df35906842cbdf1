"""Class accuracy with enough images to see a few points' loss: each point decodes --images images through
`lantern sample` (the sweep's own job: same seeds, labels and batches of 8), then the world's classifier reads them.

    python benchmarks/class_power.py [--world models/toy/default] [--drafter D.pt] [--images 1024] [--jobs 2]
        [--points '{"name": "lantern", "drafting": "chain", "gamma": 4, "delta": 0.1, "k": 3}' ...]
        [--out class_power]

The default run's 128 images per point give class accuracy a binomial SE of about 0.03, so its noise band (2 SE of
a difference) is about 0.09 wide; a smaller loss passes unseen. Here every point is compared with plain AR over the
same images: the difference, its SE and z unpaired (two binomials) and paired (image i of every point has the same
seed and label, so the hits pair up; the paired z is the sharper one where early tokens agree). Prints one line per
point and writes them to OUT/class_power.csv. Points whose images are already in OUT are not decoded again (their
folders are named by the sweep's point names); plain AR is always a point. Default points: plain AR, the exact
chain (gamma 2) and LANTERN at the default run's delta 0.1 with k 3 and 5.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd

VANILLA = {"name": "vanilla"}
DEFAULT_POINTS = [
    {"name": "exact", "drafting": "chain", "gamma": 2},
    {"name": "lantern", "drafting": "chain", "gamma": 4, "delta": 0.1, "k": 3},
    {"name": "lantern", "drafting": "chain", "gamma": 4, "delta": 0.1, "k": 5},
]
SAMPLING = {"cfg_scale": 2.0}  # the default sweep's
NEIGHBOURS_K = 200  # the sweep's table (config neighbours.k)


def difference(hits, reference) -> dict:
    """A point's hits (0/1 per image) against plain AR's on the same images: accuracy, its binomial SE, the
    difference, its SE and z unpaired (independent binomials: the tables' test, relative.quality_z, on hits) and
    paired (the per-image differences' mean over their SEM; 0 where they never differ)."""
    from lantern.metrics.classifier import accuracy_se

    hits, reference = hits.float(), reference.float()
    if hits.shape != reference.shape:
        raise ValueError(f"{len(hits)} hits against {len(reference)} reference hits: score the same images")
    (acc, se), (_, se_ref) = accuracy_se(hits), accuracy_se(reference)
    diff = float(hits.mean() - reference.mean())
    se_diff = math.sqrt(se**2 + se_ref**2)
    d = hits - reference
    sem = float(d.std() / math.sqrt(len(d))) if len(d) > 1 else math.nan
    return {"class_accuracy": acc, "class_accuracy_se": se, "diff": diff, "diff_se": se_diff,
            "z": diff / se_diff if se_diff > 0 else 0.0, "z_paired": diff / sem if sem > 0 else 0.0}


def spec_of(text: str) -> dict:
    """A --points value: a method spec as JSON, checked by the registry (lantern.engine.methods.normalize)."""
    from lantern.engine.methods import normalize
    from lantern.errors import UserError

    try:
        return normalize(json.loads(text), "--points")
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON ({e.msg}); give e.g. "
                                         '\'{"name": "lantern", "delta": 0.05, "k": 10}\'') from None
    except UserError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def drafter_of(a) -> str:
    return a.drafter or str(Path(a.world) / "drafter.pt")


def reusable(spec: dict, folder: Path, a) -> bool:
    """Whether a point's images are in OUT already; images of another count or drafter stop the script."""
    if not (folder / "stats.csv").is_file():
        return False
    made = json.loads((folder / "manifest.json").read_text())
    drafter = drafter_of(a)
    theirs = f"{made.get('end')} images" + (f" from drafter {made.get('drafter')}" if spec["name"] != "vanilla" else "")
    ours = f"{a.images} images" + (f" from drafter {drafter}" if spec["name"] != "vanilla" else "")
    if theirs != ours:
        raise SystemExit(f"class_power: {folder} holds {theirs}, not {ours}; give another --out")
    return True


def decode(spec: dict, folder: Path, a, neighbours: Path) -> None:
    """`lantern sample` for one point."""
    world = Path(a.world)
    cmd = [sys.executable, "-m", "lantern", "sample", "--target", str(world / "target.pt"), "--vq",
           str(world / "vq.pt"), "--method", json.dumps({**spec, "seed": 0}), "--sampling", json.dumps(SAMPLING),
           "--mode", "sampling", "--seed", "0", "--start", "0", "--end", str(a.images), "--out", str(folder),
           "--device", "cpu", "--batch-size", "8", "--latency-images", "0", "--threads", "1"]
    if spec["name"] != "vanilla":
        cmd += ["--drafter", drafter_of(a), "--neighbours", str(neighbours)]
    log = folder.parent / f"{folder.name}.log"  # not with_suffix: point names hold dots (d0.05)
    with open(log, "w") as f:
        if subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode:
            raise SystemExit(f"class_power: `lantern sample` failed for {folder.name}; see {log}")


def score(folder: Path, net):
    """(hits [N], tau) of one point's images."""
    from lantern.metrics.classifier import labels_for, predict, read_labels
    from lantern.metrics.images import ImageSet

    images = ImageSet.from_folders([folder / "images"], "generated")
    hits = predict(net, images).eq(labels_for(images, read_labels([folder / "stats.csv"])))
    stats = pd.read_csv(folder / "stats.csv")
    return hits, stats.n_tokens.sum() / stats.target_forwards.sum()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", default="models/toy/default", help="folder with target.pt, drafter.pt, vq.pt, "
                    "classifier.pt")
    ap.add_argument("--drafter", help="another drafter checkpoint for the speculative points")
    ap.add_argument("--images", type=int, default=1024, help="images per point (a multiple of 8)")
    ap.add_argument("--points", nargs="+", type=spec_of, metavar="JSON",
                    help="method specs as `lantern sample --method` takes them (default: the module docstring's); "
                         "plain AR is added")
    ap.add_argument("--jobs", type=int, default=2, help="`lantern sample` jobs at a time (one thread each)")
    ap.add_argument("--out", default="class_power")
    a = ap.parse_args(argv)
    if a.images < 16 or a.images % 8:
        ap.error(f"--images {a.images}: give a multiple of 8, at least 16")
    world = Path(a.world)
    missing = [str(p) for p in (world / "target.pt", world / "vq.pt", world / "classifier.pt",
                                Path(drafter_of(a))) if not p.is_file()]
    if missing:
        ap.error(f"missing {', '.join(missing)}: run `make run` (or give --world / --drafter)")

    import torch

    from lantern.engine.methods import normalize, point_name
    from lantern.engine.rules.neighbours import NeighbourParams, build_table, read_codebook
    from lantern.io import atomic_path, save_torch
    from lantern.metrics.classifier import load_classifier

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    neighbours = out / f"l2_K{NEIGHBOURS_K}.pt"
    if not neighbours.is_file():
        save_torch(build_table(read_codebook(world / "vq.pt"), NeighbourParams(k=NEIGHBOURS_K)), neighbours)
    specs = a.points or [normalize(s) for s in DEFAULT_POINTS]
    points = {point_name(s): s for s in [VANILLA] + [s for s in specs if s["name"] != "vanilla"]}
    todo = [name for name, spec in points.items() if not reusable(spec, out / name, a)]  # before any decoding
    with ThreadPoolExecutor(a.jobs) as pool:  # each job a process with one torch thread
        list(pool.map(lambda name: decode(points[name], out / name, a, neighbours), todo))
    torch.set_num_threads(1)
    net = load_classifier(world / "classifier.pt")
    scored = {name: score(out / name, net) for name in points}
    rows = []
    for name, (hits, tau) in scored.items():
        r = {"point": name, "images": len(hits), "tau": tau, **difference(hits, scored["vanilla"][0])}
        rows.append(r)
        print(f"{name:<32} {r['images']} images  tau {tau:.2f}  class accuracy {r['class_accuracy']:.3f} ± "
              f"{r['class_accuracy_se']:.3f}  vs plain AR {r['diff']:+.3f} ± {r['diff_se']:.3f}  z {r['z']:+.1f}  "
              f"paired z {r['z_paired']:+.1f}", flush=True)
    with atomic_path(out / "class_power.csv") as tmp:
        pd.DataFrame(rows).to_csv(tmp, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
