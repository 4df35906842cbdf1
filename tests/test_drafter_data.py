"""Real-image drafter data: image folders -> `lantern encode-images` (sharded) -> `lantern train-drafter` for tiny
c2i and t2i targets (t2i with hand-written lantern-captions-v1 files)."""
import csv
import dataclasses

import numpy as np
import pytest
import torch
from PIL import Image

from lantern.engine.models.checkpoint import save_checkpoint
from lantern.engine.models.drafter import load_drafter
from lantern.pipeline.train_drafter import main as train_main, read_caption_features, real_data
from lantern.errors import UserError
from lantern.worlds.llamagen.images import center_crop, main as encode_main
from lantern.engine.models.vq import VQArgs, VQModel
from tiny import one_thread, tiny_target  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("one_thread")
SIZES = [(40, 24), (17, 30), (16, 16), (64, 40), (23, 19)]


def write_png(path, w, h, seed):
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)


@pytest.fixture
def vq_path(tmp_path):
    """A 16-code VQ downsampling by 4: 16 px images -> 4 x 4 = 16 tokens, the tiny targets' sequence length."""
    args = VQArgs(codebook_size=16, codebook_embed_dim=4, ch=8, ch_mult=(1, 1, 2), z_channels=8,
                  enc_res_blocks=(0, 1, 1), dec_res_blocks=(1, 1, 0), norm_groups=4, usage_window=64)
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "vq.pt", VQModel(args), args=dataclasses.asdict(args))
    return tmp_path / "vq.pt"


@pytest.fixture
def class_folder(tmp_path):
    root = tmp_path / "imagenet"
    for c, name in enumerate(["n02", "n01", "n03"]):  # sorted: n01 -> 0, n02 -> 1, n03 -> 2
        for i in range(3):
            w, h = SIZES[(c + i) % len(SIZES)]
            write_png(root / name / f"img{i}.png", w, h, seed=10 * c + i)
    (root / "n01" / "notes.txt").write_text("not an image")
    return root


@pytest.fixture
def caption_folder(tmp_path):
    root = tmp_path / "coco"
    names = ["b/2.png", "a.png", "c.png", "b/1.png", "d.png", "e.png"]
    for i, name in enumerate(names):
        write_png(root / name, *SIZES[i % len(SIZES)], seed=100 + i)
    with open(root / "captions.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["image", "caption"])
        w.writerows((name, f"caption of {name}, with a comma") for name in names)
    return root


def encode(root, layout, vq, out, start, end, *extra):
    encode_main(["--images", str(root), "--layout", layout, "--vq", str(vq), "--image-size", "16", "--start",
                 str(start), "--end", str(end), "--out", str(out), "--device", "cpu", "--batch", "2", *extra])
    return torch.load(out, weights_only=True)


def test_center_crop_is_adm():
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (40, 64, 3), dtype=np.uint8))  # 64 wide, 40 high
    # short side 40 >= 2 x 16: BOX-halve to 32 x 20; then BICUBIC to short side 16: 26 x 16; crop x from 5
    want = image.resize((32, 20), Image.BOX).resize((26, 16), Image.BICUBIC).crop((5, 0, 21, 16))
    got = center_crop(image, 16)
    assert got.size == (16, 16)
    assert np.array_equal(np.asarray(got), np.asarray(want))


def test_class_layout_shards_concatenate(tmp_path, class_folder, vq_path):
    whole = encode(class_folder, "classes", vq_path, tmp_path / "all.pt", 0, 9)
    a = encode(class_folder, "classes", vq_path, tmp_path / "s0.pt", 0, 4)
    b = encode(class_folder, "classes", vq_path, tmp_path / "s1.pt", 4, 9)
    assert whole["tokens"].shape == (9, 16) and whole["tokens"].max() < 16
    assert torch.equal(torch.cat([a["tokens"], b["tokens"]]), whole["tokens"])
    assert a["ids"] + b["ids"] == whole["ids"] == [f"{c}/img{i}.png" for c in ("n01", "n02", "n03") for i in range(3)]
    assert whole["labels"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2] and whole["classes"] == ["n01", "n02", "n03"]
    with pytest.raises(UserError, match="--end 10 exceeds the 9 images"):
        encode(class_folder, "classes", vq_path, tmp_path / "x.pt", 4, 10)
    with pytest.raises(UserError, match="no class folders"):
        encode(class_folder / "n01", "classes", vq_path, tmp_path / "x.pt", 0, 1)
    assert not (tmp_path / "x.pt").exists()


def test_caption_layout_and_its_csv(tmp_path, caption_folder, vq_path):
    out = encode(caption_folder, "captions", vq_path, tmp_path / "s.pt", 1, 5, "--captions-out", str(tmp_path / "s.csv"))
    assert out["ids"] == ["b/1.png", "b/2.png", "c.png", "d.png"]  # sorted paths [1, 5)
    assert out["captions"] == [f"caption of {i}, with a comma" for i in out["ids"]] and "labels" not in out
    with open(tmp_path / "s.csv", newline="") as f:
        assert list(csv.DictReader(f)) == [{"id": i, "caption": c} for i, c in zip(out["ids"], out["captions"])]
    (caption_folder / "captions.jsonl").write_text('{"image": "a.png", "caption": "x"}\n')
    with pytest.raises(UserError, match="both of captions.csv and captions.jsonl"):
        encode(caption_folder, "captions", vq_path, tmp_path / "x.pt", 0, 1)
    (caption_folder / "captions.csv").unlink()
    (caption_folder / "captions.jsonl").write_text('{"image": "missing.png", "caption": "x"}\n')
    with pytest.raises(UserError, match="names image missing.png"):
        encode(caption_folder, "captions", vq_path, tmp_path / "x.pt", 0, 1)


