"""The entropy-aware acceptance rule (engine/rules/peers.py EntropyRule, name: entropy) on tiny vocabularies: its
per-step distance from the target by exact enumeration against the bound it keeps, a wrong-sign variant caught,
exactness at beta 0, the batched residual, greedy, and decoding under every drafting kind."""

import pytest
import torch

from lantern.engine import methods
from lantern.engine.decoding.chain import Chain
from lantern.engine.decoding.jacobi import Jacobi
from lantern.engine.decoding.sampling import SamplingParams
from lantern.engine.decoding.speculative import decode
from lantern.engine.decoding.trees import DynamicTree, static_tree
from lantern.engine.models.drafter import Drafter
from lantern.engine.rules.acceptance import AcceptRule, accept_probability, greedy_accept, residual, residual_rows
from lantern.engine.rules.peers import EntropyRule
from lantern.errors import UserError
from test_acceptance import F64, emitted_chain, rand_dist, tv
from tiny import gens, one_thread, tiny_target  # noqa: F401 (fixture)


def ent(beta, impl=EntropyRule):
    return AcceptRule("entropy", impl=impl(beta))


class WrongSign(EntropyRule):
    """Deliberately broken: the entropy scaling's sign flipped (stricter where the target is uncertain)."""

    def weight(self, p):
        return 1.0 / super().weight(p)


def pairs(n=24, V=8):
    """(p, q) pairs from peaked to flat targets, the same on every call (rand_dist's Dirichlet reads the global
    generator: seeded here, inside a fork that leaves it as it was)."""
    g = torch.Generator().manual_seed(1)
    out = []
    with torch.random.fork_rng():
        torch.manual_seed(1)
        for i in range(n):
            p = rand_dist(g, V, alpha=[0.05, 0.3, 2.0, 20.0][i % 4], zeros=i % 3)
            out.append((p, rand_dist(g, V, zeros=(i + 1) % 2)))
    return out


def keeps_its_guarantee(rule) -> bool:
    """Per step, by enumeration: the emitted distribution is one, never accepts less than exact SD, and its TV from
    p stays within min(w - 1, TV(p, q)), w = exp(beta H(p) / log V); some pair moves (it is not exact)."""
    moved = False
    for p, q in pairs():
        E = emitted_chain(p, q, None, rule)
        w = rule.impl.weight(p).item()
        d = tv(E, p)
        X = torch.arange(p.numel())
        a = accept_probability(p.expand(len(X), -1), q.expand(len(X), -1), X, None, rule)[0]
        exact = accept_probability(p.expand(len(X), -1), q.expand(len(X), -1), X, None, AcceptRule())[0]
        if abs(E.sum().item() - 1) > 1e-12 or (a < exact - 1e-15).any() or d > min(w - 1, tv(p, q)) + 1e-12:
            return False
        moved |= d > 1e-3
    return moved


def test_the_per_step_distance_keeps_its_bound_and_the_wrong_sign_does_not():
    assert keeps_its_guarantee(ent(1.0)) and keeps_its_guarantee(ent(3.0))
    assert not keeps_its_guarantee(ent(1.0, WrongSign))


def test_the_measured_per_step_distance_grows_with_beta_and_the_targets_entropy():
    """Exact per-step TV over the pairs (docs/decoders.md): the mean rises with beta; peaked targets hardly move."""
    means = []
    for beta in (0.5, 1.0, 2.0):
        d = [tv(emitted_chain(p, q, None, ent(beta)), p) for p, q in pairs()]
        means.append(sum(d) / len(d))
        peaked = [x for (p, _), x in zip(pairs(), d) if -torch.special.xlogy(p, p).sum() < 0.3]
        assert peaked and max(peaked) < 0.25 * max(d)
    assert means[0] < means[1] < means[2]
    print("mean per-step TV at beta 0.5, 1, 2:", [round(m, 3) for m in means])


def test_acceptance_grows_with_the_targets_entropy_at_a_fixed_ratio():
    q = torch.tensor([0.5, 0.3, 0.2], dtype=F64)
    peaked = torch.tensor([0.25, 0.74, 0.01], dtype=F64)  # p(0) = 0.25 in both
    flat = torch.tensor([0.25, 0.38, 0.37], dtype=F64)
    x = torch.tensor(0)
    a_peaked, a_flat = (accept_probability(p, q, x, None, ent(0.5))[0].item() for p in (peaked, flat))  # beta 0.5
    assert 0.5 < a_peaked < a_flat <= 1.0
    w = torch.exp(0.5 * -torch.special.xlogy(flat, flat).sum() / torch.log(torch.tensor(3.0, dtype=F64)))
    assert a_flat == pytest.approx(min(1.0, w.item() * 0.25 / 0.5))


