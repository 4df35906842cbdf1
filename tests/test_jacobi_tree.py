"""SJD-PAC's proactive drafting (engine/decoding/jacobi_tree.py): K candidates at the first D window positions of a
Jacobi iteration, verified as a tree in one forward. One position's law is the target's and a broken sibling draw
fails that test; decoding reproduces the target's joint law by chi-square against exact enumeration under every
coupling; greedy == greedy AR; a batch == one by one; compiled verify == eager; the registry's keys."""
import pytest
import torch

from lantern.engine import methods
from lantern.engine.decoding import jacobi_tree
from lantern.engine.decoding.generate import generate
from lantern.engine.decoding.jacobi import Jacobi
from lantern.engine.decoding.jacobi_tree import JacobiTreeRounds, ProactiveJacobi, build_shape, siblings
from lantern.engine.decoding.kinds import rounds_for
from lantern.engine.decoding.sampling import SamplingParams, draw, image_generator
from lantern.engine.decoding.speculative import decode
from lantern.engine.decoding.tree_rounds import walk
from lantern.engine.models.layout import Layout
from lantern.engine.rules.acceptance import AcceptRule
from lantern.errors import UserError
from test_batched import TABLE
from tiny import assert_same_decodes, chi_square_pvalue, exact_joint, gens, one_by_one, one_thread, tiny_target

pytestmark = pytest.mark.usefixtures(one_thread.__name__)


def with_replacement(q, x, K, u):
    """Broken siblings: drawn from q itself, with replacement (x and earlier siblings not removed), while the walk
    residualises q as for draws without replacement."""
    return torch.stack([draw(q, u[:, j]) for j in range(K - 1)], 1), torch.ones_like(u, dtype=torch.bool)


def one_position(sibling_fn, n=20000, K=3):
    """The token committed at one tree level: x ~ q, its K - 1 siblings, jacobi_tree's walk (tree_rounds.walk) over
    them, the correction from the residual. Returns (chi-square p-value against p, how often a sibling won)."""
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.5, 0.3, 0.2, 0.0], dtype=torch.float64)
    q = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    V = len(p)
    u = lambda k: torch.rand(n, k, generator=g, dtype=torch.float64)  # noqa: E731
    x = draw(q.expand(n, V), u(1)[:, 0])
    sib, ok = sibling_fn(q.expand(n, V), x, K, u(K - 1))
    X = torch.cat([x[:, None], sib], 1)
    kids = torch.full((n, 1 + K, K), -1)
    kids[:, 0] = torch.arange(K)
    path, residual, used = walk(p.expand(n, 1 + K, V), q.expand(n, 1, V), X,
                                torch.cat([torch.ones(n, 1, dtype=torch.bool), ok], 1), kids,
                                torch.zeros(n, 1 + K, dtype=torch.long), u(K + 1), None, AcceptRule(), 1)
    token = torch.where(path[:, 0] >= 0, X.gather(1, path.clamp(min=0))[:, 0], draw(residual, u(1)[:, 0]))
    return chi_square_pvalue(p, torch.bincount(token, minlength=V).double(), n), (path[:, 0] > 0).double().mean().item()


def test_one_level_is_multi_candidate_speculative_sampling():
    p_value, sibling_won = one_position(siblings)
    assert p_value > 1e-3 and sibling_won > 0.2
    p_value, _ = one_position(with_replacement)
    assert p_value < 1e-10  # 1e-36 at 20000


