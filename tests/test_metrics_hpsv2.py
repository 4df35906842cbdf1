"""HPS v2.1 on a tiny random OpenCLIP (config and weights written by tests/tiny_openclip.py, nothing downloaded): the
score is the cosine of the normalised image and text features, computed by hand here from the model's raw towers;
HPS's training checkpoint layout loads; a missing weights file is one line naming hpsv2.weights_path; `lantern
evaluate` scores each image against its own prompt and records the mean, its SEM and the model's provenance, and
refuses a class-conditional shard in one line."""

import json
import math

import numpy as np
import open_clip
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from lantern.errors import UserError
from lantern.io import sha256_file
from lantern.metrics import evaluate
from lantern.metrics.hpsv2 import HPSv2Params, check_hpsv2, hps_scores, load_hpsv2
from lantern.metrics.images import ImageSet
from tiny_openclip import write_tiny_openclip

PROMPTS = ["a red cat", "a blue dog on a skateboard", "a hawk-man with a red head", "starry sky over a lake",
           "a zebra", "two apples and a pear", "an astronaut riding a horse"]


@pytest.fixture(scope="module")
def tiny_hps(tmp_path_factory):
    weights, net = write_tiny_openclip(tmp_path_factory.mktemp("hps"))
    return weights.parent, net


def test_score_is_the_cosine_of_normalised_features(tiny_hps):
    folder, ref = tiny_hps
    net, tok = load_hpsv2(HPSv2Params(enabled=True, model="tiny-hps", weights_path=str(folder / "tiny-hps.pt")))
    torch.manual_seed(1)
    images = torch.randint(0, 256, (5, 3, 32, 32), dtype=torch.uint8)  # at the model's size: no resize
    prompts = ["a red cat", "a blue dog", "a hawk-man with a red head", "starry sky", "a zebra"]
    scores = hps_scores(net, tok, images, prompts, batch_size=2)
    mean, std = torch.tensor([0.48145466, 0.4578275, 0.40821073]), torch.tensor([0.26862954, 0.26130258, 0.27577711])
    with torch.no_grad():
        img = ref.encode_image((images.float() / 255 - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1))
        txt = ref.encode_text(open_clip.get_tokenizer("tiny-hps")(prompts))
    expected = (F.normalize(img, dim=-1) * F.normalize(txt, dim=-1)).sum(-1)
    assert scores.shape == (5,) and torch.allclose(scores, expected, atol=1e-5)
    assert scores.abs().max() <= 1 and scores.std() > 0  # a cosine, not times logit_scale, and prompt-dependent
    # the prompt goes in as given (no CLIP-score prefix): a prefix changes the score
    prefixed = hps_scores(net, tok, images, ["A photo depicts " + p for p in prompts])
    assert not torch.allclose(prefixed, scores)


def test_missing_weights_is_one_line(tmp_path):
    with pytest.raises(UserError, match=r"HPS v2.1 weights not found at .*none\.pt.*hpsv2\.weights_path") as e:
        check_hpsv2(HPSv2Params(enabled=True, weights_path=str(tmp_path / "none.pt")))
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="hpsv2.weights_path is empty"):
        load_hpsv2(HPSv2Params())
    check_hpsv2(HPSv2Params(enabled=False))  # disabled: nothing is needed
    (tmp_path / "lonely.pt").write_bytes(b"")
    with pytest.raises(UserError, match=r"hpsv2\.model is empty, so the open_clip config .*lonely\.json must lie"):
        load_hpsv2(HPSv2Params(enabled=True, model="", weights_path=str(tmp_path / "lonely.pt")))
    with pytest.raises(UserError, match="batch_size"):
        HPSv2Params(batch_size=0)


