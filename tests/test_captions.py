"""`lantern encode-captions`: LlamaGen's T5 caption features (cleaning, padding to max_length, left padding) from a
local T5 folder or from precomputed <id>.npy files, in one lantern-captions-v1 file per shard."""
import csv

import numpy as np
import pytest
import torch

from fake_t5 import TINY_T5_DIM, write_tiny_t5
from lantern.pipeline.cli import main as cli
from lantern.errors import UserError
from lantern.io import save_torch
from lantern.worlds.llamagen.captions import FORMAT, clean_caption, left_pad, main, read_captions_file

CAPTIONS = ["A cat sits on a mat.", "Two dogs run in the park", "a red bus", "A plate of food on a wooden table"]
L = 12


@pytest.fixture(scope="module")
def t5(tmp_path_factory):
    return write_tiny_t5(tmp_path_factory.mktemp("t5"))


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.csv"
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([("id", "caption"), *[(f"p{i}", c) for i, c in enumerate(CAPTIONS)]])
    return path


# outputs of upstream LlamaGen's T5Embedder.text_preprocessing
@pytest.mark.parametrize("raw, cleaned", [
    ("A black Honda motorcycle parked in front of a garage.", "a black honda motorcycle parked in front of a garage."),
    ("<b>Bold</b> &amp; it's &quot;big&quot;", 'bold it\'s "big"'),
    ("Visit https://example.com/x now!!", "visit now!!"),
    ("this-is-my-cute-cat-here", "this is my cute cat here"),
    ("A dog sitting between its masters feet on a footstool watching tv\n",
     "a dog sitting between its masters feet on a footstool watching tv"),
    ("«Quoted» ‘x’ 12x34 photo of jc6640", "\"quoted\" 'x' photo of"),
    ("A+B%20C (x) [y]", "a b c x y"),
])
def test_caption_cleaning_matches_upstream(raw, cleaned):
    assert clean_caption(raw) == cleaned


def test_left_pad_moves_valid_rows_to_the_end_and_zeroes_padding():
    feats = torch.arange(2 * 5 * 3, dtype=torch.float32).view(2, 5, 3) + 1
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]])
    out, new_mask = left_pad(feats, mask)
    assert new_mask.tolist() == [[False, False, False, True, True], [True] * 5]
    assert torch.equal(out[0, 3:], feats[0, :2]) and not out[0, :3].any()
    assert torch.equal(out[1], feats[1])


def reference_features(t5_dir, captions):
    """Upstream's steps written out plainly: cleaned text, padded tokens, encoder, per-row left padding."""
    from transformers import AutoTokenizer, T5EncoderModel

    tok = AutoTokenizer.from_pretrained(t5_dir, local_files_only=True)
    model = T5EncoderModel.from_pretrained(t5_dir, local_files_only=True).eval()
    enc = tok([clean_caption(c) for c in captions], max_length=L, padding="max_length", truncation=True,
              return_attention_mask=True, add_special_tokens=True, return_tensors="pt")
    with torch.no_grad():
        h = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])["last_hidden_state"]
    rows, masks = [], torch.flip(enc["attention_mask"], dims=[-1])
    for emb, m in zip(h, enc["attention_mask"]):
        v = int(m.sum())
        rows.append(torch.cat([emb[v:], emb[:v]]))
    return torch.stack(rows) * masks[:, :, None], masks.bool(), enc["attention_mask"].sum(1)


def test_encode_captions_from_t5(tmp_path, t5, prompts):
    out = tmp_path / "shard.pt"
    main(["--prompts", str(prompts), "--start", "1", "--end", "4", "--t5", str(t5), "--out", str(out),
          "--max-length", str(L), "--batch", "2", "--device", "cpu"])
    data = read_captions_file(out)
    assert data["format"] == FORMAT and data["max_length"] == L
    assert data["ids"] == ["p1", "p2", "p3"] and data["captions"] == CAPTIONS[1:4]
    assert data["index"].tolist() == [1, 2, 3]
    assert data["features"].shape == (3, L, TINY_T5_DIM) and data["features"].dtype == torch.float32
    want, mask, lengths = reference_features(t5, CAPTIONS[1:4])
    assert torch.equal(data["mask"], mask)
    assert torch.allclose(data["features"], want, atol=1e-5)
    assert (lengths < L).any() and (lengths == L).any()  # a padded caption and a truncated one
    assert not data["features"][~data["mask"]].any()
    assert "T5EncoderModel" in data["encoder"]


