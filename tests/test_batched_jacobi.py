"""Batched speculative Jacobi decoding (engine/decoding/jacobi.py, speculative.decode): every image decodes as it
would alone (same tokens, iterations and stats as in a batch of one), and exactness in distribution."""
import pytest
import torch

from lantern.engine import methods
from lantern.engine.rules.acceptance import AcceptRule
from lantern.engine.decoding.jacobi import Jacobi
from lantern.engine.decoding.speculative import decode
from lantern.engine.decoding.sampling import SamplingParams, image_generator
from lantern.errors import UserError
from test_batched import TABLE
from tiny import assert_same_decodes, one_by_one, chi_square_pvalue, exact_joint, gens, one_thread, tiny_target

pytestmark = pytest.mark.usefixtures(one_thread.__name__)

RULES = {
    "exact": AcceptRule(),
    "gsd": methods.rule(methods.normalize({"name": "gsd", "drafting": "jacobi", "group": 6, "k": 5, "gap": 0.5})),
}


@pytest.fixture(scope="module")
def f64():
    """A tiny c2i target in float64 (batched and one-by-one matmuls then round to the same fp32 probabilities);
    scale 8: peaked enough that Jacobi guesses are often accepted, flat enough that images differ."""
    return tiny_target(scale=8.0).double()


def check_same(target, cond, params, rule, window, cond_mask=None, seed=0):
    """Batched == one by one: tokens, iterations and stats of every image; returns the batched stats."""
    B = cond.shape[0]
    want, want_stats = one_by_one(target, None, cond, params, rule, Jacobi(window), gens(B, seed), TABLE, cond_mask)
    got, stats = decode(target, None, cond, params, rule, Jacobi(window), gens(B, seed), TABLE, cond_mask)
    assert_same_decodes(got, stats, want, want_stats, target.args.image_tokens)
    return stats


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("greedy, cfg", [(True, 1.0), (True, 3.0), (False, 1.0), (False, 3.0)])
def test_batched_equals_one_by_one(f64, rule, greedy, cfg):
    check_same(f64, torch.arange(5) % 4, SamplingParams(cfg_scale=cfg, greedy=greedy), RULES[rule], 4)


@pytest.mark.parametrize("B", [1, 3, 5])
@pytest.mark.parametrize("window", [1, 4, 16])
def test_ragged_iterations(f64, B, window):
    """Images accept different lengths each iteration and finish in different iterations; windows shrink near an
    image's end, so the forward pads the shorter windows. cfg_interval makes each position's distribution depend
    on its own image-token index."""
    params = SamplingParams(cfg_scale=2.0, cfg_interval=4, top_k=8, top_p=0.95)
    stats = check_same(f64, torch.arange(B) % 4, params, RULES["gsd"], window, seed=3)
    if B > 1 and window > 1:
        assert len({len(s.accepted_per_step) for s in stats}) > 1
    assert all(s.target_forwards == 1 + len(s.accepted_per_step) for s in stats)
    assert all(d <= window for s in stats for d in s.tree_depth)


@pytest.mark.parametrize("greedy", [True, False])
def test_t2i_ragged_caption_masks(greedy):
    target = tiny_target("t2i", scale=8.0).double()
    cond = torch.randn(4, 5, 12, dtype=torch.float64)
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1], [0, 1, 1, 1, 1]], dtype=torch.bool)
    for rule in RULES:
        check_same(target, cond, SamplingParams(cfg_scale=2.0, greedy=greedy), RULES[rule], 4, cond_mask=mask)


# as tests/test_jacobi.py: scale 30 is peaked enough that a wrong draft distribution q fails at p ~ 1e-36
@pytest.mark.parametrize("cfg, top_k, window, scale", [(2.0, 2, 2, 30.0), (1.0, 0, 3, 4.0)])
def test_batched_exact_sampling_reproduces_the_target_distribution(cfg, top_k, window, scale):
    V, N, n, B = 3, 4, 700, 35
    target = tiny_target(scale=scale, vocab_size=V, image_tokens=N, num_classes=2)
    params = SamplingParams(cfg_scale=cfg, top_k=top_k)
    seqs, joint = exact_joint(target, 1, params, V, N)
    index = {tuple(s): i for i, s in enumerate(seqs.tolist())}
    counts = torch.zeros(len(seqs), dtype=torch.float64)
    accepted = rejected = 0
    for first in range(0, n, B):
        tokens, stats = decode(target, None, torch.ones(B, dtype=torch.long), params, AcceptRule(),
                                                Jacobi(window), [image_generator(13, i) for i in range(first, first + B)])
        for t, s in zip(tokens.tolist(), stats):
            counts[index[tuple(t)]] += 1
            accepted += s.accepted_total
            rejected += sum(a < d for a, d in zip(s.accepted_per_step, s.tree_depth))
    assert accepted > n / 6 and rejected > n / 20  # both paths ran often
    assert chi_square_pvalue(joint, counts, n) > 1e-3


def test_bad_calls(f64):
    with pytest.raises(ValueError, match="one generator per image"):
        decode(f64, None, torch.arange(3), SamplingParams(), AcceptRule(), Jacobi(4), gens(2))
    with pytest.raises(UserError, match="neighbour table"):
        decode(f64, None, torch.arange(2), SamplingParams(), RULES["gsd"], Jacobi(4), gens(2))