def joint_pvalue(scale, top_k, cfg, seed, window, K, D, coupling, n, monkeypatch, V=3, B=100):
    """Chi-square p-value of n images (V, N 4, decoded in batches of B) against the exact joint, and the fraction
    of iterations whose accepted path left the window's first-ranked path (a sibling was committed)."""
    target = tiny_target(scale=scale, vocab_size=V, image_tokens=4, num_classes=2, seed=seed)
    params = SamplingParams(cfg_scale=cfg, top_k=top_k)
    seqs, joint = exact_joint(target, 1, params, V, 4)
    index = {tuple(s): i for i, s in enumerate(seqs.tolist())}
    counts = torch.zeros(len(seqs), dtype=torch.float64)
    paths = []

    def spy(P, q, X, *rest):
        out = walk(P, q, X, *rest)
        paths.append(((out[0] >= 0) & (out[0] != torch.arange(out[0].shape[1]))).any(-1))
        return out

    monkeypatch.setattr(jacobi_tree, "walk", spy)
    for first in range(0, n, B):
        tokens, _ = decode(target, None, torch.ones(B, dtype=torch.long), params, AcceptRule(),
                           ProactiveJacobi(window, coupling, K, D),
                           [image_generator(17, i) for i in range(first, first + B)])
        for t in tokens.tolist():
            counts[index[tuple(t)]] += 1
    return chi_square_pvalue(joint, counts, n), torch.cat(paths).double().mean().item()


# (scale, top_k, cfg, seed, window, K, D, coupling, images): K = V exhausts the vocabulary at the tree's levels,
# K < V leaves the correction its residual; scale 30 with top-k 2 is tests/test_jacobi.py's peaked case
CASES = [
    (15.0, 0, 1.0, 1, 3, 3, 2, "independent", 3000),
    (30.0, 2, 2.0, 0, 2, 2, 1, "independent", 2000),
    (3.0, 0, 1.0, 1, 2, 2, 2, "independent", 3000),
    (4.0, 0, 1.0, 0, 3, 3, 2, "maximal", 2000),
    (15.0, 0, 1.0, 1, 3, 2, 2, "gumbel", 2000),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[7]}-K{c[5]}-D{c[6]}-w{c[4]}" for c in CASES])
def test_proactive_sampling_reproduces_the_target_distribution(monkeypatch, case):
    p_value, off_window = joint_pvalue(*case, monkeypatch)
    assert off_window > 0.05  # siblings were committed, not only the window's tokens
    assert p_value > 1e-3


@pytest.mark.parametrize("case", [CASES[0], CASES[1], CASES[4]], ids=["K3", "K2-peaked", "gumbel"])
def test_the_deterministic_residual_fails_the_same_test(monkeypatch, case):
    """Sampled candidates rejected with the residual of deterministic drafts (p without x, q's mass left in)."""
    from lantern.engine.decoding import tree_rounds

    exact = tree_rounds.residual_rows
    monkeypatch.setattr(tree_rounds, "residual_rows", lambda p, q, x, m, table, rule: exact(p, None, x, m, table, rule))
    p_value, _ = joint_pvalue(*case, monkeypatch)
    assert p_value < 1e-5  # 1e-27, 4e-14, 3e-7


@pytest.mark.parametrize("coupling", ["independent", "maximal", "gumbel"])
@pytest.mark.parametrize("cfg", [1.0, 3.0])
def test_greedy_proactive_jacobi_equals_greedy_ar(coupling, cfg):
    target = tiny_target()
    params = SamplingParams(cfg_scale=cfg, greedy=True)
    cond = torch.arange(4)
    ar, _ = generate(target, cond, params, gens(4))
    for window, K, D in ((1, 2, 1), (3, 3, 2), (8, 4, 2), (5, 2, 3)):
        tokens, _ = decode(target, None, cond, params, AcceptRule(), ProactiveJacobi(window, coupling, K, D), gens(4))
        assert torch.equal(tokens, ar)


@pytest.fixture(scope="module")
def f64():
    return tiny_target(scale=8.0).double()


@pytest.mark.parametrize("coupling", ["independent", "maximal", "gumbel"])
@pytest.mark.parametrize("greedy, window", [(True, 4), (False, 1), (False, 4), (False, 16)])
def test_batched_equals_one_by_one(f64, coupling, greedy, window):
    """Ragged windows and trees cut near the image's end, images finishing in different iterations, a relaxed rule:
    every image decodes as alone."""
    params = SamplingParams(cfg_scale=2.0, cfg_interval=4, top_k=8, greedy=greedy)
    rule = AcceptRule("lantern", delta=0.2, k=5)
    cond, drafting = torch.arange(5) % 4, ProactiveJacobi(window, coupling, 3, min(2, window))
    want, want_stats = one_by_one(f64, None, cond, params, rule, drafting, gens(5, 3), TABLE)
    got, stats = decode(f64, None, cond, params, rule, drafting, gens(5, 3), TABLE)
    assert_same_decodes(got, stats, want, want_stats, f64.args.image_tokens)


