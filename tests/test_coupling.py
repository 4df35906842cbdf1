"""Coupled Jacobi re-drafts (engine/decoding/coupling.py: SCD's maximal and Gumbel couplings, the maximal one being
SJD-PAC's adaptive continuation): exact in distribution by chi-square against exact enumeration, and a deliberately
broken variant of each fails the same test; greedy == greedy AR; a batch == one by one; the registry's `coupling`."""
import pytest
import torch

from lantern.engine import methods
from lantern.engine.decoding import coupling, jacobi
from lantern.engine.decoding.generate import generate
from lantern.engine.decoding.jacobi import Jacobi, JacobiRounds
from lantern.engine.decoding.jacobi_graph import GraphJacobiRounds
from lantern.engine.decoding.kinds import rounds_for
from lantern.engine.decoding.sampling import SamplingParams, draw, image_generator
from lantern.engine.decoding.speculative import decode
from lantern.engine.rules.acceptance import AcceptRule
from lantern.errors import UserError
from test_batched import TABLE
from tiny import assert_same_decodes, chi_square_pvalue, exact_joint, gens, one_by_one, one_thread, tiny_target

pytestmark = pytest.mark.usefixtures(one_thread.__name__)


def broken_maximal(P, q, x, u):
    """The maximal coupling without its residual correction: a rejected token is redrawn from P itself, so the
    kept-or-redrawn token is no longer distributed as P (the q it carries)."""
    px, qx = P.gather(-1, x[..., None])[..., 0].double(), q.gather(-1, x[..., None])[..., 0].double()
    A = (px / qx).clamp(max=1.0)
    return torch.where(u < A, x, draw(P, ((u - A) / (1.0 - A)).clamp(0.0, 1.0)))


def shared_noise(generator, positions, V, device):
    """Gumbel noise reused across positions (one vector for the whole image) instead of one per position."""
    return coupling.gumbel_noise(generator, 1, V, device).expand(positions, V)


@pytest.mark.parametrize("fn, ok", [(coupling.maximal, True), (broken_maximal, False)])
def test_maximal_coupling_law(fn, ok):
    """x ~ q coupled to P: the output is distributed as P and keeps x with probability 1 - TV(q, P)."""
    g = torch.Generator().manual_seed(0)
    n, V = 20000, 4
    P, q = torch.tensor([0.55, 0.3, 0.15, 0.0]), torch.tensor([0.1, 0.2, 0.3, 0.4])
    x = draw(q.expand(n, V), torch.rand(n, generator=g, dtype=torch.float64))
    y = fn(P.expand(n, V), q.expand(n, V), x, torch.rand(n, generator=g, dtype=torch.float64))
    p_value = chi_square_pvalue(P.double(), torch.bincount(y, minlength=V).double(), n)
    if ok:
        tv = 0.5 * (P - q).abs().sum().item()
        assert p_value > 1e-3 and abs((y == x).double().mean().item() - (1 - tv)) < 0.015
    else:
        assert p_value < 1e-6


def joint_pvalue(c, scale, top_k, cfg, seed, window, n, B=50):
    """Chi-square p-value of n images (V 3, N 4, decoded in batches of B) against the exact joint, and the
    fraction of iterations that ended in a rejection before the window's end (the coupled path ran)."""
    V, N = 3, 4
    target = tiny_target(scale=scale, vocab_size=V, image_tokens=N, num_classes=2, seed=seed)
    params = SamplingParams(cfg_scale=cfg, top_k=top_k)
    seqs, joint = exact_joint(target, 1, params, V, N)
    index = {tuple(s): i for i, s in enumerate(seqs.tolist())}
    counts = torch.zeros(len(seqs), dtype=torch.float64)
    rejected = iterations = 0
    for first in range(0, n, B):
        tokens, stats = decode(target, None, torch.ones(B, dtype=torch.long), params, AcceptRule(), Jacobi(window, c),
                               [image_generator(17, i) for i in range(first, first + B)])
        for t, s in zip(tokens.tolist(), stats):
            counts[index[tuple(t)]] += 1
            rejected += sum(a + 1 < d for a, d in zip(s.accepted_per_step, s.tree_depth))
            iterations += len(s.accepted_per_step)
    return chi_square_pvalue(joint, counts, n), rejected / iterations


# (scale, top_k, cfg, seed, window, images): the maximal coupling's error shows only where a position's distribution
# moves little when the token before it changes, so its case is one such tiny target (at 6000 images the broken
# variant gives p 2e-13, the coupling 0.82); the Gumbel cases are those of tests/test_jacobi.py
CASES = {
    "maximal": [(15.0, 0, 1.0, 1, 3, 6000)],
    "gumbel": [(15.0, 0, 1.0, 1, 3, 3000), (30.0, 2, 2.0, 0, 2, 1000), (4.0, 0, 1.0, 0, 3, 1000)],
}


@pytest.mark.parametrize("c, case", [(c, case) for c in CASES for case in CASES[c]])
def test_coupled_sampling_reproduces_the_target_distribution(c, case):
    p_value, rejected = joint_pvalue(c, *case)
    assert rejected > 0.05  # iterations with coupled re-drafts after a rejection
    assert p_value > 1e-3


@pytest.mark.parametrize("c, case", [("maximal", CASES["maximal"][0]), ("gumbel", CASES["gumbel"][1])])
def test_broken_couplings_fail_the_same_test(monkeypatch, c, case):
    if c == "maximal":
        monkeypatch.setattr(jacobi, "maximal", broken_maximal)
    else:
        monkeypatch.setattr(jacobi, "gumbel_noise", shared_noise)
    p_value, _ = joint_pvalue(c, *case)
    assert p_value < 1e-5


