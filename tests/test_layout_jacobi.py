"""Jacobi windows under a forced-token layout (engine/decoding/jacobi.py, jacobi_graph.py with `layout`;
docs/chameleon-layout.md): the window holds codes, the verify forward carries the end-of-line tokens between them,
P is read at each code's predicting row. On the tiny GPT with test_layout.py's 3 x 4 + eol toy layout: greedy
windows give greedy AR's codes, a batch decodes as one image at a time, compiled rounds as eager ones, and exact
sampling emits the authors' joint law of a 2 x 2 + eol layout (chi-square)."""
import itertools

import pytest
import torch
from torch._dynamo.utils import counters

from lantern.engine import methods
from lantern.engine.decoding import compiled
from lantern.engine.decoding.coupling import COUPLINGS
from lantern.engine.decoding.forced import code_logits, verify_rows, verify_width
from lantern.engine.decoding.generate import generate
from lantern.engine.decoding.jacobi import Jacobi, JacobiRounds
from lantern.engine.decoding.jacobi_graph import GraphJacobiRounds
from lantern.engine.decoding.kinds import rounds_for
from lantern.engine.decoding.sampling import SamplingParams, image_generator, logits_to_probs, mix_cfg
from lantern.engine.decoding.speculative import decode
from lantern.engine.models.layout import Layout, code_steps, codes_to_ids, image_logits
from lantern.engine.rules.acceptance import AcceptRule
from tiny import assert_same_decodes, chi_square_pvalue, gens, one_by_one, one_thread, tiny_target  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")

TOY = Layout("toy", 3, 4, eol=15, code_offset=0, codebook=15, vocab=16)  # test_layout.py's: 15 steps in 16 positions
TABLE = torch.stack([torch.roll(torch.arange(15), -i)[1:] for i in range(15)])  # a neighbour table over codes 0 .. 14
TABLE16 = torch.stack([torch.roll(torch.arange(16), -i)[1:] for i in range(16)])  # over the tiny GPT's 16 tokens
RULES = {
    "exact": AcceptRule(),
    "gsd": methods.rule(methods.normalize({"name": "gsd", "drafting": "jacobi", "group": 6, "k": 5, "gap": 0.5})),
    "lantern": AcceptRule("lantern", delta=0.1, k=3),  # relaxed, yet not accepting every window
}


@pytest.fixture(scope="module")
def f64():
    """The tiny GPT in float64 (batched and one-by-one forwards then give the same probabilities); scale 3: flat
    enough that images differ and windows are often rejected."""
    return tiny_target(scale=3.0).double()


@pytest.fixture
def static_eager(monkeypatch):
    """compile=True's rounds (jacobi_graph.jacobi_round at its static width) without inductor, checked exactly."""
    monkeypatch.setattr(compiled, "compiled_step", lambda fn, device: fn)


def test_verify_rows_on_the_device_and_the_static_width():
    """verify_rows of device tensors (compiled rounds) is the host ints' count, and verify_width bounds it for every
    image position and window; a layout without eol verifies G + 1 rows, as without a layout."""
    for W in (1, 3, 4, 5, 12):
        d = torch.arange(1, TOY.codes)
        g = (TOY.codes - d).clamp(max=W)
        host = [verify_rows(TOY, i, k) for i, k in zip(d.tolist(), g.tolist())]
        assert verify_rows(TOY, d, g).tolist() == host
        assert max(host) <= verify_width(TOY, W)
        if W < 6:  # reached inside the grid: the width is no larger than a round needs
            assert max(host) == verify_width(TOY, W)
    plain = Layout("plain", 3, 4, code_offset=0, codebook=15, vocab=16)
    assert verify_width(plain, 5) == 6 and verify_rows(plain, 2, 5) == 6