def test_beta_zero_is_exact_in_the_rule_and_in_the_registry():
    for p, q in pairs(6):
        assert emitted_chain(p, q, None, ent(0.0)).tolist() == pytest.approx(p.tolist(), abs=1e-12)
    assert methods.rule(methods.normalize({"name": "entropy", "beta": 0.0})).describe() == "exact"
    assert methods.rule(methods.normalize({"name": "entropy", "beta": 1.5})).describe() == "entropy(beta=1.5)"
    assert methods.point_name(methods.normalize({"name": "entropy", "drafting": "jacobi", "beta": 1.5})) == \
        "entropy-jacobi-w16-b1.5"


@pytest.mark.parametrize("sampled", [True, False])
def test_batched_residual_is_the_row_by_row_residual(sampled):
    g = torch.Generator().manual_seed(3)
    V, n = 12, 6
    p = torch.stack([rand_dist(g, V, alpha=[0.1, 1.0, 10.0][i % 3], zeros=i % 3) for i in range(n)])
    q = torch.stack([rand_dist(g, V, zeros=i % 2) for i in range(n)]) if sampled else None
    x = torch.stack([torch.multinomial(p[i] if q is None else q[i], 1, generator=g)[0] for i in range(n)])
    rows = residual_rows(p, q, x, torch.zeros_like(x), None, ent(1.5))
    for r in range(n):
        one = residual(p[r], None if q is None else q[r], int(x[r]), 0, None, ent(1.5))
        torch.testing.assert_close(rows[r], one, rtol=0, atol=1e-15)
        if q is None:  # a deterministic draft's residual: p without x
            assert rows[r, x[r]] == 0


def test_greedy_scales_the_draft_by_the_entropy_weight():
    P = torch.tensor([[0.4, 0.3, 0.3], [0.9, 0.08, 0.02]], dtype=F64)
    # row 0 is near uniform (w close to e^beta), row 1 peaked (w close to 1)
    assert greedy_accept(P, torch.tensor([1, 1]), None, ent(1.0)).tolist() == [True, False]
    assert greedy_accept(P, torch.tensor([1, 1]), None, AcceptRule()).tolist() == [False, False]


@pytest.mark.parametrize("drafting", [Chain(3), static_tree("twin_chain_8"), DynamicTree(8, 2, 3), Jacobi(4)],
                         ids=["chain", "static", "dynamic", "jacobi"])
@pytest.mark.parametrize("greedy", [False, True])
def test_decodes_under_every_drafting_kind(one_thread, drafting, greedy):
    """beta 0 through the rule's own code is exact SD token for token; beta 3 runs and changes the images."""
    target = tiny_target().double()
    drafter = None if isinstance(drafting, Jacobi) else Drafter.from_target(target).eval().double()
    params, cond = SamplingParams(cfg_scale=2.0, greedy=greedy), torch.arange(3)
    want, want_stats = decode(target, drafter, cond, params, AcceptRule(), drafting, gens(3))
    got, stats = decode(target, drafter, cond, params, ent(0.0), drafting, gens(3))
    assert torch.equal(got, want)
    relaxed, stats = decode(target, drafter, cond, params, ent(3.0), drafting, gens(3))
    assert relaxed.shape == want.shape and not torch.equal(relaxed, want)
    assert all(sum(a + 1 for a in s.accepted_per_step) >= 15 for s in stats)


@pytest.mark.parametrize("entry, needle", [
    ({"name": "entropy"}, "needs beta"),
    ({"name": "entropy", "beta": -1}, "beta = -1 must be >= 0"),
    ({"name": "entropy", "beta": 1, "k": 5}, "k does not apply"),
])
def test_bad_values_one_line(entry, needle):
    with pytest.raises(UserError) as e:
        methods.normalize(entry, "sweep.methods[0]")
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("drafting, step", [(Chain(3), "chain_round"), (static_tree("twin_chain_8"), "tree_round"),
                                            (DynamicTree(8, 2, 3), "tree_round"), (Jacobi(4), "jacobi_round")],
                         ids=["chain", "static", "dynamic", "jacobi"])
def test_compiled_rounds_run_the_rule_and_give_the_eager_tokens(one_thread, monkeypatch, drafting, step):
    """compile=True runs the whole round as one graph function (its graph_form); here those functions run
    uncompiled (inductor is test_compile_verify.py's), so the padding, the kept state and the rule's graph form are
    checked exactly against the eager rounds."""
    from lantern.engine.decoding import compiled

    asked = []
    monkeypatch.setattr(compiled, "compiled_step", lambda fn, device: asked.append(fn.__name__) or fn)
    target = tiny_target().double()
    drafter = None if isinstance(drafting, Jacobi) else Drafter.from_target(target).eval().double()
    params, cond = SamplingParams(cfg_scale=2.0), torch.arange(3)
    want, want_stats = decode(target, drafter, cond, params, ent(1.0), drafting, gens(3))
    got, stats = decode(target, drafter, cond, params, ent(1.0), drafting, gens(3), compile=True)
    assert step in asked and torch.equal(got, want)
    assert [s.accepted_per_step for s in stats] == [s.accepted_per_step for s in want_stats]
