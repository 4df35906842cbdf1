"""SJD-PAC's proactive tree under a forced-token layout (engine/decoding/jacobi_tree.py with `layout`;
docs/chameleon-layout.md): the candidate tree holds codes, every node at a depth whose code ends a row gets an eol
child in the verify (forced_trees.splice), and a node's children read its eol's row. On the tiny GPT with
test_layout.py's 3 x 4 + eol toy layout: greedy gives greedy AR's codes, a batch decodes as one image at a time
(eager, with the compiled verify, as compiled rounds with and without the layout), and exact sampling emits the
authors' joint law of a 2 x 2 + eol layout (chi-square), which two broken variants do not."""
import pytest
import torch

from torch._dynamo.utils import counters

from lantern.engine.decoding import compiled, jacobi_tree, kinds, tree_rounds
from lantern.engine.decoding.generate import generate
from lantern.engine.decoding.jacobi_tree import JacobiTreeRounds, ProactiveJacobi, eol_bound, eol_nodes
from lantern.engine.decoding.jacobi_tree_graph import GraphJacobiTreeRounds
from lantern.engine.decoding.kinds import layout_refusal, rounds_for
from lantern.engine.decoding.sampling import SamplingParams, image_generator
from lantern.engine.decoding.speculative import decode
from lantern.engine.models.layout import Layout
from lantern.engine.rules.acceptance import AcceptRule
from test_compile_verify import ALL_RULES
from test_layout_jacobi import RULES, TABLE, TABLE16, TOY, authors_joint
from tiny import assert_same_decodes, chi_square_pvalue, gens, one_thread, tiny_target  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")
COUPLINGS = ("independent", "maximal", "gumbel")


@pytest.fixture(scope="module")
def f64():
    return tiny_target(scale=3.0).double()


def test_eol_nodes_and_their_bound():
    """K 3, D 2, window 4, rows of 4: a row end at depth 2 puts an eol after its 9 nodes, one at depth 0 after y
    and one at depth 4 after the window's last node; the bound is the worst alignment's count."""
    assert eol_nodes(3, 2, 4, 4, (2,), "cpu").tolist() == [1, *range(6, 14)]  # node 1: the window's
    assert eol_nodes(3, 2, 4, 4, (0, 4), "cpu").tolist() == [-1, 3]
    assert eol_bound(3, 2, 4, TOY) == 9 and eol_bound(3, 2, 12, TOY) == 11  # depth 2, 6, 10
    assert eol_bound(3, 2, 4, Layout("plain", 3, 4, code_offset=0, codebook=15, vocab=16)) == 0
    assert layout_refusal(ProactiveJacobi(4)) is None
    assert "exceed the 3 image codes" in layout_refusal(ProactiveJacobi(4, proactive=4), codebook=3)


@pytest.mark.parametrize("cfg", [1.0, 3.0])
def test_greedy_proactive_with_a_layout_gives_greedy_ar(f64, cfg):
    """Greedy proactive iterations over the codes give greedy AR's codes, every coupling; windows of 6 and 12 and a
    tree of depth 4 cross row ends in the tree's full levels and in the window's chain."""
    params = SamplingParams(cfg_scale=cfg, greedy=True)
    cond = torch.arange(5) % 4
    want, _ = generate(f64, cond, params, gens(5), layout=TOY)
    for window, K, D in ((1, 2, 1), (3, 3, 2), (6, 3, 2), (12, 2, 3), (4, 3, 4)):
        for c in COUPLINGS:
            got, stats = decode(f64, None, cond, params, AcceptRule(), ProactiveJacobi(window, c, K, D), gens(5),
                                layout=TOY)
            assert torch.equal(got, want) and got.shape == (5, 12)
            assert all(s.target_forwards == 1 + len(s.accepted_per_step) for s in stats)
            assert all(1 + sum(a + 1 for a in s.accepted_per_step) in (12, 13) for s in stats)


@pytest.mark.parametrize("rule", ["exact", "lantern"])
@pytest.mark.parametrize("coupling", COUPLINGS)
@pytest.mark.parametrize("compile", [False, True])
def test_sampled_proactive_with_a_layout_batch_equals_one_by_one(f64, monkeypatch, rule, coupling, compile):
    """Each image of a batch gets the codes, iterations and stats it gets alone (float64): ragged windows and trees
    that cross row ends at different depths; compile=True with a rule that had no compiled round would run the
    eager rounds with the verify at its static width (1 + window + tree nodes + eol bound; inductor left out)."""
    monkeypatch.setattr(compiled, "compiled_step", lambda fn, device: fn)
    monkeypatch.setattr(kinds, "graph_capturable", lambda rule: False)
    params = SamplingParams(cfg_scale=2.0, cfg_interval=4, top_k=10)
    cond, kind = torch.arange(6) % 4, ProactiveJacobi(5, coupling, 3, 2)
    assert type(rounds_for(kind, f64, None, params, RULES[rule], TABLE, 6, compile, TOY)) is JacobiTreeRounds
    got, stats = decode(f64, None, cond, params, RULES[rule], kind, gens(6, 2), TABLE, compile=compile, layout=TOY)
    alone = [decode(f64, None, cond[i : i + 1], params, RULES[rule], kind, gens(6, 2)[i : i + 1], TABLE,
                    layout=TOY) for i in range(6)]
    assert_same_decodes(got, stats, torch.cat([t for t, _ in alone]), [s for _, (s,) in alone], 12)
    assert got.max() < 15 and len({tuple(s.accepted_per_step) for s in stats}) > 1


