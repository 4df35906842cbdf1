"""benchmarks/class_power.py: its statistics (a point's class accuracy against plain AR's on the same images,
unpaired and paired) and its one-line refusals before any image is decoded."""
import math

import pytest
import torch

from conftest import benchmark_script


def test_difference_pairs_the_images():
    difference = benchmark_script("class_power").difference
    reference = torch.tensor([1, 1, 1, 1, 0, 0, 1, 1] * 8)
    same = difference(reference.clone(), reference)
    assert same["diff"] == 0 and same["z"] == 0 and same["z_paired"] == 0
    lost = reference.clone()
    lost[:8] = 0  # 6 of the 8 changed images were right: 6 hits lost out of 64
    r = difference(lost, reference)
    assert r["diff"] == pytest.approx(-6 / 64)
    p, q = reference.float().mean().item(), lost.float().mean().item()
    se_diff = math.sqrt(p * (1 - p) / 63 + q * (1 - q) / 63)
    assert r["diff_se"] == pytest.approx(se_diff) and r["z"] == pytest.approx(-6 / 64 / se_diff)
    d = (lost - reference).float()
    assert r["z_paired"] == pytest.approx(d.mean().item() / (d.std().item() / 8))
    assert r["z_paired"] < r["z"] < 0  # pairing removes the images both got right or both got wrong
    with pytest.raises(ValueError, match="score the same images"):
        difference(lost[:10], reference)


@pytest.mark.parametrize("argv, message", [
    (["--images", "12"], "--images 12: give a multiple of 8, at least 16"),
    (["--points", "{name"], "is not JSON"),
    (["--points", '{"name": "lanter"}'], "'lanter' is not a method"),
    (["--world", "nowhere"], "missing nowhere/target.pt"),
])
def test_refuses_bad_arguments_in_one_line(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        benchmark_script("class_power").main(argv + ["--out", str(tmp_path / "out")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and [line for line in err if "error" in line] == err[-1:]  # usage, then one line
    assert not (tmp_path / "out").exists()


def test_images_of_another_count_or_drafter_are_not_reused(tmp_path):
    import argparse
    import json

    reusable = benchmark_script("class_power").reusable
    folder = tmp_path / "lantern-chain-g4-d0.05-k10"
    folder.mkdir()
    spec = {"name": "lantern"}
    a = argparse.Namespace(images=64, world="w", drafter=None)
    assert not reusable(spec, folder, a)  # nothing there yet: decode it
    (folder / "stats.csv").write_text("image_index,label\n")
    (folder / "manifest.json").write_text(json.dumps({"end": 64, "drafter": "w/drafter.pt"}))
    assert reusable(spec, folder, a)
    with pytest.raises(SystemExit, match="holds 64 images from drafter w/drafter.pt, not 64 images from drafter f.pt"):
        reusable(spec, folder, argparse.Namespace(images=64, world="w", drafter="f.pt"))
    with pytest.raises(SystemExit, match="holds 64 images, not 128 images; give another --out"):
        reusable({"name": "vanilla"}, folder, argparse.Namespace(images=128, world="w", drafter=None))
