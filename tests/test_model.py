import pytest
import torch

from lantern.errors import UserError
from lantern.engine.decoding.generate import decode_one_token, prefill
from lantern.engine.models.model import causal_mask
from lantern.engine.models.model import GPT, ModelArgs


def tiny(model_type="c2i", **kw):
    base = dict(dim=64, n_layer=2, n_head=4, vocab_size=37, num_classes=5, image_tokens=16, multiple_of=32)
    if model_type == "t2i":
        base.update(model_type="t2i", cls_token_num=6, caption_dim=24)
    base.update(kw)
    torch.manual_seed(0)
    return GPT(ModelArgs(**base)).eval()


def full_then_cached(model, cond, tokens, cond_mask=None):
    T, N = model.args.cls_token_num, model.args.image_tokens
    full, full_h = model(cond, tokens[:, :-1], cond_mask=cond_mask)
    model.setup_cache(cond.shape[0])
    logits, hidden = prefill(model, cond, cond_mask)
    steps, hiddens = [logits], [hidden]
    for i in range(N - 1):
        logits, hidden = decode_one_token(model, tokens[:, i], T + i)
        steps.append(logits)
        hiddens.append(hidden)
    model.clear_cache()
    return full, full_h, torch.stack(steps, 1), torch.stack(hiddens, 1)


@torch.no_grad()
def test_cached_decoding_matches_full_forward_c2i():
    model = tiny()
    cond = torch.tensor([1, 5])  # 5 is the null class
    tokens = torch.randint(0, 37, (2, 16))
    full, full_h, cached, cached_h = full_then_cached(model, cond, tokens)
    assert full.shape == (2, 16, 37) and full_h.shape == (2, 16, 64)
    torch.testing.assert_close(cached, full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cached_h, full_h, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_cached_decoding_matches_full_forward_t2i_with_left_padding():
    model = tiny("t2i")
    cond = torch.randn(2, 6, 24)
    cond_mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    tokens = torch.randint(0, 37, (2, 16))
    full, _, cached, _ = full_then_cached(model, cond, tokens, cond_mask)
    torch.testing.assert_close(cached, full, atol=1e-5, rtol=1e-5)
    # padding is really hidden: changing padded caption features changes nothing
    cond2 = cond.clone()
    cond2[0, :2] = torch.randn(2, 24)
    full2, _ = model(cond2, tokens[:, :-1], cond_mask=cond_mask)
    torch.testing.assert_close(full2, full, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_tree_block_with_mask_and_keep_equals_sequential_decoding():
    """Write a block of branching nodes with an ancestor mask, keep one path, continue: same as plain decoding."""
    model = tiny()
    T = 1
    cond = torch.tensor([2])
    seq = torch.randint(0, 37, (1, 6))
    # reference: sequential decode of seq
    model.setup_cache(1, extra=8)
    ref = [prefill(model, cond)[0]]
    for i in range(5):
        ref.append(decode_one_token(model, seq[:, i], T + i)[0])
    model.clear_cache()

    model.setup_cache(1, extra=8)
    prefill(model, cond)
    decode_one_token(model, seq[:, 0], T)  # slot 1 holds img_0
    # tree below root img_0: nodes (parent, token): a=seq1 (child of root), b=other (child of root), c=seq2 (child of a)
    start = T + 1
    other = (seq[0, 1] + 1) % 37
    toks = torch.stack([seq[0, 1], other, seq[0, 2]]).view(1, 3)
    depth = torch.tensor([1, 1, 2])
    parents = [-1, -1, 0]
    slots = start + torch.arange(3)
    visible = causal_mask(3, model.cache_len, "cpu", start=start - 1) & False
    visible[:, :start] = True
    for i in range(3):
        j = i
        while j >= 0:
            visible[i, start + j] = True
            j = parents[j]
    logits, _ = model.forward_cached(model.embed_tokens(toks), start - 1 + depth, slots, visible)
    torch.testing.assert_close(logits[0, 0], ref[2][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits[0, 2], ref[3][0], atol=1e-5, rtol=1e-5)
    model.keep(torch.tensor([start, start + 2]), start)  # accept path a -> c
    nxt, _ = decode_one_token(model, seq[:, 3], T + 3)
    torch.testing.assert_close(nxt[0], ref[4][0], atol=1e-5, rtol=1e-5)
    model.clear_cache()


def test_bad_args_are_user_errors():
    with pytest.raises(UserError, match="perfect square"):
        ModelArgs(image_tokens=60)
    with pytest.raises(UserError, match="cls_token_num"):
        ModelArgs(cls_token_num=3)


def test_new_t2i_models_take_upstreams_120_caption_tokens():
    args = ModelArgs(dim=32, n_layer=1, n_head=2, vocab_size=8, model_type="t2i", caption_dim=12, image_tokens=4)
    assert args.cls_token_num == 120 and ModelArgs().cls_token_num == 1
    with torch.device("meta"):
        assert GPT(args).cls_embedding.uncond_embedding.shape == (120, 12)
        small = GPT(ModelArgs(**{**args.to_dict(), "cls_token_num": 6}))  # tiny test models may use fewer
    assert small.cls_embedding.uncond_embedding.shape == (6, 12)


def test_class_table_has_the_null_row_only_when_asked():
    base = dict(dim=32, n_layer=1, n_head=2, vocab_size=8, num_classes=5, image_tokens=4)
    with torch.device("meta"):
        assert GPT(ModelArgs(**base)).cls_embedding.embedding_table.weight.shape == (6, 32)
        plain = GPT(ModelArgs(**base, null_class=False, class_dropout_prob=0.0))
    assert plain.cls_embedding.embedding_table.weight.shape == (5, 32)
    with pytest.raises(UserError, match="null_class: false needs a c2i model with class_dropout_prob: 0"):
        ModelArgs(**base, null_class=False)
    with pytest.raises(UserError, match="null_class: false"):
        ModelArgs(**{**base, "model_type": "t2i"}, null_class=False, class_dropout_prob=0.0)
