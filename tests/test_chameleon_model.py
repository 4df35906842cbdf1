"""The Chameleon target (engine/models/chameleon.py) against transformers' own Chameleon, read from HF shards.

Our RoPE rotates in fp32 (apply_rope, as LlamaGen's), so float64 models agree to ~1e-7, not 1e-15; a wrong
permutation, norm or position is off by O(1)."""
import json

import pytest
import torch

from lantern.engine.decoding.generate import cfg_rows
from lantern.engine.decoding.sampling import SamplingParams
from lantern.engine.models.chameleon import Chameleon, ChameleonArgs
from lantern.engine.models.chameleon_load import chameleon_from_hf
from lantern.engine.models.model import causal_mask
from lantern.errors import UserError
from lantern.worlds.chameleon.hf import load_target, read_target_folder
from tiny import one_thread  # noqa: F401 (fixture)
from tiny_chameleon import hf_logits, hf_model, ours_from, save_shards

pytestmark = pytest.mark.usefixtures("one_thread")
TOL = dict(atol=2e-6, rtol=1e-6)
LAYOUT = dict(cls_token_num=8, image_tokens=12, image_codes=16, uncond_prompt=(0, 21))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    hf = hf_model()
    folder = save_shards(hf, tmp_path_factory.mktemp("hf"))
    return hf, ours_from(folder, **LAYOUT), folder


