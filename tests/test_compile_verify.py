"""The speculative verify step with static shapes (rounds.target_forward, compile=True), and the chain's drafting
(chain_rounds.chain_drafts): every batched decoder at a fixed width over every image's rows gives the tokens of
one-by-one decoding, eager (the padding alone, float64) and through torch.compile (inductor on CPU), and one graph
serves every round of every batch of a shape."""
import pytest
import torch
from torch._dynamo.utils import counters

from lantern.engine.decoding import compiled, rounds
from lantern.engine.decoding.chain import Chain
from lantern.engine.decoding.jacobi import Jacobi
from lantern.engine.decoding.jacobi_tree import ProactiveJacobi
from lantern.engine.decoding.sampling import SamplingParams
from lantern.engine.decoding.speculative import decode
from test_batched import RULES, TABLE
from test_batched_jacobi import RULES as JACOBI_RULES
from test_tree_walk import RULES as WALK_RULES
from test_batched_trees import TREES, f64  # noqa: F401 (fixture)
from tiny import assert_same_decodes, gens, one_by_one as by_one, one_thread, ragged_t2i, tiny_target, trained  # noqa: F401 (fixtures)

pytestmark = pytest.mark.usefixtures("one_thread")

KINDS = {"chain": Chain(4), **TREES}
ALL_RULES = {**WALK_RULES, **RULES, **JACOBI_RULES}


@pytest.fixture
def static_eager(monkeypatch):
    """compile=True's static shapes without inductor: the padding and the kept cache alone, checked exactly."""
    monkeypatch.setattr(compiled, "compiled_step", lambda fn, device: fn)


def one_by_one(target, drafter, cond, params, rule, kind, seed=0, cond_mask=None):
    return by_one(target, drafter, cond, params, rule, kind, gens(cond.shape[0], seed), TABLE, cond_mask)


def static(target, drafter, cond, params, rule, kind, seed=0, cond_mask=None):
    return decode(target, drafter, cond, params, rule, kind, gens(cond.shape[0], seed), TABLE, cond_mask, compile=True)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rule", ["exact", "lantern", "lanternpp", "lanternpp-lumina", "coolsd", "gsd", "lanterntv"])
@pytest.mark.parametrize("B, greedy", [(1, False), (3, True), (5, False)])
def test_static_width_equals_one_by_one(f64, static_eager, kind, rule, B, greedy):
    """Finished images stay in the pass as padding rows; short drafts near an image's end pad to the width."""
    target, drafter = f64
    params = SamplingParams(cfg_scale=2.0, cfg_interval=4, greedy=greedy, top_k=8)
    rule = ALL_RULES[rule]
    want, want_stats = one_by_one(target, drafter, torch.arange(B) % 4, params, rule, KINDS[kind], seed=3)
    got, stats = static(target, drafter, torch.arange(B) % 4, params, rule, KINDS[kind], seed=3)
    assert_same_decodes(got, stats, want, want_stats, target.args.image_tokens)


@pytest.mark.parametrize("window", [1, 6])
@pytest.mark.parametrize("rule", ["exact", "gsd", "coolsd"])
@pytest.mark.parametrize("greedy", [False, True])
def test_static_width_jacobi_equals_one_by_one(static_eager, window, rule, greedy):
    """jacobi_graph.jacobi_round at its fixed width, finished images as padding, uniform for uniform."""
    target = tiny_target(scale=8.0).double()
    params = SamplingParams(cfg_scale=2.0, cfg_interval=4, greedy=greedy)
    rule = ALL_RULES[rule]
    want, want_stats = one_by_one(target, None, torch.arange(4) % 4, params, rule, Jacobi(window))
    got, stats = static(target, None, torch.arange(4) % 4, params, rule, Jacobi(window))
    assert_same_decodes(got, stats, want, want_stats, target.args.image_tokens)


def test_static_width_t2i_ragged_caption_masks(static_eager):
    """The kept cache's key mask: left-padded captions, reused across two batches without leaking."""
    from lantern.engine.models.drafter import DrafterOptions

    target, drafter, cond, mask = ragged_t2i(DrafterOptions())
    params = SamplingParams(cfg_scale=2.0)
    for rule, kind in (("exact", Chain(3)), ("lantern", Chain(3)), ("lantern", Jacobi(4))):
        d = None if isinstance(kind, Jacobi) else drafter
        want, want_stats = one_by_one(target, d, cond, params, RULES[rule], kind, cond_mask=mask)
        got, stats = static(target, d, cond, params, RULES[rule], kind, cond_mask=mask)
        assert_same_decodes(got, stats, want, want_stats, target.args.image_tokens)


def test_width_beyond_budget_is_refused(f64):
    target, drafter = f64
    target.setup_cache(2, extra=1)
    x = torch.zeros(2, 4, dtype=torch.long)
    pos, slots, visible = rounds.ragged(torch.tensor([1]), torch.tensor([4]), 4, 2, target.cache_len)
    with pytest.raises(ValueError, match="exceeds the static width 3"):
        rounds.target_forward(target, None, x, pos, slots, visible, width=3)
    target.clear_cache()


@pytest.mark.parametrize("kind, rule", [("chain", "lantern"), ("twin_chain_8", "lantern"), ("dynamic", "lantern"),
                                        ("jacobi", "lantern"), ("jacobi", "gsd"), ("chain", "coolsd"),
                                        ("chain", "lanterntv"), ("small", "gsd"), ("jacobi-maximal", "exact"),
                                        ("jacobi-gumbel", "lantern")])