@pytest.mark.parametrize("c", ["maximal", "gumbel"])
@pytest.mark.parametrize("cfg", [1.0, 3.0])
def test_greedy_coupled_jacobi_equals_greedy_ar(c, cfg):
    target = tiny_target()
    params = SamplingParams(cfg_scale=cfg, greedy=True)
    cond = torch.arange(4)
    ar, _ = generate(target, cond, params, gens(4))
    for window in (1, 3, 8):
        tokens, _ = decode(target, None, cond, params, AcceptRule(), Jacobi(window, c), gens(4))
        assert torch.equal(tokens, ar)


@pytest.fixture(scope="module")
def f64():
    return tiny_target(scale=8.0).double()


@pytest.mark.parametrize("c", ["maximal", "gumbel"])
@pytest.mark.parametrize("greedy, window", [(True, 4), (False, 1), (False, 4), (False, 16)])
def test_batched_equals_one_by_one(f64, c, greedy, window):
    """Ragged windows, images finishing in different iterations, a relaxed rule: every image decodes as alone."""
    params = SamplingParams(cfg_scale=2.0, cfg_interval=4, top_k=8, greedy=greedy)
    rule = AcceptRule("lantern", delta=0.2, k=5)
    cond = torch.arange(5) % 4
    want, want_stats = one_by_one(f64, None, cond, params, rule, Jacobi(window, c), gens(5, 3), TABLE)
    got, stats = decode(f64, None, cond, params, rule, Jacobi(window, c), gens(5, 3), TABLE)
    assert_same_decodes(got, stats, want, want_stats, f64.args.image_tokens)


@pytest.mark.parametrize("c", ["maximal", "gumbel"])
def test_t2i_ragged_caption_masks(c):
    target = tiny_target("t2i", scale=8.0).double()
    cond = torch.randn(3, 5, 12, dtype=torch.float64)
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]], dtype=torch.bool)
    params = SamplingParams(cfg_scale=2.0)
    want, want_stats = one_by_one(target, None, cond, params, AcceptRule(), Jacobi(4, c), gens(3), None, mask)
    got, stats = decode(target, None, cond, params, AcceptRule(), Jacobi(4, c), gens(3), None, mask)
    assert_same_decodes(got, stats, want, want_stats, target.args.image_tokens)


def test_coupling_changes_the_draws_not_the_seeding():
    """Each coupling is its own iteration (different tokens from SJD's on most images), deterministic per image."""
    target = tiny_target(scale=8.0)
    cond, params = torch.arange(4), SamplingParams(cfg_scale=2.0)
    out = {c: decode(target, None, cond, params, AcceptRule(), Jacobi(6, c), gens(4))[0] for c in coupling.COUPLINGS}
    again = decode(target, None, cond, params, AcceptRule(), Jacobi(6, "gumbel"), gens(4))[0]
    assert torch.equal(out["gumbel"], again)
    assert not torch.equal(out["independent"], out["maximal"]) and not torch.equal(out["independent"], out["gumbel"])


@pytest.mark.parametrize("c", ["maximal", "gumbel"])
@pytest.mark.parametrize("greedy, window", [(False, 1), (False, 6), (True, 6)])
def test_compiled_rounds_equal_eager(monkeypatch, c, greedy, window):
    """compile=True runs a coupled iteration as jacobi_graph.jacobi_round (its fixed width, finished images as
    padding; inductor left out, as tests/test_compile_verify.py's static_eager): the tokens of one by one."""
    from lantern.engine.decoding import compiled

    monkeypatch.setattr(compiled, "compiled_step", lambda fn, device: fn)
    target = tiny_target(scale=8.0).double()
    params = SamplingParams(cfg_scale=2.0, cfg_interval=4, greedy=greedy)
    assert type(rounds_for(Jacobi(window, c), target, None, params, AcceptRule(), None, 4, True)) is GraphJacobiRounds
    rule = AcceptRule("lantern", delta=0.2, k=5)
    want, want_stats = one_by_one(target, None, torch.arange(4), params, rule, Jacobi(window, c), gens(4, 3), TABLE)
    got, stats = decode(target, None, torch.arange(4), params, rule, Jacobi(window, c), gens(4, 3), TABLE,
                        compile=True)
    assert_same_decodes(got, stats, want, want_stats, target.args.image_tokens)
    assert type(rounds_for(Jacobi(window, c), target, None, params, rule, TABLE, 4)) is JacobiRounds


def test_the_registry_knows_the_couplings():
    base = {"name": "exact", "drafting": "jacobi", "window": 16}
    assert methods.point_name(methods.normalize(base)) == "exact-jacobi-w16"
    assert methods.point_name(methods.normalize({**base, "coupling": "independent"})) == "exact-jacobi-w16"
    assert methods.point_name(methods.normalize({**base, "coupling": "maximal"})) == "exact-jacobi-w16-maximal"
    assert methods.drafting(methods.normalize({**base, "coupling": "gumbel"})) == Jacobi(16, "gumbel")
    points = methods.expand([{**base, "coupling": ["independent", "maximal", "gumbel"]}], seed=0)
    assert list(points) == ["exact-jacobi-w16", "exact-jacobi-w16-maximal", "exact-jacobi-w16-gumbel"]
    assert "coupling" in methods.spec_columns() and "maximal" in methods.describe()
    with pytest.raises(UserError, match="coupling = 'max' is not allowed; use one of independent, maximal, gumbel"):
        methods.normalize({**base, "coupling": "max"})
    with pytest.raises(UserError, match="coupling does not apply to exact with chain drafting"):
        methods.normalize({"name": "exact", "drafting": "chain", "coupling": "maximal"})
    with pytest.raises(UserError, match="coupling"):
        Jacobi(4, "maximum")