@pytest.mark.parametrize("drafting, seed", [(ProactiveJacobi(16, "independent", 3, 2), 5),
                                            (ProactiveJacobi(12, "maximal", 2, 1), 8)])
def test_cache_moves_beside_images_near_their_end(drafting, seed):
    """A sibling's cache entry moved while another image's window is cut near its end: the moves stay inside the
    cache (these seeds once indexed past it) and every image decodes as alone."""
    target, params = tiny_target(scale=2.0).double(), SamplingParams(cfg_scale=2.0)
    cond = torch.arange(6) % 4
    want, want_stats = one_by_one(target, None, cond, params, AcceptRule(), drafting, gens(6, seed))
    got, stats = decode(target, None, cond, params, AcceptRule(), drafting, gens(6, seed))
    assert_same_decodes(got, stats, want, want_stats, target.args.image_tokens)


def test_t2i_ragged_caption_masks():
    target = tiny_target("t2i", scale=8.0).double()
    cond = torch.randn(3, 5, 12, dtype=torch.float64)
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]], dtype=torch.bool)
    params, drafting = SamplingParams(cfg_scale=2.0), ProactiveJacobi(4, "maximal", 3, 2)
    want, want_stats = one_by_one(target, None, cond, params, AcceptRule(), drafting, gens(3), None, mask)
    got, stats = decode(target, None, cond, params, AcceptRule(), drafting, gens(3), None, mask)
    assert_same_decodes(got, stats, want, want_stats, target.args.image_tokens)


def test_the_tree_changes_the_iteration_and_its_tau():
    """Another iteration than SJD's (other tokens), deterministic per image, accounting for every token, and more
    tokens per forward on a tiny target."""
    target = tiny_target(scale=8.0)
    cond, params = torch.arange(8) % 4, SamplingParams(cfg_scale=2.0)
    sjd, sjd_stats = decode(target, None, cond, params, AcceptRule(), Jacobi(6), gens(8))
    pac, stats = decode(target, None, cond, params, AcceptRule(), ProactiveJacobi(6, "independent", 4, 2), gens(8))
    again, _ = decode(target, None, cond, params, AcceptRule(), ProactiveJacobi(6, "independent", 4, 2), gens(8))
    assert torch.equal(pac, again) and not torch.equal(pac, sjd)
    for s in stats:
        assert s.drafter_forwards == 0 and s.target_forwards == 1 + len(s.accepted_per_step)
        assert 1 + sum(a + 1 for a in s.accepted_per_step) in (16, 17)
        assert all(0 <= a <= d <= 6 for a, d in zip(s.accepted_per_step, s.tree_depth))
    assert sum(s.target_forwards for s in stats) < sum(s.target_forwards for s in sjd_stats)


@pytest.mark.parametrize("greedy", [False, True])
def test_compiled_verify_equals_eager(monkeypatch, greedy):
    """compile=True with a rule that had no compiled round would keep the eager rounds and run the verify at the
    static width window + tree nodes + 1 (inductor left out, as tests/test_compile_verify.py's static_eager);
    tests/test_layout_jacobi_tree.py checks the compiled rounds (jacobi_tree_graph.py)."""
    from lantern.engine.decoding import kinds

    from lantern.engine.decoding import compiled

    monkeypatch.setattr(compiled, "compiled_step", lambda fn, device: fn)
    monkeypatch.setattr(kinds, "graph_capturable", lambda rule: False)
    target = tiny_target(scale=8.0).double()
    params, drafting = SamplingParams(cfg_scale=2.0, cfg_interval=4, greedy=greedy), ProactiveJacobi(5, "gumbel", 3, 2)
    assert type(rounds_for(drafting, target, None, params, AcceptRule(), None, 4, True)) is JacobiTreeRounds
    want, want_stats = one_by_one(target, None, torch.arange(4), params, AcceptRule(), drafting, gens(4, 3))
    got, stats = decode(target, None, torch.arange(4), params, AcceptRule(), drafting, gens(4, 3), compile=True)
    assert_same_decodes(got, stats, want, want_stats, target.args.image_tokens)


