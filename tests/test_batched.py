"""Batched chain speculative decoding (speculative.decode, engine/decoding/rounds.py): every image decodes as it
would alone (same tokens, rounds and stats as in a batch of one), per-row positions in the model, and exactness in
distribution."""
import copy

import pytest
import torch

from lantern.engine import methods
from lantern.engine.rules.acceptance import AcceptRule
from lantern.engine.decoding.chain import Chain
from lantern.engine.models.drafter import AUTHORS_LLAMAGEN, Drafter, DrafterOptions
from lantern.engine.models.model import causal_mask
from lantern.engine.decoding.sampling import SamplingParams, image_generator
from lantern.engine.decoding.speculative import decode
from lantern.errors import UserError
from tiny import assert_same_decodes, one_by_one, ragged_t2i, chi_square_pvalue, exact_joint, gens, one_thread, tiny_target, trained  # noqa: F401 (fixtures)

pytestmark = pytest.mark.usefixtures("one_thread")

# each code's neighbours: the next codes, cyclically
TABLE = torch.stack([torch.roll(torch.arange(16), -i)[1:] for i in range(16)])
RULES = {
    "exact": AcceptRule(),
    "lantern": AcceptRule("lantern", delta=0.3, k=10),
    "lanternpp": AcceptRule("lanternpp", lam=5.0, k=10, residual="reference"),
    "coolsd": methods.rule(methods.normalize({"name": "coolsd", "drafting": "chain", "scale": 2.0, "nu": 0.5})),
}


@pytest.fixture(scope="module")
def f64(trained):
    """The trained tiny pair in float64: batched and one-by-one matmuls then round to the same fp32 logits."""
    target, drafter = copy.deepcopy(trained)
    return target.double(), drafter.double()


def check_same(target, drafter, cond, params, rule, gamma=4, cond_mask=None, seed=0):
    """Batched == one by one: tokens, rounds and stats of every image; returns the batched stats."""
    B = cond.shape[0]
    want, want_stats = one_by_one(target, drafter, cond, params, rule, Chain(gamma), gens(B, seed), TABLE, cond_mask)
    got, stats = decode(target, drafter, cond, params, rule, Chain(gamma), gens(B, seed), TABLE, cond_mask)
    assert_same_decodes(got, stats, want, want_stats, target.args.image_tokens)
    return stats


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("greedy, cfg", [(True, 1.0), (True, 3.0), (False, 1.0), (False, 3.0)])
def test_batched_equals_one_by_one(f64, rule, greedy, cfg):
    target, drafter = f64
    check_same(target, drafter, torch.arange(5) % 4, SamplingParams(cfg_scale=cfg, greedy=greedy), RULES[rule])


@pytest.mark.parametrize("B, gamma", [(1, 4), (3, 3), (5, 6)])
def test_ragged_rounds(f64, B, gamma):
    """Images accept different lengths each round and finish in different rounds; gamma 6 does not divide the
    15 tokens after the prefill, so images near their end draft fewer tokens than the others. cfg_interval makes
    each position's distribution depend on its own image-token index."""
    target, drafter = f64
    params = SamplingParams(cfg_scale=2.0, cfg_interval=4, top_k=8, top_p=0.95)
    stats = check_same(target, drafter, torch.arange(B) % 4, params, RULES["lantern"], gamma, seed=3)
    if B > 1:
        assert len({len(s.accepted_per_step) for s in stats}) > 1
        assert len({tuple(s.tree_depth) for s in stats}) > 1
    assert all(s.target_forwards == 1 + len(s.accepted_per_step) for s in stats)


@pytest.mark.parametrize("options", [DrafterOptions(), AUTHORS_LLAMAGEN], ids=["ours", "authors"])
@pytest.mark.parametrize("greedy", [True, False])
def test_t2i_ragged_caption_masks(options, greedy):
    target, drafter, cond, mask = ragged_t2i(options)
    for rule in ("exact", "lantern"):
        check_same(target, drafter, cond, SamplingParams(cfg_scale=2.0, greedy=greedy), RULES[rule], cond_mask=mask)


