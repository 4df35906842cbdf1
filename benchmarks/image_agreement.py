"""How often do two sweep points draw the same image? Points share every image's seed and condition, so a relaxation
that leaves a sample alone leaves its pixels alone.

    python benchmarks/image_agreement.py POINT_A POINT_B [POINT_C ...] [--gen results/gen/sampling]
        [--same-below 2.0]

For every pair of the named points, over the image indices both hold (every shard): the mean absolute pixel
difference (0-255, RGB) and the fraction of images whose mean difference is under --same-below, which counts as the
same image (PNG is lossless; decoders differ only through their tokens). On the toy default run (issue #31)
LANTERN at k 10 draws the same image at delta 0.1 and 0.4 for most indices, while k 5 against k 10 changes
nearly all of them: k, not delta, moves its samples.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import numpy as np
from PIL import Image

from lantern.errors import UserError


def images_of(gen: Path, point: str) -> dict[str, Path]:
    folder = gen / point
    if not folder.is_dir():
        known = ", ".join(sorted(p.name for p in gen.iterdir() if p.is_dir())) if gen.is_dir() else "none"
        raise UserError(f"no point {point!r} under {gen}; points there: {known}")
    return {p.name: p for p in sorted(folder.glob("shard*/images/*.png"))}


def agreement(a: dict[str, Path], b: dict[str, Path], same_below: float) -> tuple[float, float, int]:
    """(mean absolute difference, fraction of images under same_below, images compared) over shared indices."""
    shared = sorted(set(a) & set(b))
    if not shared:
        raise UserError("the two points share no image index; were they sampled with the same n_images?")
    diffs = []
    for name in shared:
        x, y = (np.asarray(Image.open(p[name]).convert("RGB"), dtype=np.float32) for p in (a, b))
        if x.shape != y.shape:
            raise UserError(f"image {name} differs in size between the points ({x.shape} vs {y.shape})")
        diffs.append(float(np.abs(x - y).mean()))
    diffs = np.array(diffs)
    return float(diffs.mean()), float((diffs < same_below).mean()), len(shared)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("points", nargs="+", help="sweep points (folders under --gen)")
    ap.add_argument("--gen", default="results/gen/sampling", help="a mode's generation folder")
    ap.add_argument("--same-below", type=float, default=2.0, help="mean |difference| under which images are the same")
    a = ap.parse_args(argv)
    if len(a.points) < 2:
        ap.error("name at least two points")
    try:
        images = {p: images_of(Path(a.gen), p) for p in a.points}
        for p, q in itertools.combinations(a.points, 2):
            diff, same, n = agreement(images[p], images[q], a.same_below)
            print(f"{p} vs {q}: mean |difference| {diff:.2f} of 255, the same image {same:.2f} of {n}")
    except UserError as e:
        raise SystemExit(f"image_agreement: {e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