def test_train_drafter_on_class_shards(tmp_path, class_folder, vq_path, capsys):
    target = tiny_target()
    save_checkpoint(tmp_path / "gpt.pt", target, args=target.args.to_dict())
    shards = [encode(class_folder, "classes", vq_path, tmp_path / f"s{i}.pt", lo, hi) and str(tmp_path / f"s{i}.pt")
              for i, (lo, hi) in enumerate([(0, 4), (4, 9)])]
    train_main(["--target", str(tmp_path / "gpt.pt"), "--tokens", *shards, "--out", str(tmp_path / "d.pt"),
                "--device", "cpu", "--params", '{"epochs": 1, "batch_size": 4, "val_frac": 0.2}'])
    assert "val top-1 agreement" in capsys.readouterr().out
    obj = torch.load(tmp_path / "d.pt", weights_only=True)
    assert obj["metrics"]["n_train"] + obj["metrics"]["n_val"] == 9 and obj["tokens"] == shards
    load_drafter(tmp_path / "d.pt", target)


def captions_file(path, ids, seed, T=5, C=12):
    """A lantern-captions-v1 file written by hand: left-padded masks, fp16 features, zero padding rows."""
    g = torch.Generator().manual_seed(seed)
    n = len(ids)
    real = torch.randint(1, T + 1, (n,), generator=g)
    mask = torch.arange(T)[None, :] >= (T - real)[:, None]
    feats = (torch.randn(n, T, C, generator=g) * mask[..., None]).half()
    torch.save({"format": "lantern-captions-v1", "ids": list(ids), "captions": [f"c {i}" for i in ids],
                "index": torch.arange(n), "features": feats, "mask": mask, "encoder": "hand", "max_length": T}, path)
    return feats, mask


def test_t2i_features_follow_the_token_ids(tmp_path, caption_folder, vq_path):
    target = tiny_target("t2i")
    encode(caption_folder, "captions", vq_path, tmp_path / "s0.pt", 0, 3)
    encode(caption_folder, "captions", vq_path, tmp_path / "s1.pt", 3, 6)
    ids = torch.load(tmp_path / "s0.pt")["ids"] + torch.load(tmp_path / "s1.pt")["ids"]
    order = [4, 1, 5, 0, 2, 3]  # the caption files list the ids in another order and split
    f0, m0 = captions_file(tmp_path / "c0.pt", [ids[i] for i in order[:2]], seed=1)
    f1, m1 = captions_file(tmp_path / "c1.pt", [ids[i] for i in order[2:]], seed=2)
    feats, masks = torch.cat([f0, f1]).float(), torch.cat([m0, m1])
    captions = read_caption_features([str(tmp_path / "c0.pt"), str(tmp_path / "c1.pt")], target)
    tokens, cond, mask = real_data([str(tmp_path / "s0.pt"), str(tmp_path / "s1.pt")], target, captions)
    rows = torch.tensor([order.index(i) for i in range(6)])
    assert tokens.shape == (6, 16)
    assert torch.equal(cond[torch.arange(6)], feats[rows]) and torch.equal(mask, masks[rows])
    assert torch.equal(cond[torch.tensor([5, 0])], feats[rows[[5, 0]]])

    captions_file(tmp_path / "short.pt", ids[:5], seed=3)
    with pytest.raises(UserError, match=f"id '{ids[5]}' .* has no row in --caption-features"):
        real_data([str(tmp_path / "s0.pt"), str(tmp_path / "s1.pt")], target,
                  read_caption_features([str(tmp_path / "short.pt")], target))
    with pytest.raises(UserError, match="appears twice"):
        read_caption_features([str(tmp_path / "c0.pt"), str(tmp_path / "c0.pt")], target)
    captions_file(tmp_path / "wide.pt", ids, seed=4, C=8)
    with pytest.raises(UserError, match=r"\[n, 5, 12\]"):
        read_caption_features([str(tmp_path / "wide.pt")], target)


def test_train_t2i_drafter_real_and_self(tmp_path, caption_folder, vq_path):
    target = tiny_target("t2i")
    save_checkpoint(tmp_path / "gpt.pt", target, args=target.args.to_dict())
    encode(caption_folder, "captions", vq_path, tmp_path / "s.pt", 0, 6)
    captions_file(tmp_path / "c.pt", torch.load(tmp_path / "s.pt")["ids"], seed=5)
    base = ["--target", str(tmp_path / "gpt.pt"), "--caption-features", str(tmp_path / "c.pt"), "--device", "cpu"]
    train_main(base + ["--tokens", str(tmp_path / "s.pt"), "--out", str(tmp_path / "real.pt"),
                       "--params", '{"epochs": 1, "batch_size": 2, "val_frac": 0.2}'])
    load_drafter(tmp_path / "real.pt", target)
    # self-distillation on the captions' features: the target draws the sequences
    train_main(base + ["--out", str(tmp_path / "self.pt"),
                       "--params", '{"data": "self", "n_self": 8, "epochs": 1, "batch_size": 4, "val_frac": 0.25}'])
    obj = torch.load(tmp_path / "self.pt", weights_only=True)
    assert obj["metrics"]["n_train"] == 6 and obj["metrics"]["n_val"] == 2
    with pytest.raises(UserError, match="needs --caption-features"):
        train_main(["--target", str(tmp_path / "gpt.pt"), "--device", "cpu", "--out", str(tmp_path / "x.pt"),
                    "--params", '{"data": "self", "n_self": 4}'])