@pytest.mark.parametrize("rule", ["exact", "gsd", "lantern", "coolsd", "lanterntv"])
@pytest.mark.parametrize("coupling", COUPLINGS)
@pytest.mark.parametrize("greedy, window, K, D", [(False, 1, 2, 1), (False, 5, 3, 2), (True, 5, 3, 2),
                                                  (False, 12, 2, 3)])
def test_compiled_proactive_rounds_equal_eager(f64, monkeypatch, rule, coupling, greedy, window, K, D):
    """compile=True runs each iteration as jacobi_tree_graph.jacobi_tree_round (static shapes, finished images as
    padding; inductor left out): the codes and stats of the eager rounds one by one, with and without the layout."""
    monkeypatch.setattr(compiled, "compiled_step", lambda fn, device: fn)
    params = SamplingParams(cfg_scale=2.0, cfg_interval=4, greedy=greedy, top_k=10)
    kind, rule, cond = ProactiveJacobi(window, coupling, K, D), {**ALL_RULES, **RULES}[rule], torch.arange(4)
    assert type(rounds_for(kind, f64, None, params, rule, TABLE, 4, True, TOY)) is GraphJacobiTreeRounds
    for layout, table, n in ((None, TABLE16, 16), (TOY, TABLE, 12)):
        want = [decode(f64, None, cond[i : i + 1], params, rule, kind, gens(4, 3)[i : i + 1], table, layout=layout)
                for i in range(4)]
        got, stats = decode(f64, None, cond, params, rule, kind, gens(4, 3), table, compile=True, layout=layout)
        assert_same_decodes(got, stats, torch.cat([t for t, _ in want]), [s for _, (s,) in want], n)


@pytest.mark.slow
def test_inductor_compiled_proactive_rounds_give_eager_codes():
    """Through inductor (float32), under the layout: the eager rounds' codes and iterations, and a graph compiled."""
    target = tiny_target(scale=3.0)
    params, rule, kind = SamplingParams(cfg_scale=2.0, top_k=10), RULES["lantern"], ProactiveJacobi(5, "maximal", 3, 2)
    cond = torch.tensor([0, 3, 1])
    before = counters["stats"]["unique_graphs"]
    want, want_stats = decode(target, None, cond, params, rule, kind, gens(3), TABLE, layout=TOY)
    got, stats = decode(target, None, cond, params, rule, kind, gens(3), TABLE, compile=True, layout=TOY)
    assert counters["stats"]["unique_graphs"] > before  # really compiled, no silent fallback to eager
    assert_same_decodes(got, stats, want, want_stats, 12)


TOY2 = Layout("toy2", 2, 2, eol=3, code_offset=0, codebook=3, vocab=4)


def joint_pvalue(coupling, K, D, monkeypatch, n=3000, B=100):
    """Exact proactive iterations (window 3) over the 2 x 2 + eol layout (codes 0..2, eol 3): the chi-square p-value
    of n images against the authors' joint law of the four codes, and the fraction of iterations that committed a
    sibling (a node off the window's path)."""
    target = tiny_target(scale=4.0, vocab_size=4, image_tokens=9, num_classes=2)
    params = SamplingParams(cfg_scale=2.0)
    codes, joint = authors_joint(target, TOY2, params, 1)
    index = {tuple(c): i for i, c in enumerate(codes.tolist())}
    counts, off = torch.zeros(len(codes), dtype=torch.float64), []
    walk = jacobi_tree.walk

    def spy(P, q, X, *rest):
        out = walk(P, q, X, *rest)
        off.append(((out[0] >= 0) & (out[0] != torch.arange(out[0].shape[1]))).any(-1))
        return out

    monkeypatch.setattr(jacobi_tree, "walk", spy)
    for first in range(0, n, B):
        got, _ = decode(target, None, torch.ones(B, dtype=torch.long), params, AcceptRule(),
                        ProactiveJacobi(3, coupling, K, D), [image_generator(12, i) for i in range(first, first + B)],
                        layout=TOY2)
        for c in got.tolist():
            counts[index[tuple(c)]] += 1
    return chi_square_pvalue(joint, counts, n), torch.cat(off).double().mean().item()


@pytest.mark.parametrize("coupling, K, D", [("independent", 3, 2), ("maximal", 2, 2), ("gumbel", 3, 1),
                                            ("gumbel", 2, 2)])
def test_exact_proactive_with_a_layout_reproduces_the_authors_distribution(monkeypatch, coupling, K, D):
    """Every window crosses the row end: at depth 1 or 2 of the tree, or after y (3000 images; p 0.79, 0.65, 0.73,
    0.90; siblings committed in 21-39 % of the iterations). K 3 = the codebook: every code is a candidate."""
    p_value, off_window = joint_pvalue(coupling, K, D, monkeypatch)
    assert off_window > 0.05  # siblings were committed, not only the window's tokens
    assert p_value > 1e-3


def test_broken_variants_fail_the_same_test(monkeypatch):
    """Sampled candidates rejected with the residual of deterministic drafts (p without x, q's mass left in): p 1e-10;
    the eol fed but a node's children read at the node's own row instead of its eol's: p 1e-89."""
    exact = tree_rounds.residual_rows
    with monkeypatch.context() as m:
        m.setattr(tree_rounds, "residual_rows", lambda p, q, x, n, table, rule: exact(p, None, x, n, table, rule))
        assert joint_pvalue("independent", 3, 2, m)[0] < 1e-6
    own_rows = jacobi_tree.code_logits
    monkeypatch.setattr(jacobi_tree, "code_logits",
                        lambda layout, logits, row: own_rows(layout, logits, torch.arange(row.shape[1]).expand_as(row)))
    assert joint_pvalue("independent", 3, 2, monkeypatch)[0] < 1e-6
