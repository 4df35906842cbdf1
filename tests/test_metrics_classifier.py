"""Class accuracy: a classifier trained here on real toy images scores 1 on images with their true labels, about
chance on shuffled labels, and travels through `lantern evaluate` into the metrics row; bad inputs are one line."""

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from PIL import Image

from lantern.errors import UserError
from lantern.metrics import evaluate, train_classifier
from lantern.metrics.classifier import ToyClassifier, accuracy_se, class_accuracy, load_classifier, save_classifier
from lantern.worlds.toy.data import DataParams, make_dataset

CLEAN = DataParams(background_gradient=False, texture_amplitude=0.0, noise_sigma=0.0)
N = 64
# the FD pass of `lantern evaluate` always runs: on the shipped toy CLIP's features, no bootstrap (fast)
FIDELITY = {"extractor": "toyclip", "weights_path": str(Path(__file__).parents[1] / "models/toy/default/clip.pt"),
            "bootstrap": 0, "kid_subset_size": 10}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny classifier trained (until it fits them) on 64 real images of the clean toy world, saved and reloaded;
    the images, as PNGs and a stats.csv with their labels, are one shard of a fake sample output."""
    root = tmp_path_factory.mktemp("classifier")
    data = make_dataset(N, seed=5, params=CLEAN)
    torch.manual_seed(0)
    net = ToyClassifier(16, width=8)
    p = train_classifier.ClassifierParams(width=8, steps=120, batch_size=64, lr=1e-2, warmup_steps=10, eval_every=120)
    train_classifier.train(net, data["images"], data["labels"], p, progress=False)
    save_classifier(net, root / "classifier.pt")
    (root / "s0" / "images").mkdir(parents=True)
    for i in range(N):
        Image.fromarray(data["images"][i].permute(1, 2, 0).numpy()).save(root / f"s0/images/{i:06d}.png")
    pd.DataFrame({"image_index": range(N), "label": data["labels"].tolist()}).to_csv(root / "s0/stats.csv",
                                                                                    index=False)
    torch.save(make_dataset(16, seed=5, start=1000, params=CLEAN), root / "ref.pt")
    return root, data, load_classifier(root / "classifier.pt")


def test_known_labels_give_accuracy_one(trained):
    _, data, net = trained
    row = class_accuracy(net, data["images"], data["labels"])
    assert row["class_accuracy"] == 1.0 and row["class_accuracy_se"] == 0.0
    assert row["class_accuracy_chance"] == 1 / 16


def test_shuffled_labels_give_about_chance(trained):
    """Against randomly permuted labels the expected accuracy is sum_c (share of class c)^2 (~1/16). The 64 images
    are scored 20 times over, each copy against its own seeded permutation: the SD of the mean is ~0.007, and the
    tolerance 0.05 is > 7 SD (seeded, so the test is also deterministic)."""
    _, data, net = trained
    labels, copies = data["labels"], 20
    expected = float(((torch.bincount(labels, minlength=16) / N) ** 2).sum())
    g = torch.Generator().manual_seed(0)
    shuffled = torch.cat([labels[torch.randperm(N, generator=g)] for _ in range(copies)])
    row = class_accuracy(net, data["images"].repeat(copies, 1, 1, 1), shuffled)
    assert abs(row["class_accuracy"] - expected) < 0.05 and expected < 0.12
    assert row["class_accuracy_se"] == pytest.approx((row["class_accuracy"] * (1 - row["class_accuracy"])
                                                      / (N * copies - 1)) ** 0.5)


def test_binomial_standard_error():
    p, se = accuracy_se(torch.tensor([1, 1, 1, 0]))
    assert p == 0.75 and se == pytest.approx((0.75 * 0.25 / 3) ** 0.5)
    # the same number as the per-image SEM of the hits (the CLIP score's convention)
    hits = torch.tensor([1.0, 1, 1, 0])
    assert se == pytest.approx(float(hits.std() / 2))


def test_evaluate_row_carries_class_accuracy(trained, tmp_path):
    root, _, _ = trained
    params = {"fidelity": FIDELITY, "clip": {"enabled": False},
              "classifier": {"weights_path": str(root / "classifier.pt")}}
    evaluate.main(["--images", str(root / "s0/images"), "--reference", str(root / "ref.pt"), "--captions",
                   str(root / "s0/stats.csv"), "--out", str(tmp_path / "m.json"), "--params", json.dumps(params)])
    row = json.loads((tmp_path / "m.json").read_text())
    assert row["class_accuracy"] == 1.0 and row["class_accuracy_se"] == 0.0
    assert len(row["classifier_weights_sha256"]) == 64
    # no classifier configured (the llamagen world): no class-accuracy columns, no error
    evaluate.main(["--images", str(root / "s0/images"), "--reference", str(root / "ref.pt"), "--captions",
                   str(root / "s0/stats.csv"), "--out", str(tmp_path / "n.json"),
                   "--params", json.dumps({**params, "classifier": {}})])
    assert "class_accuracy" not in json.loads((tmp_path / "n.json").read_text())


def test_bad_inputs_are_one_line(trained, tmp_path):
    root, _, _ = trained

    def run(weights, captions=True):
        params = {"fidelity": FIDELITY, "clip": {"enabled": False}, "classifier": {"weights_path": weights}}
        evaluate.main(["--images", str(root / "s0/images"), "--reference", str(root / "ref.pt"),
                       *(["--captions", str(root / "s0/stats.csv")] if captions else []),
                       "--out", str(tmp_path / "m.json"), "--params", json.dumps(params)])

    with pytest.raises(UserError, match=r"classifier.weights_path checkpoint .*missing.pt does not exist; make it "
                                        r"with `lantern train-classifier`"):
        run(str(tmp_path / "missing.pt"))
    torch.save({"model": {"tok_embeddings.weight": torch.zeros(2, 2)}}, tmp_path / "gpt.pt")
    with pytest.raises(UserError, match="is not a `lantern train-classifier` checkpoint") as e:
        run(str(tmp_path / "gpt.pt"))
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="class accuracy needs each image's label"):
        run(str(root / "classifier.pt"), captions=False)
    pd.DataFrame({"image_index": [0], "caption": ["a circle"]}).to_csv(tmp_path / "nolabel.csv", index=False)
    with pytest.raises(UserError, match="needs image_index and label columns"):
        evaluate.main(["--images", str(root / "s0/images"), "--reference", str(root / "ref.pt"), "--captions",
                       str(tmp_path / "nolabel.csv"), "--out", str(tmp_path / "m.json"), "--params",
                       json.dumps({"fidelity": FIDELITY, "clip": {"enabled": False},
                                   "classifier": {"weights_path": str(root / "classifier.pt")}})])
    assert not (tmp_path / "m.json").exists()


def test_train_classifier_cli(tmp_path, capsys):
    """The subcommand writes <out>.pt and <out>.json (config, params, held-out accuracy, history); a bad --out or
    a tiny --data is one line."""
    torch.save(make_dataset(40, seed=1, params=CLEAN), tmp_path / "train.pt")
    torch.save(make_dataset(16, seed=1, start=100, params=CLEAN), tmp_path / "val.pt")
    args = ["--data", str(tmp_path / "train.pt"), "--val", str(tmp_path / "val.pt"), "--params",
            json.dumps({"width": 4, "steps": 4, "batch_size": 8, "eval_every": 2, "threads": 1})]
    train_classifier.main([*args, "--out", str(tmp_path / "c.pt")])
    record = json.loads((tmp_path / "c.json").read_text())
    assert record["kind"] == "classifier" and record["config"]["num_classes"] == 16
    assert [h["step"] for h in record["metrics"]["history"]] == [2, 4]
    assert 0 <= record["metrics"]["val_accuracy"] <= 1 and record["metrics"]["val_accuracy_recon"] is None
    assert "held-out accuracy" in capsys.readouterr().out
    assert load_classifier(tmp_path / "c.pt").config["width"] == 4
    with pytest.raises(UserError, match="--out must end in .pt"):
        train_classifier.main([*args, "--out", str(tmp_path / "c.bin")])
    with pytest.raises(UserError, match="need >= batch_size"):
        train_classifier.main([*args[:4], "--params", '{"batch_size": 64}', "--out", str(tmp_path / "d.pt")])
