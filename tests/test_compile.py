"""generate(..., compile=True) (engine/decoding/compiled.py) against eager decoding: the same tokens, fp32 on CPU
(inductor).

Every distinct (model shape, cache rows) costs one inductor compilation (~10 s cold on 2 cores), so the whole file
uses five: the c2i target at 1, 2, 3 and 6 cache rows (B 1 and 3, CFG off and on) and the t2i target at 6.
"""
from functools import cache

import pytest
import torch
from torch._dynamo.utils import counters

from lantern.engine.decoding import compiled
from lantern.engine.decoding.generate import cfg_rows, decode_step, generate, prefill
from lantern.engine.decoding.sampling import SamplingParams
from lantern.errors import UserError
from tiny import gens, tiny_target


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One thread, as tiny.one_thread: tiny models only lose to OpenMP on a busy 2-core machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)

MODES = {"greedy": dict(greedy=True), "sampling": dict(temperature=1.0, top_k=12, top_p=0.95)}


@cache
def target(model_type="c2i", seed=0):
    """scale 3: next-token distributions spread enough that sampling takes many different paths."""
    return tiny_target(model_type, scale=3.0, seed=seed)


def both(model, cond, params, n, **kw):
    eager, _ = generate(model, cond, params, gens(n, seed=3), **kw)
    comp, stats = generate(model, cond, params, gens(n, seed=3), compile=True, **kw)
    assert stats[0].target_forwards == model.args.image_tokens and stats[0].batch_size == n
    return eager, comp


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("B,cfg", [(1, 1.0), (1, 2.0), (3, 1.0), (3, 2.0)])
def test_compiled_c2i_gives_eager_tokens(B, cfg, mode):
    params = SamplingParams(cfg_scale=cfg, **MODES[mode])
    eager, comp = both(target(), torch.tensor([2, 0, 3])[:B], params, B)
    assert torch.equal(eager, comp)


@pytest.mark.parametrize("mode", MODES)
def test_compiled_t2i_with_caption_mask_gives_eager_tokens(mode):
    torch.manual_seed(1)
    cond = torch.randn(3, 5, 12)
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]], dtype=torch.bool)
    params = SamplingParams(cfg_scale=3.0, cfg_interval=6, **MODES[mode])
    eager, comp = both(target("t2i"), cond, params, 3, cond_mask=mask)
    assert torch.equal(eager, comp)
    # the mask matters, so the compiled step really reads the caption's key mask
    assert not torch.equal(comp, generate(target("t2i"), cond, params, gens(3, seed=3), compile=True)[0])


def test_one_graph_per_shape_and_kept_cache_restarts_clean():
    """A second model of the same shape and repeated batches reuse the graphs (no recompilation); the kept KV cache,
    dirty from earlier batches, gives the tokens of a fresh one."""
    params = SamplingParams(cfg_scale=2.0, temperature=1.0)
    cond = torch.tensor([1, 3, 0])
    generate(target(), cond, params, gens(3), compile=True)  # compiled (or already compiled above)
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 1  # the step really compiled (no silent fallback to eager)
    other = target(seed=5)
    for model in (target(), other, target()):
        want, _ = generate(model, cond, params, gens(3))
        got, _ = generate(model, cond, params, gens(3), compile=True)
        assert torch.equal(want, got)
    assert counters["stats"]["unique_graphs"] == graphs


def test_compiled_step_logits_match_eager():
    """The compiled step's logits, position by position on the same cache: equal up to fused-kernel rounding."""
    params = SamplingParams(cfg_scale=2.0)
    model, cond = target(), torch.tensor([0, 1, 2])
    rows, _ = cfg_rows(model, cond, params)
    step = compiled.compiled_step(decode_step, "cpu")
    T, worst = model.args.cls_token_num, 0.0
    with torch.no_grad():
        compiled.setup_static_cache(model, rows.shape[0])
        prefill(model, rows)
        token = torch.tensor([4, 5, 6] * 2)
        for i in range(model.args.image_tokens - 1):
            pos = torch.tensor([T + i])
            want, want_h = decode_step(model, token, pos)
            got, got_h = step(model, token, pos)  # rewrites the slot eager just wrote, with its own k, v
            worst = max(worst, (got - want).abs().max().item())
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(got_h, want_h, rtol=1e-5, atol=1e-5)
            token = want[: len(cond)].argmax(-1).repeat(2)
        model.clear_cache()
    print(f"max |compiled - eager| logit difference: {worst:.3g}")


def test_resolve():
    assert compiled.resolve("auto", "cpu") is False and compiled.resolve(None, "cuda") is True
    assert compiled.resolve(True, "cpu") is True and compiled.resolve(False, "cuda") is False
    with pytest.raises(UserError, match="compile"):
        compiled.resolve("yes", "cpu")