def test_code_logits_reads_each_codes_predicting_row():
    """Codes 4 .. 7 after y = code 3 (a row's last): the eol sits at slot 0, so code 4 is predicted by row 1 (the
    eol's), code 5 by row 2; slots past the forward read its last row."""
    from lantern.engine.decoding.forced import slot_geometry

    _, code_slot, _ = slot_geometry(TOY, torch.tensor([4, 1]), 3)
    logits = torch.arange(2 * 2 * 5 * 16, dtype=torch.float64).view(4, 5, 16)  # R = 2 rows of 2 images, 5 rows
    got = code_logits(TOY, logits, code_slot)
    assert got.shape == (4, 4, 15)
    assert torch.equal(got[0], image_logits(TOY, logits[0, [1, 2, 3, 4]]))
    assert torch.equal(got[3], image_logits(TOY, logits[3, [0, 1, 2, 4]]))  # image 1, uncond rows: y = code 0


@pytest.mark.parametrize("window", [1, 3, 6, 12])
@pytest.mark.parametrize("cfg", [1.0, 3.0])
def test_greedy_jacobi_with_a_layout_gives_greedy_ar(f64, window, cfg):
    """Greedy windows over the codes, eol spliced into the verify, give greedy AR's codes (generate with the
    layout); windows of 6 and 12 cross row ends every iteration. Every coupling is greedy Jacobi decoding."""
    params = SamplingParams(cfg_scale=cfg, greedy=True)
    cond = torch.arange(5) % 4
    want, _ = generate(f64, cond, params, gens(5), layout=TOY)
    for c in COUPLINGS:
        got, stats = decode(f64, None, cond, params, AcceptRule(), Jacobi(window, c), gens(5), layout=TOY)
        assert torch.equal(got, want) and got.shape == (5, 12)
        assert all(s.n_tokens == 12 and s.drafter_forwards == 0 for s in stats)
        assert all(s.target_forwards == 1 + len(s.accepted_per_step) for s in stats)
        assert all(1 + sum(a + 1 for a in s.accepted_per_step) in (12, 13) for s in stats)
    if window > 1:
        assert sum(s.accepted_total for s in stats) > 0  # guesses were accepted: more than a code per forward


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("coupling", COUPLINGS)
def test_sampled_jacobi_with_a_layout_batch_equals_one_by_one(f64, rule, coupling):
    """Each image of a batch gets the codes, iterations and stats it gets alone (float64), every rule and coupling;
    images accept different lengths, so windows are ragged and cross row ends at different slots."""
    params = SamplingParams(cfg_scale=2.0, cfg_interval=4, top_k=10)
    cond = torch.arange(6) % 4
    kind = Jacobi(5, coupling)
    got, stats = decode(f64, None, cond, params, RULES[rule], kind, gens(6, 2), TABLE, layout=TOY)
    alone = [decode(f64, None, cond[i : i + 1], params, RULES[rule], kind, gens(6, 2)[i : i + 1], TABLE,
                    layout=TOY) for i in range(6)]
    assert_same_decodes(got, stats, torch.cat([t for t, _ in alone]), [s for _, (s,) in alone], 12)
    assert got.max() < 15 and len({tuple(s.accepted_per_step) for s in stats}) > 1


@pytest.mark.parametrize("rule", ["exact", "gsd", "lantern"])
@pytest.mark.parametrize("coupling", COUPLINGS)
@pytest.mark.parametrize("greedy, window", [(False, 1), (False, 5), (True, 5), (False, 12)])
def test_compiled_jacobi_with_a_layout_equals_eager(f64, static_eager, rule, coupling, greedy, window):
    """compile=True runs the iterations under the layout as jacobi_graph.jacobi_round (static width
    forced.verify_width, finished images as padding): the codes and stats of the eager rounds one by one."""
    params = SamplingParams(cfg_scale=2.0, cfg_interval=4, greedy=greedy, top_k=10)
    kind, rule = Jacobi(window, coupling), RULES[rule]
    assert type(rounds_for(kind, f64, None, params, rule, TABLE, 4, True, TOY)) is GraphJacobiRounds
    assert type(rounds_for(kind, f64, None, params, rule, TABLE, 4, False, TOY)) is JacobiRounds
    cond = torch.arange(4)
    want, _ = one_by_one(f64, None, cond, params, rule, kind, gens(4, 3), TABLE16)  # without the layout:
    got, _ = decode(f64, None, cond, params, rule, kind, gens(4, 3), TABLE16, compile=True)  # 16 tokens, as now
    assert torch.equal(got, want) and got.shape == (4, 16)
    want = [decode(f64, None, cond[i : i + 1], params, rule, kind, gens(4, 3)[i : i + 1], TABLE, layout=TOY)
            for i in range(4)]
    got, stats = decode(f64, None, cond, params, rule, kind, gens(4, 3), TABLE, compile=True, layout=TOY)
    assert_same_decodes(got, stats, torch.cat([t for t, _ in want]), [s for _, (s,) in want], 12)