def test_forward_rows_match_one_row_at_a_time():
    """Per-row positions (t2i, ragged caption masks): rows at different positions in one pass of the target or the
    drafter compute what each computes alone, and rows left out of the pass keep their caches."""
    target = tiny_target("t2i").double()
    drafter = Drafter.from_target(target).eval().double()
    torch.nn.init.normal_(drafter.layer.attention.wqkv.weight, std=0.4)  # attention that matters
    T, L = 5, target.args.max_seq_len
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 1, 1]], dtype=torch.bool)
    cond = target.embed_cond(torch.randn(3, T, 12, dtype=torch.float64))
    x = target.embed_tokens(torch.randint(16, (3, 6)))
    d_in = torch.cat([drafter.cond_inputs(cond), drafter.embed_tokens(torch.randint(16, (3, 7)))], 1)
    d_h = torch.randn(3, T + 6, 32, dtype=torch.float64)

    def fill(rows):  # both caches over the caption and the first 3 image positions of `rows`
        target.setup_cache(len(rows))
        target.set_cond_mask(mask[rows])
        pos = torch.arange(T + 3)
        target.forward_cached(torch.cat([cond[rows], x[rows, :3]], 1), pos, pos, causal_mask(T + 3, L, x.device))
        drafter.setup_cache(len(rows), cond_mask=mask[rows])
        drafter.step(d_in[rows, : T + 3], d_h[rows, : T + 3], 0)

    starts = {0: T + 3, 2: T + 1}  # row 2 rewrites its positions T + 1, T + 2 (a rejected draft's slots)
    alone = {}
    for b, s in starts.items():
        fill([b])
        pos = torch.arange(s, s + 3)
        logits, _ = target.forward_cached(x[b : b + 1, 3:], pos, pos, causal_mask(3, L, x.device, s))
        alone[b] = logits[0], drafter.step(d_in[b : b + 1, s : s + 3], d_h[b : b + 1, s : s + 3], s)[0]
    fill([0, 1, 2])
    caches = [target.layers[0].attention.kv_cache, drafter.layer.attention.kv_cache]
    row1 = [c.k[1].clone() for c in caches]
    pos = torch.stack([torch.arange(s, s + 3) for s in starts.values()])
    visible = torch.arange(L) <= pos[..., None]
    rows = torch.tensor([0, 2])
    logits, _ = target.forward_rows(x[rows, 3:], pos, pos, visible, rows)
    pred = drafter.forward_rows(torch.stack([d_in[b, s : s + 3] for b, s in starts.items()]),
                                torch.stack([d_h[b, s : s + 3] for b, s in starts.items()]), pos, pos, visible, rows)
    for i, b in enumerate(starts):
        assert torch.allclose(logits[i], alone[b][0], atol=1e-10) and torch.allclose(pred[i], alone[b][1], atol=1e-10)
    assert all(torch.equal(c.k[1], k) for c, k in zip(caches, row1))
    target.clear_cache()
    drafter.clear_cache()


def test_batched_exact_sampling_reproduces_the_target_distribution():
    V, N, n, B = 3, 4, 700, 35
    target = tiny_target(scale=4.0, vocab_size=V, image_tokens=N, num_classes=2)
    drafter = Drafter.from_target(target).eval()
    torch.nn.init.normal_(drafter.fc.weight, std=0.3)  # a poor drafter: plenty of rejections too
    params = SamplingParams(cfg_scale=2.0, top_k=2)
    seqs, joint = exact_joint(target, 1, params, V, N)
    index = {tuple(s): i for i, s in enumerate(seqs.tolist())}
    counts = torch.zeros(len(seqs), dtype=torch.float64)
    accepted = rejected = 0
    for first in range(0, n, B):
        tokens, stats = decode(target, drafter, torch.ones(B, dtype=torch.long), params,
                                                     AcceptRule(), Chain(3),
                                                     [image_generator(12, i) for i in range(first, first + B)])
        for t, s in zip(tokens.tolist(), stats):
            counts[index[tuple(t)]] += 1
            accepted += s.accepted_total
            rejected += sum(a < 3 for a in s.accepted_per_step)
    assert accepted > n / 6 and rejected > n / 6
    assert chi_square_pvalue(joint, counts, n) > 1e-3


def test_bad_calls(f64):
    target, drafter = f64
    with pytest.raises(ValueError, match="one generator per image"):
        decode(target, drafter, torch.arange(3), SamplingParams(), AcceptRule(), Chain(4), gens(2))
    with pytest.raises(UserError, match="neighbour table"):
        decode(target, drafter, torch.arange(2), SamplingParams(), RULES["lantern"], Chain(4),
                                     gens(2))
