import pytest
import torch

from lantern.params import params_from
from lantern.worlds.toy.data import CLASS_NAMES, COLOUR_NAMES, DataParams, main, make_dataset
from lantern.errors import UserError

CLEAN = DataParams(background_gradient=False, texture_amplitude=0.0, noise_sigma=0.0)


def test_shapes_and_types():
    d = make_dataset(40, seed=3, params=DataParams())
    assert d["images"].shape == (40, 3, 32, 32) and d["images"].dtype == torch.uint8
    assert d["labels"].shape == (40,) and d["labels"].dtype == torch.long
    assert 0 <= d["labels"].min() and d["labels"].max() < 16
    assert len(d["captions"]) == 40 and len(CLASS_NAMES) == 16


def test_deterministic_per_seed_and_index():
    a = make_dataset(30, seed=7)
    b = make_dataset(30, seed=7)
    assert torch.equal(a["images"], b["images"]) and torch.equal(a["labels"], b["labels"])
    assert a["captions"] == b["captions"]
    c = make_dataset(30, seed=8)
    assert not torch.equal(a["images"], c["images"])


def test_slice_equals_bigger_set_across_chunks():
    # a chunk boundary inside the range must not change any image
    full = make_dataset(25, seed=1, chunk=7)
    part = make_dataset(10, seed=1, start=12, chunk=4)
    assert torch.equal(full["images"][12:22], part["images"])
    assert torch.equal(full["labels"][12:22], part["labels"])
    assert full["captions"][12:22] == part["captions"]


def test_captions_name_shape_colour_background():
    d = make_dataset(50, seed=0)
    for label, cap in zip(d["labels"].tolist(), d["captions"]):
        assert f" {CLASS_NAMES[label]} on a " in cap
        words = cap.replace("-to-", " ").split()
        assert sum(w in COLOUR_NAMES for w in words) == 3  # shape colour + two background colours
        assert cap.endswith("striped background")
    clean = make_dataset(5, seed=0, params=CLEAN)
    assert all(c.endswith("plain background") and "-to-" not in c for c in clean["captions"])


def test_clean_world_has_flat_noise_free_background():
    d = make_dataset(20, seed=2, params=CLEAN)
    noisy = make_dataset(20, seed=2)
    # same draws, so same classes; a flat background makes the most common pixel colour cover much of the image
    assert torch.equal(d["labels"], noisy["labels"])
    for img in d["images"]:
        _, counts = img.reshape(3, -1).T.unique(dim=0, return_counts=True)
        assert counts.max() >= 0.4 * 32 * 32
    for img in noisy["images"]:
        _, counts = img.reshape(3, -1).T.unique(dim=0, return_counts=True)
        assert counts.max() < 0.1 * 32 * 32


def test_class_balance():
    counts = torch.bincount(make_dataset(800, seed=0)["labels"], minlength=16)
    assert counts.min() > 20


def test_bad_params_are_user_errors():
    with pytest.raises(UserError, match="nosie_sigma"):
        params_from({"nosie_sigma": 0.1}, DataParams)
    with pytest.raises(UserError):
        DataParams(num_classes=17)
    with pytest.raises(UserError):
        DataParams(min_size=0.4, max_size=0.3)


def test_cli_writes_file(tmp_path):
    out = tmp_path / "d.pt"
    main(["--out", str(out), "--n", "12", "--seed", "5", "--start", "3", "--params", '{"noise_sigma": 0.0}'])
    d = torch.load(out)
    ref = make_dataset(12, seed=5, params=DataParams(noise_sigma=0.0), start=3)
    assert torch.equal(d["images"], ref["images"]) and d["captions"] == ref["captions"]
    assert d["params"]["noise_sigma"] == 0.0 and d["seed"] == 5 and d["start"] == 3
    assert [p.name for p in tmp_path.iterdir()] == ["d.pt"]  # no temp file left behind
    with pytest.raises(UserError, match="--n"):
        main(["--out", str(out), "--n", "0", "--seed", "5"])
