"""The toy world's training CLIs at smoke size: make-data -> train-vq -> tokenize -> train-gpt -> ambiguity."""

import json
import math

import pandas as pd
import pytest
import torch

from lantern.worlds.toy import tokenize
from lantern.metrics import ambiguity
from lantern.worlds.toy import data, train_gpt, train_vq
from lantern.engine.models.checkpoint import read_checkpoint
from lantern.worlds.llamagen.upstream import load_gpt, load_vq
from lantern.errors import UserError
from lantern.worlds.toy.train_vq import cosine_lr

VQ_SMOKE = '{"steps": 4, "batch_size": 8, "ch": 16, "z_channels": 32, "codebook_size": 64, "restart_every": 2, "eval_batch": 64}'
GPT_SMOKE = '{"dim": 32, "n_layer": 2, "n_head": 2, "steps": 6, "batch_size": 8, "eval_every": 3, "warmup_steps": 2}'


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("toy")
    data.main(["--out", str(d / "train.pt"), "--n", "96", "--seed", "0"])
    data.main(["--out", str(d / "val.pt"), "--n", "32", "--seed", "0", "--start", "96"])
    train_vq.main(["--data", str(d / "train.pt"), "--val", str(d / "val.pt"), "--out", str(d / "vq.pt"),
                   "--params", VQ_SMOKE, "--threads", "1"])
    for split in ("train", "val"):
        tokenize.main(["--data", str(d / f"{split}.pt"), "--vq", str(d / "vq.pt"), "--out", str(d / f"tok_{split}.pt")])
    train_gpt.main(["--tokens", str(d / "tok_train.pt"), "--val", str(d / "tok_val.pt"), "--out", str(d / "gpt.pt"),
                    "--params", GPT_SMOKE, "--threads", "1"])
    return d


def test_train_vq_outputs(world):
    ckpt = read_checkpoint(world / "vq.pt")
    assert set(ckpt) == {"model", "args"} and "quantize.codebook_used" in ckpt["model"]
    side = json.loads((world / "vq.json").read_text())
    m = side["metrics"]
    assert side["kind"] == "vq" and side["vq_args"]["codebook_size"] == 64 and side["params"]["steps"] == 4
    assert 0 < m["psnr"] < 60 and 0 < m["codebook_usage"] <= 1 and m["codes_used"] == round(m["codebook_usage"] * 64)


def test_tokenize_outputs(world):
    tok = torch.load(world / "tok_val.pt")
    ref = data.load_data(world / "val.pt")
    assert tok["tokens"].shape == (32, 64) and tok["tokens"].dtype == torch.long and tok["codebook_size"] == 64
    assert torch.equal(tok["labels"], ref["labels"]) and tok["captions"] == ref["captions"]
    model = load_vq(world / "vq.pt")
    assert torch.equal(tok["tokens"][:4], model.encode(data.to_unit(ref["images"][:4])))


def test_train_gpt_outputs(world):
    ckpt = read_checkpoint(world / "gpt.pt")
    assert set(ckpt) == {"model", "args"} and ckpt["model"]["tok_embeddings.weight"].shape == (64, 32)
    assert ckpt["model"]["cls_embedding.embedding_table.weight"].shape == (17, 32)  # 16 classes + CFG null class
    model = load_gpt(world / "gpt.pt")
    assert model.args.image_tokens == 64 and model.args.n_layer == 2
    m = json.loads((world / "gpt.json").read_text())["metrics"]
    assert [h["step"] for h in m["history"]] == [3, 6]
    assert 0 < m["val_loss"] < 2 * math.log(64) and m["val_perplexity"] == pytest.approx(math.exp(m["val_loss"]))


def test_ambiguity_outputs(world):
    out, steps, grid = world / "amb.csv", world / "amb_steps.csv", world / "grid.png"
    ambiguity.main(["--target", str(world / "gpt.pt"), "--heldout", str(world / "tok_val.pt"), "--out", str(out),
                    "--steps-out", str(steps), "--vq", str(world / "vq.pt"), "--grid", str(grid),
                    "--params", '{"cfg_scales": [1, 3], "n_samples": 16, "n_heldout": 8, "batch": 8}'])
    table = pd.read_csv(out)
    assert list(zip(table.source, table.cfg_scale)) == [("samples", 1), ("heldout", 1), ("samples", 3), ("heldout", 3)]
    assert table.steps.tolist() == [16 * 64, 8 * 64] * 2
    assert ((table.mean_top1 > 0) & (table.mean_top1 <= 1) & (table.mean_entropy <= math.log(64) + 1e-4)).all()
    per_step = pd.read_csv(steps)
    assert len(per_step) == table.steps.sum()
    sub = per_step[(per_step.source == "samples") & (per_step.cfg_scale == 3)]
    row = table[(table.source == "samples") & (table.cfg_scale == 3)].iloc[0]
    assert sub.top1.mean() == pytest.approx(row.mean_top1, rel=1e-5)
    assert (sub.top1 < 0.2).mean() == pytest.approx(row["frac_top1_below_0.2"])
    assert grid.stat().st_size > 1000


def test_train_gpt_concatenates_its_token_files_in_order(world):
    one = torch.load(world / "tok_train.pt")
    both = train_gpt.load_training_tokens([str(world / "tok_train.pt"), str(world / "tok_val.pt")])
    two = torch.load(world / "tok_val.pt")
    assert torch.equal(both["tokens"], torch.cat([one["tokens"], two["tokens"]]))
    assert torch.equal(both["labels"], torch.cat([one["labels"], two["labels"]]))
    assert both["codebook_size"] == one["codebook_size"]
    other = dict(two, codebook_size=two["codebook_size"] * 2)
    torch.save(other, world / "tok_other.pt")
    with pytest.raises(UserError, match="tok_other.pt comes from a different tokenizer"):
        train_gpt.main(["--tokens", str(world / "tok_train.pt"), str(world / "tok_other.pt"),
                        "--val", str(world / "tok_val.pt"), "--out", str(world / "x.pt")])
    assert not (world / "x.pt").exists()


def test_bad_params_are_named(world):
    with pytest.raises(UserError, match="lerning_rate"):
        train_gpt.main(["--tokens", str(world / "tok_train.pt"), "--val", str(world / "tok_val.pt"),
                        "--out", str(world / "x.pt"), "--params", '{"lerning_rate": 1}'])
    with pytest.raises(UserError, match="does not exist"):
        train_vq.main(["--data", str(world / "nope.pt"), "--val", str(world / "val.pt"), "--out", str(world / "x.pt")])
    with pytest.raises(UserError, match="num_classes"):
        train_gpt.main(["--tokens", str(world / "tok_train.pt"), "--val", str(world / "tok_val.pt"),
                        "--out", str(world / "x.pt"), "--params", '{"num_classes": 4}'])
    with pytest.raises(UserError, match="cfg_scales"):
        ambiguity.main(["--target", str(world / "gpt.pt"), "--heldout", str(world / "tok_val.pt"),
                        "--out", str(world / "a.csv"), "--steps-out", str(world / "b.csv"),
                        "--params", '{"cfg_scales": [0.5]}'])
    assert not (world / "x.pt").exists()


def test_cosine_schedule():
    lrs = [cosine_lr(s, 100, 1.0, 10, 0.1) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))
    assert cosine_lr(100, 100, 1.0, 10, 0.1) == pytest.approx(0.1)
