"""`lantern evaluate`: one metrics row with quality, speed and the protocol, from `lantern sample`-shaped outputs."""

import json

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from lantern.worlds.toy.data import make_dataset
from lantern.errors import UserError
from lantern.metrics import evaluate, train_clip

PROTOCOL = ("fid_backend", "fid_extractor", "fid_feature_layer", "fid_weights_sha256", "fid_input_resize",
            "prc_extractor", "prc_feature_layer", "prc_weights_sha256", "n_generated", "n_reference", "reference",
            "reference_kind", "reference_sha256", "resolution", "resize_filter", "crop", "fidelity_seed",
            "fidelity_skipped", "clip_backend", "clip_model", "clip_weights_sha256", "clip_weights_format",
            "prompt_prefix", "clip_resize", "clip_convention", "caption_source")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Two shards of a fake sample output (images/ + stats.csv), a make-data reference file, an untrained toy CLIP
    (the row's plumbing is under test here; what a trained one measures is in test_metrics_clip.py)."""
    root = tmp_path_factory.mktemp("eval")
    data = make_dataset(48, seed=3)
    for shard, (lo, hi) in enumerate([(0, 12), (12, 24)]):
        (root / f"s{shard}" / "images").mkdir(parents=True)
        for i in range(lo, hi):
            Image.fromarray(data["images"][i].permute(1, 2, 0).numpy()).save(root / f"s{shard}/images/{i:06d}.png")
        pd.DataFrame({"image_index": range(lo, hi), "label": data["labels"][lo:hi].tolist(), "method": "vanilla",
                      "mode": "sampling", "n_tokens": 64, "target_forwards": 64, "time_total_s": 0.25,
                      "peak_mem_bytes": float("nan")}).to_csv(root / f"s{shard}/stats.csv", index=False)
    torch.save(make_dataset(24, seed=3, start=1000), root / "ref.pt")
    p = train_clip.TrainClipParams(patch_size=8, vision_layers=1, text_layers=1)
    cfg = train_clip.model_config(p, 32)
    net, _ = train_clip.build(cfg, "evalclip")
    train_clip.save(net, cfg, root / "evalclip.pt")
    params = {"fidelity": {"extractor": "toyclip", "weights_path": str(root / "evalclip.pt"), "kid_subset_size": 10},
              "clip": {"model": "", "weights_path": str(root / "evalclip.pt")}}
    return root, params


def run(root, params, out, **extra):
    argv = ["--images", str(root / "s0/images"), str(root / "s1/images"), "--reference", str(root / "ref.pt"),
            "--captions", str(root / "s0/stats.csv"), str(root / "s1/stats.csv"),
            "--stats", str(root / "s0/stats.csv"), str(root / "s1/stats.csv"),
            "--out", str(out), "--params", json.dumps(params)]
    evaluate.main(argv)


def test_row_carries_quality_speed_and_protocol(world, tmp_path):
    root, params = world
    run(root, params, tmp_path / "m.json")
    row = json.loads((tmp_path / "m.json").read_text())
    for key in PROTOCOL + ("fid", "kid_mean", "precision", "recall", "clip_score", "clip_cosine", "tau_incl_bonus",
                           "latency_s_per_image"):
        assert key in row, key
    assert (row["n_generated"], row["n_reference"], row["n_captioned"]) == (24, 24, 24)
    assert row["prompt_prefix"] == "A photo depicts " and row["resolution"] == "32x32"
    assert (row["resize_filter"], row["crop"], row["reference_kind"]) == ("none", "none", "make-data file")
    assert row["tau_incl_bonus"] == 1.0 and row["latency_s_per_image"] == 0.25
    assert 0 <= row["clip_score"] <= 100 and -1 <= row["clip_cosine"] <= 1
    assert row["clip_score"] >= 100 * row["clip_cosine"] - 1e-4  # clamping negatives can only raise the mean
    assert row["caption_source"] == "labels -> toy-world class names" and row["clip_weights_format"] == "state dict"
    run(root, params, tmp_path / "m.csv")
    csv_row = pd.read_csv(tmp_path / "m.csv").iloc[0]
    assert csv_row["fid"] == pytest.approx(row["fid"]) and csv_row["clip_model"] == row["clip_model"]


def test_bad_inputs_fail_before_work(world, tmp_path):
    root, params = world
    bad = json.loads(json.dumps(params))
    bad["clip"]["weights_path"] = str(tmp_path / "missing.pt")
    with pytest.raises(UserError, match="CLIP weights not found"):
        run(root, bad, tmp_path / "m.json")
    with pytest.raises(UserError, match="unknown key fidelity.extractr"):
        run(root, {"fidelity": {"extractr": "x"}}, tmp_path / "m.json")
    with pytest.raises(UserError, match="fidelity.kid_subsets = 'many' must be of type int"):
        run(root, {"fidelity": {"kid_subsets": "many"}}, tmp_path / "m.json")
    (tmp_path / "names.txt").write_text("w\nx\ny\nz\n")
    with pytest.raises(UserError, match="label .* has no name among the 4 class names file"):
        run(root, {**params, "clip": {**params["clip"], "class_names": str(tmp_path / "names.txt")}},
            tmp_path / "m.json")
    np.savez(tmp_path / "stats.npz", mu=np.zeros(8), sigma=np.eye(8))
    no_clip = json.dumps({**params, "clip": {"enabled": False}})
    with pytest.raises(UserError, match="precomputed FID statistics.*set fidelity.extractor: inception-v3-compat"):
        evaluate.main(["--images", str(root / "s0/images"), "--reference", str(tmp_path / "stats.npz"),
                       "--out", str(tmp_path / "m.json"), "--params", no_clip])
    with pytest.raises(UserError, match="--out must end in .json or .csv"):
        run(root, params, tmp_path / "m.txt")
    few = pd.read_csv(root / "s0/stats.csv").head(3)
    few.to_csv(tmp_path / "few.csv", index=False)
    with pytest.raises(UserError, match="have no caption"):
        evaluate.main(["--images", str(root / "s0/images"), "--reference", str(root / "ref.pt"),
                       "--captions", str(tmp_path / "few.csv"), "--out", str(tmp_path / "m.json"),
                       "--params", json.dumps(params)])
    assert not (tmp_path / "m.json").exists()