def test_inductor_compiled_jacobi_with_a_layout_gives_eager_codes():
    """Through inductor (float32): the same codes and iterations as the eager rounds, and the round compiled."""
    target = tiny_target(scale=3.0)
    params, rule, kind = SamplingParams(cfg_scale=2.0, top_k=10), RULES["lantern"], Jacobi(5, "maximal")
    cond = torch.tensor([0, 3, 1])
    before = counters["stats"]["unique_graphs"]
    want, want_stats = decode(target, None, cond, params, rule, kind, gens(3), TABLE, layout=TOY)
    got, stats = decode(target, None, cond, params, rule, kind, gens(3), TABLE, compile=True, layout=TOY)
    assert counters["stats"]["unique_graphs"] > before  # really compiled, no silent fallback to eager
    assert_same_decodes(got, stats, want, want_stats, 12)


def authors_joint(target, layout, params, label):
    """The law of the authors' sequence over a layout's code grids: one teacher-forced pass over every grid's ids
    with the forced tokens in place, each code's distribution read at its step over the image head."""
    codes = torch.tensor(list(itertools.product(range(layout.codebook), repeat=layout.codes)))
    ids, n = codes_to_ids(layout, codes), len(codes)
    with torch.no_grad():
        logits, _ = target(torch.cat([torch.full((n,), label), torch.full((n,), target.args.num_classes)]),
                           torch.cat([ids, ids])[:, :-1])
    steps = code_steps(layout, torch.arange(layout.codes)).tolist()
    probs = torch.stack([logits_to_probs(image_logits(layout, mix_cfg(logits[:, s], params, j)), params)
                         for j, s in enumerate(steps)], 1)
    return codes, probs.gather(2, codes[:, :, None])[:, :, 0].double().prod(1)


@pytest.mark.parametrize("coupling", COUPLINGS)
def test_exact_jacobi_with_a_layout_reproduces_the_authors_distribution(coupling):
    """Exact Jacobi windows of 3 over a 2 x 2 layout with an eol (codes 0..2, eol 3; every window crosses the row
    end) emit the authors' joint law of the four codes (chi-square over the 81 grids, 700 images), every coupling."""
    layout = Layout("toy2", 2, 2, eol=3, code_offset=0, codebook=3, vocab=4)
    target = tiny_target(scale=4.0, vocab_size=4, image_tokens=9, num_classes=2)
    params = SamplingParams(cfg_scale=2.0, top_k=2)
    codes, joint = authors_joint(target, layout, params, 1)
    index = {tuple(c): i for i, c in enumerate(codes.tolist())}
    counts = torch.zeros(len(codes), dtype=torch.float64)
    n, B, accepted, rejected = 700, 35, 0, 0
    for first in range(0, n, B):
        got, stats = decode(target, None, torch.ones(B, dtype=torch.long), params, AcceptRule(), Jacobi(3, coupling),
                            [image_generator(12, i) for i in range(first, first + B)], layout=layout)
        for c, s in zip(got.tolist(), stats):
            counts[index[tuple(c)]] += 1
            accepted += s.accepted_total
            rejected += sum(a < d for a, d in zip(s.accepted_per_step, s.tree_depth))
    assert accepted > n / 6 and rejected > n / 6  # guesses were accepted and rejected often
    assert chi_square_pvalue(joint, counts, n) > 1e-3
