"""Cool-SD and GSD (engine/rules/peers.py) on tiny vocabularies: hand cases, exactness when switched off (analytic and
chi-square), the annealing schedule along a chain, and the authors' residuals."""

import pytest
import torch

from lantern.engine.rules.acceptance import (AcceptRule, accept_probability, greedy_accept, residual, residual_rows,
                                             verify_candidates)
from lantern.engine.methods import normalize, rule as build_rule
from lantern.engine.rules.peers import CoolRule, GroupRule
from tiny import sample_index
from lantern.errors import UserError
from test_acceptance import F64, chi_square_pvalue, emitted_chain, rand_dist, rand_table, tv


def cool(scale, nu=0.0, mu=0.0):
    return AcceptRule("coolsd", impl=CoolRule(scale, nu, mu))


def gsd(group, k, gap=0.15):
    return AcceptRule("gsd", k=k, impl=GroupRule(group, k, gap))


def simulate(p, q, table, rule, n, g):
    counts = torch.zeros_like(p)
    for _ in range(n):
        x = sample_index(q, g)
        a, _, m = accept_probability(p, q, torch.tensor(x), table, rule)
        y = x if torch.rand((), generator=g, dtype=F64).item() < a.item() else sample_index(
            residual(p, q, x, int(m), table, rule), g)
        counts[y] += 1
    return counts


@pytest.mark.parametrize("rule", [cool(2.0, 0.3, 0.1), cool(0.7), gsd(4, 3)], ids=["cool", "cool-strict", "gsd"])
@pytest.mark.parametrize("sampled", [True, False])
def test_batched_residual_is_the_row_by_row_residual(rule, sampled):
    """accept_chains takes a chain's residuals for all rows at once (residual_rows, no host sync): the residual the
    rule gives row by row, for each row's draft index (Cool-SD's annealing) and for deterministic drafts."""
    g = torch.Generator().manual_seed(3)
    V, n = 16, 5
    table = rand_table(g, V)
    p = torch.stack([rand_dist(g, V, zeros=i % 3) for i in range(n)])
    q = torch.stack([rand_dist(g, V, zeros=i % 2) for i in range(n)]) if sampled else None
    x = torch.stack([torch.multinomial(p[i] if q is None else q[i], 1, generator=g)[0] for i in range(n)])
    i = torch.arange(n)
    rows = residual_rows(p, q, x, i, table, rule)
    for r in range(n):
        one = residual(p[r], None if q is None else q[r], int(x[r]), int(i[r]), table, rule)
        torch.testing.assert_close(rows[r], one, rtol=0, atol=1e-15)


# -- Cool-SD ------------------------------------------------------------------------------------------------------
def test_cool_weight_one_is_exact_sd_analytically_and_in_the_registry():
    g = torch.Generator().manual_seed(0)
    p, q = rand_dist(g, 9), rand_dist(g, 9, zeros=2)
    E = emitted_chain(p, q, None, cool(1.0))
    assert E.tolist() == pytest.approx(p.tolist(), abs=1e-12)
    exact = AcceptRule("exact")
    for x in range(9):
        if q[x] > p[x]:  # the drafts a rejection can follow
            assert residual(p, q, x, 0, None, cool(1.0)).tolist() == pytest.approx(
                residual(p, q, x, 0, None, exact).tolist(), abs=1e-15)
    assert build_rule(normalize({"name": "coolsd", "scale": 1.0})).describe() == "exact"


def test_cool_acceptance_anneals_along_the_chain():
    p = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=F64).expand(3, -1)
    q = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=F64).expand(3, -1)
    X = torch.tensor([0, 0, 0])
    A, _, i = accept_probability(p, q, X, None, cool(3.0, nu=0.5, mu=0.1))
    w = [3.0 * torch.exp(torch.tensor(-0.5 * j - 0.1, dtype=F64)).item() for j in range(3)]
    assert A.tolist() == pytest.approx([min(1.0, wj * 0.1 / 0.4) for wj in w])
    assert i.tolist() == [0, 1, 2]  # the residual reads the draft index from the m slot
    r = residual(p[2], q[2], 0, 2, None, cool(3.0, nu=0.5, mu=0.1))
    raw = (p[2] - torch.minimum(q[2], w[2] * p[2])).clamp(min=0)
    assert r.tolist() == pytest.approx((raw / raw.sum()).tolist())
    # tree siblings at depth d use w_d
    j, _ = verify_candidates(p[0], q[0], [0], None, cool(3.0, nu=0.5, mu=0.1), [min(1.0, w[2] * 0.25) - 1e-9], 2)
    assert j == 0
    j, _ = verify_candidates(p[0], q[0], [0], None, cool(3.0, nu=0.5, mu=0.1), [min(1.0, w[2] * 0.25) + 1e-9], 2)
    assert j == -1


def test_cool_emitted_distribution_is_min_q_wp_plus_the_optimal_residual():
    g = torch.Generator().manual_seed(4)
    p, q = rand_dist(g, 8), rand_dist(g, 8)
    rule, w = cool(2.0), 2.0
    E = emitted_chain(p, q, None, rule)
    accepted = torch.minimum(q, w * p)
    left = (p - accepted).clamp(min=0)
    assert E.tolist() == pytest.approx((accepted + (1 - accepted.sum()) * left / left.sum()).tolist(), abs=1e-12)
    assert E.sum().item() == pytest.approx(1.0)
    counts = simulate(p, q, None, rule, 4000, g)
    assert chi_square_pvalue(counts, E) > 1e-3


def test_cool_greedy_scales_the_draft():
    p = torch.tensor([0.4, 0.3, 0.3], dtype=F64).expand(2, -1)
    assert greedy_accept(p, torch.tensor([1, 1]), None, cool(1.5, nu=1.0)).tolist() == [True, False]