@pytest.mark.parametrize("swin", [False, True])
@pytest.mark.parametrize("shared_norm", [False, True])
def test_logits_equal_transformers(swin, shared_norm, tmp_path):
    hf = hf_model(swin=swin, shared_norm=shared_norm, seed=1)
    folder = save_shards(hf, tmp_path)
    args, sd, where = read_target_folder(folder, **LAYOUT)
    assert len(set(where.values())) > 3 and not any(k.startswith("model.vqmodel.") for k in sd)
    assert args.swin_norm == swin
    if shared_norm:  # Lumina's files: one gamma / beta row for every head
        sd = {k: v[:1] if "_norm." in k else v for k, v in sd.items()}
    ours = chameleon_from_hf(args, sd, folder, where, dtype=torch.float64)
    ids = torch.randint(0, 64, (3, 11), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(11)[None] + torch.tensor([[0], [4], [9]])  # explicit positions (the table has T + N = 20)
    h, full = hf_logits(hf, ids, pos)
    logits, hidden = ours.run(ours.embed_cond(ids), pos)
    torch.testing.assert_close(hidden, h, **TOL)
    torch.testing.assert_close(ours.full_logits(hidden), full.float(), **TOL)
    torch.testing.assert_close(logits, full[..., 4:20].float(), **TOL)  # the image head: ids 4 .. 19


def test_image_head_is_the_masked_softmax_over_the_real_ids(tmp_path):
    """Vocabulary 8832 at width 32: codes at ids 4..8195 (the real layout); softmax over them is the authors'
    distribution after every other logit is set to finfo.min."""
    hf = hf_model(vocab=8832, codes=8192, std=0.5)
    ours = ours_from(save_shards(hf, tmp_path), cls_token_num=4, image_tokens=4)
    ids = torch.tensor([[0, 17, 8710, 8197]])
    _, full = hf_logits(hf, ids)
    masked = full.clone()
    masked[..., :4] = torch.finfo(full.dtype).min
    masked[..., 8196:] = torch.finfo(full.dtype).min
    authors = masked.softmax(-1)
    logits, _ = ours.run(ours.embed_cond(ids), torch.arange(4))
    assert logits.shape[-1] == 8192
    torch.testing.assert_close(logits.double().softmax(-1), authors[..., 4:8196], atol=1e-9, rtol=1e-5)
    assert authors[..., :4].sum() == 0 and authors[..., 8196:].sum() == 0
    # code c embeds as token id c + 4
    codes = torch.tensor([[0, 5, 8191]])
    assert torch.equal(ours.embed_tokens(codes), ours.tok_embeddings(codes + 4))


def test_extra_head_ids_follow_the_codes(pair):
    hf, _, folder = pair
    ours = ours_from(folder, **dict(LAYOUT, extra_ids=(30, 2)))
    assert ours.args.vocab_size == 18
    ids = torch.tensor([[0, 9, 33]])
    _, full = hf_logits(hf, ids)
    logits, _ = ours.run(ours.embed_cond(ids), torch.arange(3))
    torch.testing.assert_close(logits, torch.cat([full[..., 4:20], full[..., [30, 2]]], -1).float(), **TOL)
    assert torch.equal(ours.embed_tokens(torch.tensor([16, 17])), ours.tok_embeddings(torch.tensor([30, 2])))


def left_pad(prompts, T, pad=1):
    ids = torch.tensor([[pad] * (T - len(p)) + p for p in prompts])
    return ids, ids.new_tensor([[0] * (T - len(p)) + [1] * len(p) for p in prompts]).bool()


PROMPTS = [[0, 7, 33, 40, 8], [0, 50, 8], [0, 12, 13, 14, 15, 16, 9, 8]]


def test_padded_prompts_and_the_uncond_row_equal_unpadded_runs(pair):
    """Prompts of different lengths, left-padded in one batch with the Anole-style null row [0, 21] (CFG rows),
    through the cache: every real position equals the HF forward of that row's unpadded tokens."""
    hf, ours, _ = pair
    ids, mask = left_pad(PROMPTS, 8)
    rows, rows_mask = cfg_rows(ours, ids, SamplingParams(cfg_scale=3.0), mask)
    assert rows.shape == (6, 8) and rows[3:, -2:].eq(torch.tensor([0, 21])).all() and rows_mask[3:, :-2].sum() == 0
    ours.setup_cache(6, extra=4)
    ours.set_cond_mask(rows_mask)
    logits, hidden = ours.prefill_cond(ours.embed_cond(rows), rows_mask)
    codes = torch.tensor([[3, 9], [1, 1], [15, 0]]).repeat(2, 1)  # two image tokens after each prompt
    pos = torch.tensor([8, 9])
    step, step_h = ours.forward_cached(ours.embed_tokens(codes), pos, pos, causal_mask(2, ours.cache_len, "cpu", 8))
    ours.clear_cache()
    for r in range(6):
        real = rows[r][rows_mask[r]]
        h, _ = hf_logits(hf, torch.cat([real, codes[r] + 4])[None])
        n = len(real)
        torch.testing.assert_close(hidden[r, -n:], h[0, :n], **TOL)
        torch.testing.assert_close(step_h[r], h[0, n:], **TOL)
    # the uncached teacher-forced pass says the same
    _, tf_logits, tf_hidden = ours.teacher_forced(rows, codes, rows_mask)
    torch.testing.assert_close(tf_hidden[:, -2:], step_h, **TOL)


@pytest.mark.parametrize("batch", [1, 3])
def test_cached_tree_verify_equals_each_path(pair, batch):
    """A draft tree verified in one cached pass per row (per-row positions, ancestor masks, ragged padding): each
    node's hidden state equals the HF forward of prompt + its root-to-node path; a batch equals one by one."""
    hf, ours, _ = pair
    parents = [-1, 0, 0, 1, 1, 2, 4]  # node 0 is the root (the newest token); depth = ancestors
    depth = [0, 1, 1, 2, 2, 2, 3]
    m = len(parents)
    gen = torch.Generator().manual_seed(3)
    prompts = PROMPTS[:batch]
    ids, mask = left_pad(prompts, 8)
    ours.setup_cache(batch, extra=m + 1)
    ours.set_cond_mask(mask)
    ours.prefill_cond(ours.embed_cond(ids), mask)
    Q = 8  # the tree's root sits at slot / position Q
    anc = torch.eye(m, dtype=torch.bool)
    for j in range(1, m):
        anc[j] |= anc[parents[j]]
    visible = torch.zeros(batch, m, ours.cache_len, dtype=torch.bool)
    visible[:, :, :Q] = True
    visible[:, :, Q : Q + m] = anc
    tokens = torch.randint(0, 16, (batch, m), generator=gen)
    pos = (Q + torch.tensor(depth)).expand(batch, -1)
    slots = (Q + torch.arange(m)).expand(batch, -1)
    _, hidden = ours.forward_rows(ours.embed_tokens(tokens), pos, slots, visible)
    ours.clear_cache()
    for b, prompt in enumerate(prompts):
        for j in range(m):
            path = [j]
            while parents[path[-1]] >= 0:
                path.append(parents[path[-1]])
            seq = torch.cat([torch.tensor(prompt), tokens[b, path[::-1]] + 4])
            h, _ = hf_logits(hf, seq[None])
            torch.testing.assert_close(hidden[b, j], h[0, -1], **TOL)


def test_the_reader_names_the_file_and_the_key(pair, tmp_path):
    from safetensors.torch import load_file, save_file

    hf, _, folder = pair
    (tmp_path / "x").mkdir()
    for f in folder.iterdir():
        (tmp_path / "x" / f.name).write_bytes(f.read_bytes())
    index = json.loads((tmp_path / "x" / "model.safetensors.index.json").read_text())
    key = "model.layers.1.mlp.up_proj.weight"
    shard = tmp_path / "x" / index["weight_map"][key]
    tensors = load_file(shard)
    save_file({**tensors, key: tensors[key][:-1].contiguous()}, shard)
    with pytest.raises(UserError, match=rf"{shard.name}: {key} has shape \(63, 32\), expected \(64, 32\)"):
        ours_from(tmp_path / "x", **LAYOUT)
    save_file({k: v for k, v in tensors.items() if k != key}, shard)
    with pytest.raises(UserError, match=rf"{shard.name}: has no tensor {key}"):
        ours_from(tmp_path / "x", **LAYOUT)
    args, sd, where = read_target_folder(folder, **LAYOUT)
    with pytest.raises(UserError, match="missing tensor model.norm.weight"):
        chameleon_from_hf(args, {k: v for k, v in sd.items() if k != "model.norm.weight"}, folder, where)
    with pytest.raises(UserError, match="unexpected tensor model.layers.2.mlp"):
        chameleon_from_hf(args, {**sd, "model.layers.2.mlp.up_proj.weight": sd[key]}, folder, where)
    with pytest.raises(UserError, match=r"q_norm.weight has shape \(3, 8\), expected \(4, 8\) or \(1, 8\)"):
        chameleon_from_hf(args, {**sd, "model.layers.0.self_attn.q_norm.weight": torch.ones(3, 8)}, folder)
    with pytest.raises(UserError, match="no config.json"):
        load_target(tmp_path)


def test_layout_errors_are_one_line():
    with pytest.raises(UserError, match="left-padded"):
        Chameleon(ChameleonArgs(dim=32, n_layer=1, n_head=4, ffn_dim=64, text_vocab=64, image_codes=16,
                                cls_token_num=4, image_tokens=4)).set_cond_mask(torch.tensor([[1, 0, 1, 1]]).bool())
    with pytest.raises(UserError, match="no CFG null prompt"):
        Chameleon(ChameleonArgs(dim=32, n_layer=1, n_head=4, ffn_dim=64, text_vocab=64, image_codes=16,
                                cls_token_num=4, image_tokens=4)).null_cond(2)
    with pytest.raises(UserError, match="distinct ids below"):
        ChameleonArgs(text_vocab=64, image_codes=16, extra_ids=(64,))


def test_a_layout_past_the_trained_positions_is_refused(pair):
    _, _, folder = pair
    with pytest.raises(UserError, match="exceed config.json max_position_embeddings 128"):
        read_target_folder(folder, **dict(LAYOUT, cls_token_num=100, image_tokens=29))
    assert read_target_folder(folder, **dict(LAYOUT, cls_token_num=100, image_tokens=28))[0].max_seq_len == 128