def test_compiled_verify_gives_eager_tokens(trained, kind, rule):
    """Inductor's compiled rounds (float32) against the eager batched decoder: the same tokens and rounds; each
    kind compiles once, and a second batch of the same shape reuses the graph."""
    target, drafter = trained
    rule, params = ALL_RULES[rule], SamplingParams(cfg_scale=2.0, top_k=8)
    k = Jacobi(6, *kind.split("-")[1:]) if kind.startswith("jacobi") else KINDS[kind]  # jacobi-<coupling>
    cond = torch.tensor([0, 3, 1])
    before = counters["stats"]["unique_graphs"]
    for seed in (0, 1):
        d = None if isinstance(k, Jacobi) else drafter
        want, want_stats = decode(target, d, cond, params, rule, k, gens(3, seed), TABLE)
        got, stats = static(target, drafter, cond, params, rule, k, seed)
        assert_same_decodes(got, stats, want, want_stats, target.args.image_tokens)
        if seed == 0:
            graphs = counters["stats"]["unique_graphs"]
            assert graphs > before  # the verify step really compiled (no silent fallback to eager)
    assert counters["stats"]["unique_graphs"] == graphs


@pytest.mark.parametrize("kind, rule, steps", [
    ("chain", "exact", {"chain_round"}), ("chain", "lantern", {"chain_round"}), ("chain", "coolsd", {"chain_round"}),
    ("chain", "lanterntv", {"chain_round"}), ("small", "lanternpp", {"tree_round"}), ("small", "coolsd", {"tree_round"}),
    ("dynamic", "lanterntv", {"tree_round"}), ("jacobi", "exact", {"jacobi_round"}),
    ("jacobi", "coolsd", {"jacobi_round"}), ("proactive", "coolsd", {"jacobi_tree_round"}),
    ("proactive", "lanterntv", {"jacobi_tree_round"})])
def test_rounds_go_through_compiled_steps(f64, monkeypatch, kind, rule, steps):
    """compile=True runs a chain's, a tree's, a Jacobi or proactive iteration's whole round (drafting, verify,
    acceptance, commit) as one compiled call (chain_graph.chain_round, tree_graph.tree_round,
    jacobi_graph.jacobi_round, jacobi_tree_graph.jacobi_tree_round) under every rule of the registry."""
    asked = []
    monkeypatch.setattr(compiled, "compiled_step", lambda fn, device: asked.append(fn.__name__) or fn)
    target, drafter = f64
    drafting = {"chain": Chain(3), "jacobi": Jacobi(4), "proactive": ProactiveJacobi(4, "maximal", 3, 2)}.get(kind)
    drafting = drafting or KINDS[kind]
    static(target, drafter, torch.arange(3) % 4, SamplingParams(cfg_scale=2.0), ALL_RULES[rule], drafting)
    assert set(asked) == steps


def test_kept_drafter_cache_is_the_same_buffers_in_a_fresh_state():
    """compiled.setup_static_cache on a drafter: the second batch reuses the first's tensors (fixed addresses for
    CUDA graphs), zeroed, with the new batch's caption mask and nothing of the old one."""
    from lantern.engine.models.drafter import DrafterOptions

    _, drafter, _, mask = ragged_t2i(DrafterOptions())
    rows = torch.cat([mask, mask])
    compiled.setup_static_cache(drafter, 8, extra=2, cond_mask=rows)
    cache, key_valid = drafter.layer.attention.kv_cache, drafter.cache_key_valid
    cache.k.fill_(1.0)
    compiled.setup_static_cache(drafter, 8, extra=2, cond_mask=rows.flip(0))
    assert drafter.layer.attention.kv_cache is cache and drafter.cache_key_valid is key_valid
    assert not cache.k.any()
    kept = drafter.cache_key_valid.clone()
    drafter.setup_cache(8, extra=2, cond_mask=rows.flip(0))
    assert torch.equal(kept, drafter.cache_key_valid)
    assert not kept.all()  # the mask really hides padded caption positions
    drafter.clear_cache()


def test_compiled_draws_run_atens_cumsum_and_equal_eager_draws():
    """Inside a compiled graph the CDFs (the draw's float64 one, top-p's) are one opaque op running ATen's cumsum:
    inductor's split scan of 8 x 16384 float64 rows failed to generate code on CUDA (torch 2.11). Draws through
    inductor equal eager draws."""
    from lantern.engine.decoding.sampling import draw, logits_to_probs

    params = SamplingParams(top_p=0.9)
    fn = lambda logits, u: draw(logits_to_probs(logits, params), u)  # noqa: E731
    graphs = []
    capture = lambda gm, inputs: graphs.append(gm) or gm.forward  # noqa: E731
    logits = torch.randn(8, 16384, generator=torch.Generator().manual_seed(0)) * 3
    u = torch.rand(8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    torch.compile(fn, backend=capture, fullgraph=True)(logits, u)
    ops = [node.target for gm in graphs for node in gm.graph.nodes if node.op == "call_function"]
    assert ops.count(torch.ops.lantern.cumsum_last.default) == 2
    assert torch.ops.aten.cumsum.default not in ops and torch.cumsum not in ops
    assert torch.equal(torch.compile(fn, fullgraph=True, dynamic=False)(logits, u), fn(logits, u))
