"""Each sampling knob means what it means in upstream LlamaGen (autoregressive/models/generate.py), pinned on tiny
vocabularies with hand-computed numbers: CFG mixing and cfg_interval, temperature, top-k, top-p and their order."""
import math

import pytest
import torch

from lantern.engine.decoding.generate import decode_one_token, generate, prefill
from lantern.engine.models.model import GPT, ModelArgs
from lantern.engine.decoding.sampling import SamplingParams, image_generator, logits_to_probs, mix_cfg, row_probs
from tiny import one_thread  # noqa: F401 (fixture)

COND = torch.tensor([[1.0, 2.0, 3.0]])
UNCOND = torch.tensor([[0.0, 1.0, 1.0]])
GUIDED_AT_2 = torch.tensor([[2.0, 3.0, 5.0]])  # l_u + (l_c - l_u) * 2 = [0 + 2, 1 + 2, 1 + 4]


def test_cfg_is_uncond_plus_scaled_difference():
    rows = torch.cat([COND, UNCOND])
    assert torch.equal(mix_cfg(rows, SamplingParams(cfg_scale=2.0), 0), GUIDED_AT_2)
    assert torch.equal(mix_cfg(rows, SamplingParams(cfg_scale=3.0), 0), torch.tensor([[3.0, 4.0, 7.0]]))


def test_scale_one_is_no_cfg():
    """At s = 1 there are no uncond rows at all: the logits pass through untouched."""
    assert not SamplingParams(cfg_scale=1.0).use_cfg
    assert torch.equal(mix_cfg(COND, SamplingParams(cfg_scale=1.0), 0), COND)


# Upstream: the prefill's token (index 0) is always guided; decode step i samples token i + 1 and is guided while
# i <= cfg_interval. So cfg_interval 0 guides tokens 0 and 1, cfg_interval 3 guides tokens 0 .. 4.
@pytest.mark.parametrize("cfg_interval,guided", [(-1, [0, 1, 2, 3, 4, 5, 6, 7]), (0, [0, 1]), (3, [0, 1, 2, 3, 4])])
def test_cfg_interval_guides_the_same_token_indices_as_upstream(cfg_interval, guided):
    params = SamplingParams(cfg_scale=2.0, cfg_interval=cfg_interval)
    rows = torch.cat([COND, UNCOND])
    for index in range(8):
        expected = GUIDED_AT_2 if index in guided else COND
        assert torch.equal(mix_cfg(rows, params, index), expected), index
    # the tree decoders' form: one token index per position along dim 1
    stacked = torch.stack([rows] * 8, dim=1)  # [2, 8, 3]
    mixed = mix_cfg(stacked, params, torch.arange(8))
    for index in range(8):
        assert torch.equal(mixed[:, index], GUIDED_AT_2 if index in guided else COND), index
    probs = row_probs(stacked, params, torch.arange(8))
    for index in range(8):
        assert torch.allclose(probs[index], (GUIDED_AT_2 if index in guided else COND)[0].softmax(-1)), index


def upstream_greedy(model: GPT, cond: torch.Tensor, cfg_scale: float, cfg_interval: int) -> torch.Tensor:
    """Upstream's control flow (prefill, then decode_n_tokens with its cfg_flag), written out over our cache."""
    N, T = model.args.image_tokens, model.args.cls_token_num
    model.setup_cache(2 * len(cond))
    c, u = prefill(model, torch.cat([cond, model.null_cond(len(cond))]))[0].chunk(2)
    token = (u + (c - u) * cfg_scale).argmax(-1)
    out, cfg_flag = [token], True
    for i in range(N - 1):
        if cfg_interval > -1 and i > cfg_interval:
            cfg_flag = False
        c, u = decode_one_token(model, torch.cat([token, token]), T + i)[0].chunk(2)
        token = (u + (c - u) * cfg_scale if cfg_flag else c).argmax(-1)
        out.append(token)
    model.clear_cache()
    return torch.stack(out, dim=1)


