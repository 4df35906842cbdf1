"""benchmarks/image_agreement.py: the same images give difference 0 and agreement 1, changed ones are counted,
only shared indices are compared, and a missing point fails in one line naming the points there."""
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import benchmark_script


def write(gen: Path, point: str, images: dict[int, np.ndarray], shard: int = 0) -> None:
    folder = gen / point / f"shard{shard}" / "images"
    folder.mkdir(parents=True, exist_ok=True)
    for i, pixels in images.items():
        Image.fromarray(pixels).save(folder / f"{i:06d}.png")


def test_agreement_counts_identical_and_changed_images(tmp_path, capsys):
    rng = np.random.default_rng(0)
    base = {i: rng.integers(0, 256, (8, 8, 3), dtype=np.uint8) for i in range(4)}
    changed = dict(base)
    changed[3] = 255 - base[3]
    write(tmp_path, "a", {i: base[i] for i in range(2)})
    write(tmp_path, "a", {i: base[i] for i in range(2, 4)}, shard=1)  # a point's shards are one set of indices
    write(tmp_path, "b", changed)
    write(tmp_path, "c", {**base, 9: base[0]})  # index 9 exists in c alone: not compared
    mod = benchmark_script("image_agreement")
    diff, same, n = mod.agreement(mod.images_of(tmp_path, "a"), mod.images_of(tmp_path, "b"), 2.0)
    want = np.abs(base[3].astype(np.float32) - changed[3].astype(np.float32)).mean() / 4
    assert n == 4 and same == 0.75 and diff == pytest.approx(want)
    assert mod.main(["a", "c", "--gen", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "a vs c: mean |difference| 0.00 of 255, the same image 1.00 of 4\n"


def test_missing_point_and_disjoint_indices_fail_clearly(tmp_path):
    rng = np.random.default_rng(1)
    write(tmp_path, "a", {0: rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)})
    write(tmp_path, "b", {1: rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)})
    mod = benchmark_script("image_agreement")
    with pytest.raises(SystemExit, match="no point 'z' under .*; points there: a, b"):
        mod.main(["a", "z", "--gen", str(tmp_path)])
    with pytest.raises(SystemExit, match="share no image index"):
        mod.main(["a", "b", "--gen", str(tmp_path)])