def test_precomputed_features_in_llamagen_layout_give_the_same_shard(tmp_path, t5, prompts):
    main(["--prompts", str(prompts), "--t5", str(t5), "--out", str(tmp_path / "t5.pt"), "--max-length", str(L)])
    from_t5 = read_captions_file(tmp_path / "t5.pt")
    assert from_t5["index"].tolist() == [0, 1, 2, 3]  # no --start/--end: every row
    folder = tmp_path / "feats"
    folder.mkdir()
    for pid, f, m in zip(from_t5["ids"], from_t5["features"], from_t5["mask"]):
        np.save(folder / f"{pid}.npy", f[m][None].numpy())  # what extract_t5_feature.py stores: [1, valid, C]
    main(["--prompts", str(prompts), "--features", str(folder), "--out", str(tmp_path / "npy.pt"),
          "--max-length", str(L), "--dtype", "bf16"])
    from_npy = read_captions_file(tmp_path / "npy.pt")
    assert from_npy["features"].dtype == torch.bfloat16
    assert torch.equal(from_npy["mask"], from_t5["mask"])
    assert torch.equal(from_npy["features"], from_t5["features"].to(torch.bfloat16))
    assert "precomputed" in from_npy["encoder"]


def test_missing_sources_are_one_line_errors(tmp_path, t5, prompts, capsys):
    out = str(tmp_path / "x.pt")
    with pytest.raises(UserError, match=r"--t5 .* \(no config.json\)"):
        main(["--prompts", str(prompts), "--t5", str(tmp_path / "nowhere"), "--out", out])
    (tmp_path / "feats").mkdir()
    np.save(tmp_path / "feats" / "p0.npy", np.zeros((1, 3, 4), np.float32))
    code = cli(["encode-captions", "--prompts", str(prompts), "--features", str(tmp_path / "feats"), "--out", out])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "--features" in err and "'p1'" in err
    with pytest.raises(UserError, match="--end <= 4"):
        main(["--prompts", str(prompts), "--start", "2", "--end", "5", "--t5", str(t5), "--out", out])
    with pytest.raises(UserError, match="--prompts .* does not exist"):
        main(["--prompts", str(tmp_path / "none.csv"), "--t5", str(t5), "--out", out])
    assert not (tmp_path / "x.pt").exists()


def good_shard(**change):
    n = 2
    obj = {"format": FORMAT, "ids": ["a", "b"], "captions": ["x", "y"], "index": torch.arange(n),
           "features": torch.zeros(n, 4, 3), "mask": torch.ones(n, 4, dtype=torch.bool), "encoder": "test",
           "max_length": 4}
    return {**obj, **change}


@pytest.mark.parametrize("change, match", [
    ({"format": "other"}, "not a lantern-captions-v1 file"),
    ({"mask": torch.ones(2, 5, dtype=torch.bool)}, "mask must be"),
    ({"features": torch.zeros(2, 4, 3, dtype=torch.long)}, "features must be"),
    ({"index": torch.tensor([1, 1])}, "index must be"),
    ({"captions": ["x"]}, "captions must be"),
])
def test_read_captions_file_rejects_malformed_shards(tmp_path, change, match):
    save_torch(good_shard(**change), tmp_path / "c.pt")
    with pytest.raises(UserError, match=match) as e:
        read_captions_file(tmp_path / "c.pt")
    assert "\n" not in str(e.value) and "--captions" in str(e.value)


def test_read_captions_file_needs_a_torch_file(tmp_path):
    save_torch(good_shard(), tmp_path / "ok.pt")
    assert read_captions_file(tmp_path / "ok.pt")["ids"] == ["a", "b"]
    (tmp_path / "c.pt").write_text("not torch")
    with pytest.raises(UserError, match="unreadable"):
        read_captions_file(tmp_path / "c.pt")