@torch.no_grad()
def test_generate_applies_cfg_interval_exactly_like_upstreams_loop(one_thread):
    torch.manual_seed(1)
    model = GPT(ModelArgs(dim=32, n_layer=2, n_head=2, vocab_size=16, num_classes=4, image_tokens=16, multiple_of=32))
    model.eval()
    cond = torch.arange(4)
    runs = {}
    for interval in (-1, 0, 1, 3, 4):
        params = SamplingParams(cfg_scale=4.0, cfg_interval=interval, greedy=True)
        ours, _ = generate(model, cond, params, [image_generator(0, i) for i in range(4)])
        assert torch.equal(ours, upstream_greedy(model, cond, 4.0, interval)), interval
        runs[interval] = ours
    # the case can tell neighbouring intervals apart, so an off-by-one fails above
    assert not torch.equal(runs[0], runs[1]) and not torch.equal(runs[3], runs[4])


def test_temperature_divides_logits():
    logits = torch.tensor([0.0, 2 * math.log(2), 4 * math.log(2)])  # exp: 1, 4, 16
    expected_t1 = torch.tensor([1.0, 4.0, 16.0]) / 21
    expected_t2 = torch.tensor([1.0, 2.0, 4.0]) / 7  # exp(l / 2): 1, 2, 4
    assert torch.allclose(logits_to_probs(logits, SamplingParams(temperature=1.0)), expected_t1)
    assert torch.allclose(logits_to_probs(logits, SamplingParams(temperature=2.0)), expected_t2)


def test_top_k_keeps_ties_at_the_kth_value():
    logits = torch.tensor([3.0, 1.0, 2.0, 2.0, 0.0])
    e = math.e
    # top-2: the 2nd largest is 2.0, and upstream masks only logits < 2.0, so both 2.0 entries stay
    expected = torch.tensor([e, 0.0, 1.0, 1.0, 0.0]) / (e + 2)
    assert torch.allclose(logits_to_probs(logits, SamplingParams(top_k=2)), expected)
    assert torch.allclose(logits_to_probs(logits, SamplingParams(top_k=1)), torch.tensor([1.0, 0, 0, 0, 0]))
    assert torch.allclose(logits_to_probs(logits, SamplingParams(top_k=9)), logits.softmax(-1))  # k > V: no filter


def test_top_p_keeps_the_token_that_crosses_the_threshold():
    probs = torch.tensor([0.15, 0.5, 0.05, 0.3])  # sorted: 0.5, 0.3, 0.15, 0.05; cumulative 0.5, 0.8, 0.95, 1.0
    logits = probs.log()
    cases = {
        0.4: [0.0, 1.0, 0.0, 0.0],  # the first token already crosses 0.4: only it is kept
        0.6: [0.0, 0.5 / 0.8, 0.0, 0.3 / 0.8],  # 0.5 + 0.3 crosses 0.6: both kept
        0.9: [0.15 / 0.95, 0.5 / 0.95, 0.0, 0.3 / 0.95],
        1.0: [0.15, 0.5, 0.05, 0.3],
    }
    for top_p, expected in cases.items():
        assert torch.allclose(logits_to_probs(logits, SamplingParams(top_p=top_p)), torch.tensor(expected)), top_p


def test_order_is_temperature_then_top_k_then_top_p():
    # temperature before top-p: at t = 0.5 the probs [.5, .3, .15, .05] become [.25, .09, .0225, .0025] / .365,
    # the first is 0.685 > 0.6, so top-p 0.6 keeps it alone (top-p first would keep two tokens)
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    got = logits_to_probs(logits, SamplingParams(temperature=0.5, top_p=0.6))
    assert torch.allclose(got, torch.tensor([1.0, 0.0, 0.0, 0.0]))
    # top-k before top-p: top-2 of [.4, .3, .2, .1] renormalises to [4/7, 3/7]; 4/7 = 0.571 > 0.55 keeps one token
    # (top-p 0.55 on the full distribution would keep two)
    logits = torch.tensor([0.4, 0.3, 0.2, 0.1]).log()
    got = logits_to_probs(logits, SamplingParams(top_k=2, top_p=0.55))
    assert torch.allclose(got, torch.tensor([1.0, 0.0, 0.0, 0.0]))
    got = logits_to_probs(logits, SamplingParams(top_k=3, top_p=0.8))  # [4, 3, 2] / 9: cumulative 0.44, 0.78, 1.0
    assert torch.allclose(got, torch.tensor([4 / 9, 3 / 9, 2 / 9, 0.0]))