# -- GSD ----------------------------------------------------------------------------------------------------------
def hand_case():
    p = torch.tensor([0.30, 0.20, 0.18, 0.17, 0.10, 0.05], dtype=F64)
    q = torch.tensor([0.05, 0.10, 0.50, 0.05, 0.05, 0.25], dtype=F64)
    table = torch.tensor([[1, 2, 3, 4, 5], [3, 2, 0, 4, 5], [3, 1, 5, 0, 4],
                          [2, 1, 0, 4, 5], [5, 0, 1, 2, 3], [4, 2, 0, 1, 3]])
    return p, q, table


def test_gsd_cluster_by_hand():
    p, q, table = hand_case()
    # x = 2 (rank 2): neighbours 3 (rank 3), 1 (rank 1); group 3 -> window ranks 1..3 (1 below, 1 above)
    nb, inside = GroupRule(3, 2, 0.15).members(p, torch.tensor(2), table)
    assert nb.tolist() == [3, 1] and inside.tolist() == [True, True]
    a, _, _ = accept_probability(p, q, torch.tensor(2), table, gsd(3, 2))
    assert a.item() == pytest.approx((0.18 + 0.17 + 0.20) / (0.50 + 0.05 + 0.10))
    # the gap filter: |0.20 - 0.18| passes 0.015? no; |0.17 - 0.18| does
    nb, inside = GroupRule(3, 2, 0.015).members(p, torch.tensor(2), table)
    assert inside.tolist() == [True, False]
    # group 2: one rank below x only (the authors' window is one wider below); k = 1: only code 3 is a neighbour
    assert GroupRule(2, 2, 0.15).members(p, torch.tensor(2), table)[1].tolist() == [True, False]
    assert GroupRule(14, 1, 0.15).members(p, torch.tensor(2), table)[1].tolist() == [True]
    # a far-ranked neighbour stays out: x = 5 (rank 5) and its nearest 4 (rank 4) with group 1
    assert GroupRule(1, 1, 0.15).members(p, torch.tensor(5), table)[1].tolist() == [False]


def test_gsd_residual_is_the_authors_max_p_minus_q():
    p, q, table = hand_case()
    r = residual(p, q, 2, 0, table, gsd(3, 2))
    raw = (p - q).clamp(min=0)
    assert r.tolist() == pytest.approx((raw / raw.sum()).tolist())
    # deterministic drafts: p without x
    r = residual(p, None, 0, 0, table, gsd(3, 2))
    assert r[0] == 0 and r[1:].tolist() == pytest.approx((p[1:] / p[1:].sum()).tolist())


def test_gsd_greedy_boosts_the_draft_to_its_cluster_mass():
    p, _, table = hand_case()
    P = p.expand(2, -1)
    assert greedy_accept(P, torch.tensor([2, 4]), table, gsd(3, 2)).tolist() == [True, False]
    assert greedy_accept(P, torch.tensor([2, 0]), table, gsd(1, 2)).tolist() == [False, True]


@pytest.mark.parametrize("group, k, gap", [(1, 3, 0.5), (5, 0, 0.5), (5, 3, 0.0)])
def test_gsd_switched_off_is_exact(group, k, gap):
    g = torch.Generator().manual_seed(group + k)
    p, q, table = rand_dist(g, 8), rand_dist(g, 8), rand_table(g, 8)
    rule = gsd(group, k, gap)
    assert not rule.relaxed
    assert emitted_chain(p, q, table, rule).tolist() == pytest.approx(p.tolist(), abs=1e-12)
    spec = normalize({"name": "gsd", "group": group, "k": k, "gap": gap})
    assert build_rule(spec).describe() == "exact"


def test_gsd_group_one_chi_square_is_exact_and_relaxed_gsd_is_not():
    g = torch.Generator().manual_seed(8)
    p = torch.tensor([0.22, 0.18, 0.15, 0.13, 0.12, 0.10, 0.06, 0.04], dtype=F64)
    q = torch.tensor([0.05, 0.10, 0.30, 0.05, 0.25, 0.05, 0.15, 0.05], dtype=F64)
    table = rand_table(g, 8)
    # GroupRule(1, ...) used directly (not the registry's exact rule): its own code path must be exact
    assert chi_square_pvalue(simulate(p, q, table, AcceptRule("gsd", k=3, impl=GroupRule(1, 3, 1.0)), 4000, g), p) > 1e-3
    E = emitted_chain(p, q, table, gsd(8, 7, 1.0))
    assert tv(E, p) > 0.02 and E.sum().item() == pytest.approx(1.0)


@pytest.mark.parametrize("entry, needle", [
    ({"name": "coolsd", "scale": 0}, "scale = 0 must be > 0"),
    ({"name": "coolsd", "scale": 2, "nu": -1}, "nu = -1 must be >= 0"),
    ({"name": "coolsd", "scale": 2, "k": 5}, "k does not apply"),
    ({"name": "gsd", "k": 5, "group": 0}, "group = 0 must be >= 1"),
    ({"name": "gsd", "k": 5, "group": 2.5}, "must be an integer"),
    ({"name": "gsd", "k": 5, "gap": 1.5}, "gap = 1.5 exceeds 1"),
    ({"name": "gsd"}, "needs k"),
    ({"name": "lanterntv", "delta": 1.5, "k": 5}, "delta = 1.5 exceeds 1"),
    ({"name": "lanterntv", "delta": 0.1, "k": 5, "residual": "reference"}, "residual does not apply"),
])
def test_bad_values_one_line(entry, needle):
    with pytest.raises(UserError) as e:
        normalize(entry, "sweep.methods[0]")
    assert needle in str(e.value) and "\n" not in str(e.value)