def test_shape_of_the_tree():
    """K 3, D 2, window 4: the window, then 2 siblings at depth 1 and 3 x 3 - 1 nodes at depth 2; cut at L 1."""
    s = build_shape(3, 2, 4, 4, "cpu")
    assert s.size == 1 + 4 + 2 + 8 and s.depth.tolist()[:6] == [1, 2, 3, 4, 1, 1]
    assert s.kids[0].tolist() == [0, 4, 5] and s.kids[1].tolist() == [1, 6, 7] and s.kids[5].tolist() == [8, 9, 10]
    assert s.cont[0].tolist() == [0, 1, 2, 3, 4] and s.cont[5].tolist() == [0, 5, 9, 3, 4]  # below sibling 4: 8
    assert build_shape(3, 2, 4, 1, "cpu").size == 1 + 1 + 2


def test_the_registry_knows_proactive_drafting():
    base = {"name": "exact", "drafting": "jacobi", "window": 16}
    spec = methods.normalize({**base, "coupling": "maximal", "proactive": 4})
    assert methods.point_name(spec) == "exact-jacobi-w16-maximal-pk4-pd2"
    assert methods.drafting(spec) == ProactiveJacobi(16, "maximal", 4, 2) and methods.drafting(spec).nodes == 16 + 18
    assert methods.normalize(methods.from_row({**spec, "seed": 0})) == spec  # a table row round-trips
    assert methods.point_name(methods.normalize({**base, "proactive": 1})) == "exact-jacobi-w16"
    points = methods.expand([{**base, "window": [8, 16], "proactive": 3, "proactive_depth": 1}], seed=0)
    assert list(points) == ["exact-jacobi-w8-pk3-pd1", "exact-jacobi-w16-pk3-pd1"]
    assert {"proactive", "proactive_depth"} <= set(methods.spec_columns()) and "proactive" in methods.describe()
    with pytest.raises(UserError, match="proactive_depth does not apply to exact with jacobi drafting"):
        methods.normalize({**base, "proactive_depth": 2})
    with pytest.raises(UserError, match="proactive does not apply to exact with chain drafting"):
        methods.normalize({"name": "exact", "drafting": "chain", "proactive": 2})
    with pytest.raises(UserError, match="proactive_depth = 3 exceeds window = 2"):
        methods.normalize({**base, "window": 2, "proactive": 2, "proactive_depth": 3})
    with pytest.raises(UserError, match="4680 tree nodes per forward"):
        methods.normalize({**base, "proactive": 8, "proactive_depth": 4})
    with pytest.raises(UserError, match=r"proactive = 0 must be >= 1"):
        methods.normalize({**base, "proactive": 0})
    with pytest.raises(UserError, match="proactive=1 must be an integer >= 2"):
        ProactiveJacobi(4, "independent", 1, 1)


def test_refused_where_not_built():
    target = tiny_target(vocab_size=3, image_tokens=4)
    with pytest.raises(UserError, match="proactive=4 candidates per position exceed the vocabulary of 3"):
        decode(target, None, torch.ones(1, dtype=torch.long), SamplingParams(), AcceptRule(),
               ProactiveJacobi(2, "independent", 4, 1), gens(1))
    layout = Layout("toy", 3, 4, eol=15, code_offset=0, codebook=3, vocab=16)
    with pytest.raises(UserError, match="layout toy .*proactive=4 candidates per position exceed the 3 image codes"):
        rounds_for(ProactiveJacobi(4), target, None, SamplingParams(), AcceptRule(), None, 1, layout=layout)