@pytest.fixture(scope="module")
def shards(tmp_path_factory, tiny_hps):
    """Two shards of a t2i sample's output (images 40 px, so the scorer resizes; stats.csv with each prompt), a
    reference folder, and evaluate params that score FD with the same tiny OpenCLIP and skip the CLIP score."""
    root = tmp_path_factory.mktemp("hps_eval")
    rng = np.random.default_rng(0)
    for shard, (lo, hi) in enumerate([(0, 4), (4, 7)]):
        (root / f"s{shard}" / "images").mkdir(parents=True)
        for i in range(lo, hi):
            Image.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(root / f"s{shard}/images/{i:06d}.png")
        pd.DataFrame({"image_index": range(lo, hi), "prompt_id": range(lo, hi), "caption": PROMPTS[lo:hi]}).to_csv(
            root / f"s{shard}/stats.csv", index=False)
    (root / "ref").mkdir()
    for i in range(6):
        Image.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(root / f"ref/{i}.png")
    weights = str(tiny_hps[0] / "tiny-hps.pt")
    params = {"fidelity": {"extractor": "toyclip", "weights_path": weights, "kid_subset_size": 4, "bootstrap": 0},
              "clip": {"enabled": False}, "hpsv2": {"enabled": True, "model": "", "weights_path": weights,
                                                    "batch_size": 3}}
    return root, params


def evaluate_row(root, params, out, captions=("s0/stats.csv", "s1/stats.csv")):
    evaluate.main(["--images", str(root / "s0/images"), str(root / "s1/images"), "--reference", str(root / "ref"),
                   "--captions", *[str(root / c) for c in captions], "--out", str(out), "--params", json.dumps(params)])
    return json.loads(out.read_text())


def test_evaluate_scores_each_image_against_its_own_prompt(shards, tmp_path):
    root, params = shards
    row = evaluate_row(root, params, tmp_path / "m.json")
    net, tok = load_hpsv2(HPSv2Params(**params["hpsv2"]))
    images = ImageSet.from_folders([root / "s0/images", root / "s1/images"], "generated images")
    direct = hps_scores(net, tok, images, [PROMPTS[i] for i in images.indices()])
    assert row["hpsv2"] == pytest.approx(float(direct.mean()), abs=1e-6)
    assert row["hpsv2_sem"] == pytest.approx(float(direct.std()) / math.sqrt(7), abs=1e-6)
    # image i paired with another image's prompt scores otherwise: the row's pairing is image index -> its prompt
    shifted = hps_scores(net, tok, images, [PROMPTS[(i + 1) % 7] for i in images.indices()])
    assert abs(float(shifted.mean()) - row["hpsv2"]) > 1e-4
    weights = params["hpsv2"]["weights_path"]
    assert row["hpsv2_weights_sha256"] == sha256_file(weights) and row["hpsv2_weights_format"] == "state dict"
    assert row["hpsv2_model"] == "tiny-hps.pt (open_clip, config beside it)"
    assert row["hpsv2_resize"].startswith("bicubic") and row["hpsv2_prompt_source"] == "stats caption column"
    assert "no prefix" in row["hpsv2_convention"] and "clip_score" not in row and row["n_generated"] == 7


def test_a_class_conditional_shard_is_one_line_naming_the_switch(shards, tmp_path):
    root, params = shards
    labelled = pd.read_csv(root / "s1/stats.csv").drop(columns="caption").assign(label=[0, 1, 2])
    labelled.to_csv(tmp_path / "labels.csv", index=False)
    with pytest.raises(UserError) as e:
        evaluate_row(root, params, tmp_path / "m.json", captions=("s0/stats.csv", str(tmp_path / "labels.csv")))
    assert "image 4 is class-conditional" in str(e.value) and "metrics.hpsv2.enabled" in str(e.value)
    assert "\n" not in str(e.value) and not (tmp_path / "m.json").exists()
    with pytest.raises(UserError, match="HPS v2.1 needs captions.*hpsv2.enabled: false"):
        evaluate.main(["--images", str(root / "s0/images"), "--reference", str(root / "ref"),
                       "--out", str(tmp_path / "m.json"), "--params", json.dumps(params)])
    missing = json.loads(json.dumps(params))
    missing["hpsv2"]["weights_path"] = str(tmp_path / "HPS_v2.1_compressed.pt")
    with pytest.raises(UserError, match="HPS v2.1 weights not found at .*HPS_v2.1_compressed.pt"):
        evaluate_row(root, missing, tmp_path / "m.json")
