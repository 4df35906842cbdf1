"""Acceptance rules on tiny vocabularies: exact distributions are computed by enumerating drafts, so every claim
about losslessness or the TV bound is checked analytically, plus one Monte-Carlo chi-square on the sampling path."""

import pytest
import torch

from lantern.engine.rules.acceptance import (
    AcceptRule, accept_probability, after_rejection, greedy_accept, relaxed_mass, residual, sibling_budget,
    verify_candidates,
)
from lantern.errors import UserError
from tiny import sample_index

F64 = torch.float64


def rand_dist(g, V, alpha=0.4, zeros=0):
    d = torch.distributions.Dirichlet(torch.full((V,), alpha, dtype=F64)).sample()
    if zeros:  # some exact zeros, as after top-k / top-p filtering
        d[torch.randperm(V, generator=g)[:zeros]] = 0
        d = d / d.sum()
    return d


def rand_table(g, V):
    """A random proximity order per code over the other codes."""
    rows = []
    for i in range(V):
        perm = torch.randperm(V, generator=g)
        rows.append(perm[perm != i])
    return torch.stack(rows)


def tv(a, b):
    return 0.5 * (a - b).abs().sum().item()


def relaxed_target(p, x, table, m):
    """p~_x built independently of the module: the mass of n_1..n_m moved onto x."""
    out = p.clone()
    nb = table[x, :m]
    out[x] += p[nb].sum()
    out[nb] = 0
    return out


def emitted_chain(p, q, table, rule):
    """Exact distribution of the emitted token for one position: P(y) = sum_x q(x) [a 1{y=x} + (1 - a) r_x(y)].
    q None: a deterministic draft of every x in turn is not a distribution; see emitted_deterministic."""
    E = torch.zeros_like(p)
    for x in range(p.numel()):
        if q[x] == 0:
            continue
        a, _, m = accept_probability(p, q, torch.tensor(x), table, rule)
        E[x] += q[x] * a
        if a < 1:
            E += q[x] * (1 - a) * residual(p, q, x, int(m), table, rule)
    return E


def emitted_siblings(p, q, cands, table, rule):
    """Exact emitted distribution when `cands` are tried in order (deterministic drafting when q is None)."""
    E, mass, budget = torch.zeros_like(p), 1.0, sibling_budget(q, rule)
    for x in cands:
        a, c, m = accept_probability(p, q, torch.tensor(x), table, rule, budget)
        E[x] += mass * a
        mass = mass * (1 - a)
        p, q, budget = after_rejection(p, q, x, c.item(), int(m), table, rule, budget)
    return E + mass * p


def emitted_without_replacement(p, q, n, table, rule):
    """Exact emitted distribution when n candidates are drawn from q without replacement and tried in order."""
    V = p.numel()

    def rec(p, q, q0, left, mass, budget):
        if left == 0 or q.sum() == 0:
            return mass * p
        E = torch.zeros_like(p)
        for x in range(V):
            if q[x] == 0:
                continue
            a, c, m = accept_probability(p, q, torch.tensor(x), table, rule, budget)
            w = mass * q[x]
            E[x] += w * a
            if a < 1:
                p2, q2, b2 = after_rejection(p, q, x, c.item(), int(m), table, rule, budget)
                E += rec(p2, q2, q0, left - 1, w * (1 - a), b2)
        return E

    return rec(p, q, q, n, 1.0, sibling_budget(q, rule))


# -- the rule object ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, needle", [
    (dict(kind="eagle"), "kind"),
    (dict(kind="lantern", delta=-0.1, k=3), "delta"),
    (dict(kind="lantern", delta=2.0, k=3), "lanternpp"),  # never the delta > 1 trick
    (dict(kind="lanternpp", lam=0.5, k=3), "lam"),
    (dict(kind="lantern", delta=0.1, k=-1), "k="),
    (dict(kind="lantern", delta=0.1, k=2.5), "k="),
    (dict(kind="lantern", delta=0.1, k=3, residual="loose"), "residual"),
    (dict(kind="lantern", delta=0.1, lam=2.0, k=3), "lam applies"),
    (dict(kind="lanternpp", delta=0.1, lam=2.0, k=3), "delta applies"),
    (dict(kind="exact", k=3), "k applies"),
])
def test_rule_validation(kw, needle):
    with pytest.raises(UserError, match=needle) as e:
        AcceptRule(**kw)
    assert "\n" not in str(e.value)


def test_rule_properties():
    assert not AcceptRule().relaxed and AcceptRule().describe() == "exact"
    r = AcceptRule("lantern", delta=0.2, k=10)
    assert r.relaxed and r.table_width == 10 and "delta=0.2" in r.describe()
    assert AcceptRule("lantern", delta=0.2, k=10, residual="reference").table_width == 11
    assert AcceptRule("lanternpp", lam=5.0, k=10, residual="lumina").table_width == 11
    with pytest.raises(ValueError, match=">= 3 columns"):  # the authors' residuals read k + 1 columns: never sliced short
        residual(P6, None, 0, 1, T6[:, :2], AcceptRule("lantern", delta=0.1, k=2, residual="lumina"))
    assert AcceptRule("lanternpp", lam=3.0, k=4).relaxed


# -- the relaxation -----------------------------------------------------------------------------------------------
P6 = torch.tensor([0.30, 0.05, 0.10, 0.02, 0.20, 0.33], dtype=F64)
T6 = torch.tensor([[3, 1, 2, 4, 5], [0, 2, 3, 4, 5], [0, 1, 3, 4, 5], [0, 1, 2, 4, 5], [0, 1, 2, 3, 5], [0, 1, 2, 3, 4]])


@pytest.mark.parametrize("rule, m, c", [
    (AcceptRule("lantern", delta=0.1, k=5), 2, 0.07),  # c = 0.02, 0.07, 0.17, ...
    (AcceptRule("lantern", delta=0.1, k=1), 1, 0.02),  # m* <= k
    (AcceptRule("lantern", delta=0.01, k=5), 0, 0.0),
    (AcceptRule("lantern", delta=0.17, k=5), 3, 0.17),  # c_m == delta counts
    (AcceptRule("lanternpp", lam=1.5, k=5), 2, 0.07),  # bound 0.5 * 0.30 = 0.15
    (AcceptRule("lanternpp", lam=1.2, k=5), 1, 0.02),  # bound 0.06
])
def test_relaxed_mass_hand_case(rule, m, c):
    cm, mm = relaxed_mass(P6, torch.tensor(0), T6, rule)
    assert int(mm) == m and cm.item() == pytest.approx(c)


def test_relaxed_mass_is_batched_and_lanternpp_is_relative():
    g = torch.Generator().manual_seed(1)
    P = torch.stack([rand_dist(g, 9) for _ in range(7)])
    X = torch.randint(0, 9, (7,), generator=g)
    table = rand_table(g, 9)
    for rule in (AcceptRule("lantern", delta=0.15, k=4), AcceptRule("lanternpp", lam=3.0, k=6)):
        c, m = relaxed_mass(P, X, table, rule)
        for i in range(7):
            ci, mi = relaxed_mass(P[i], X[i], table, rule)
            assert c[i].item() == ci.item() and m[i].item() == mi.item()
        if rule.kind == "lanternpp":
            assert (P.gather(1, X[:, None])[:, 0] + c <= rule.lam * P.gather(1, X[:, None])[:, 0] + 1e-12).all()


def test_greedy_relaxed_and_exact():
    x = torch.tensor(4)  # p(4) = 0.20 < p(5) = 0.33
    assert not greedy_accept(P6, x, T6, AcceptRule())
    assert greedy_accept(P6, torch.tensor(5), T6, AcceptRule())
    # neighbours of 4 in order: 0 (0.30) ... c_1 = 0.30 > 0.2, so nothing moves and 4 stays rejected
    assert not greedy_accept(P6, x, T6, AcceptRule("lantern", delta=0.2, k=5))
    # delta 0.3: c_1 = 0.30 <= 0.3, p~(4) = 0.50 > 0.33
    assert greedy_accept(P6, x, T6, AcceptRule("lantern", delta=0.3, k=5))
    assert greedy_accept(P6, x, T6, AcceptRule("lanternpp", lam=2.5, k=5))  # bound 0.30
    assert not greedy_accept(P6, x, T6, AcceptRule("lanternpp", lam=2.4, k=5))
    batch = greedy_accept(P6.expand(3, -1), torch.tensor([4, 5, 3]), T6, AcceptRule("lantern", delta=0.3, k=5))
    assert batch.tolist() == [True, True, False]  # 3 borrows 0.30 from 0: 0.32 < 0.33


@pytest.mark.parametrize("rule", [
    AcceptRule("lantern", delta=0.0, k=5),
    AcceptRule("lantern", delta=0.3, k=0),
    AcceptRule("lanternpp", lam=1.0, k=5),
    AcceptRule("lantern", delta=0.0, k=5, residual="reference"),
])
def test_degenerate_relaxations_reduce_to_exact(rule):
    g = torch.Generator().manual_seed(2)
    table = rand_table(g, 10)
    exact = AcceptRule()
    assert not rule.relaxed
    for _ in range(20):
        p, q = rand_dist(g, 10, zeros=2), rand_dist(g, 10, zeros=3)
        for x in q.nonzero()[:, 0].tolist():  # only drafts the drafter can make
            a0, _, m0 = accept_probability(p, q, torch.tensor(x), table, exact)
            a1, _, m1 = accept_probability(p, q, torch.tensor(x), table, rule)
            assert a0.item() == a1.item() and int(m1) == 0
            assert torch.equal(residual(p, q, x, 0, table, exact), residual(p, q, x, int(m1), table, rule))
            assert greedy_accept(p, torch.tensor(x), table, rule) == greedy_accept(p, torch.tensor(x), table, exact)


# -- exactness ----------------------------------------------------------------------------------------------------
def test_exact_chain_sampling_emits_p_analytically():
    g = torch.Generator().manual_seed(3)
    for _ in range(200):
        V = int(torch.randint(2, 12, (1,), generator=g))
        p, q = rand_dist(g, V, zeros=V // 4), rand_dist(g, V, zeros=V // 3)
        assert torch.allclose(emitted_chain(p, q, None, AcceptRule()), p, atol=1e-12)


def test_exact_multi_candidate_emits_p_analytically():
    g = torch.Generator().manual_seed(4)
    for _ in range(30):
        p, q = rand_dist(g, 6, zeros=1), rand_dist(g, 6, zeros=1)
        for n in (1, 2, 3):
            assert torch.allclose(emitted_without_replacement(p, q, n, None, AcceptRule()), p, atol=1e-12)
        cands = torch.randperm(6, generator=g)[:3].tolist()  # deterministic top-k drafting: q treated as 1
        assert torch.allclose(emitted_siblings(p, None, cands, None, AcceptRule()), p, atol=1e-12)


def chi_square_pvalue(counts, probs):
    n = counts.sum()
    keep = probs > 0
    assert counts[~keep].sum() == 0, "a zero-probability token was emitted"
    stat = ((counts[keep] - n * probs[keep]) ** 2 / (n * probs[keep])).sum()
    df = torch.tensor(float(keep.sum() - 1), dtype=F64)
    return torch.special.gammaincc(df / 2, stat / 2).item()


def simulate_chain(p, q, rule, n, gen):
    """The sampling path as speculative decoding runs it: draw x ~ q, accept with a uniform, else the residual."""
    counts = torch.zeros_like(p)
    for _ in range(n):
        x = sample_index(q, gen)
        a, _, m = accept_probability(p, q, torch.tensor(x), None, rule)
        u = torch.rand((), generator=gen, dtype=F64).item()
        y = x if u < a.item() else sample_index(residual(p, q, x, int(m), None, rule), gen)
        counts[y] += 1
    return counts


def test_exact_sampling_chi_square_reproduces_p_and_would_catch_a_2pct_bias():
    gen = torch.Generator().manual_seed(5)
    p = torch.tensor([0.22, 0.18, 0.15, 0.13, 0.12, 0.10, 0.06, 0.04], dtype=F64)
    q = torch.tensor([0.05, 0.30, 0.05, 0.20, 0.02, 0.18, 0.10, 0.10], dtype=F64)
    n = 20000
    counts = simulate_chain(p, q, AcceptRule(), n, gen)
    assert chi_square_pvalue(counts, p) > 1e-3
    # Power: the same number of draws from a distribution 2% (TV) away is rejected.
    biased = p.clone()
    biased[0] -= 0.02
    biased[3] += 0.02
    draws = torch.multinomial(biased, n, replacement=True, generator=gen)
    assert chi_square_pvalue(torch.bincount(draws, minlength=8).to(F64), p) < 1e-3


def test_verify_candidates_follows_the_uniforms():
    g = torch.Generator().manual_seed(6)
    p, q = rand_dist(g, 8), rand_dist(g, 8)
    a0, _, _ = accept_probability(p, q, torch.tensor(2), None, AcceptRule())
    j, _ = verify_candidates(p, q, [2, 5], None, AcceptRule(), [a0.item() / 2, 0.0])
    assert j == 0
    j, after = verify_candidates(p, q, [2, 5], None, AcceptRule(), [1.0, 1.0])
    assert j == -1 and after[2] == 0 and after[5] == 0 and after.sum().item() == pytest.approx(1.0)


# -- LANTERN bounded: the TV bound --------------------------------------------------------------------------------
def test_bounded_deterministic_draft_emits_relaxed_target_within_delta():
    g = torch.Generator().manual_seed(7)
    for _ in range(300):
        V = int(torch.randint(3, 16, (1,), generator=g))
        p, table = rand_dist(g, V, zeros=V // 4), rand_table(g, V)
        rule = AcceptRule("lantern", delta=float(torch.rand(1, generator=g)) * 0.5,
                          k=int(torch.randint(1, V, (1,), generator=g)))
        x = int(torch.randint(0, V, (1,), generator=g))
        c, m = relaxed_mass(p, torch.tensor(x), table, rule)
        E = emitted_siblings(p, None, [x], table, rule)
        assert torch.allclose(E, relaxed_target(p, x, table, int(m)), atol=1e-12)
        assert tv(E, p) == pytest.approx(c.item(), abs=1e-12) and tv(E, p) <= rule.delta + 1e-12


def test_bounded_siblings_share_one_budget():
    g = torch.Generator().manual_seed(8)
    worst = 0.0
    for _ in range(300):
        V = int(torch.randint(4, 14, (1,), generator=g))
        p, table = rand_dist(g, V, alpha=0.3), rand_table(g, V)
        rule = AcceptRule("lantern", delta=float(torch.rand(1, generator=g)) * 0.4 + 0.01,
                          k=int(torch.randint(1, V, (1,), generator=g)))
        cands = torch.randperm(V, generator=g)[: int(torch.randint(2, V, (1,), generator=g))].tolist()
        worst = max(worst, tv(emitted_siblings(p, None, cands, table, rule), p) / rule.delta)
    assert worst <= 1 + 1e-9
    assert worst > 0.9  # the budget is used, not just respected


def test_bounded_residual_is_exact_sd_toward_the_relaxed_target():
    """Per draft, bounded verification is exact SD toward p~_x: same acceptance, residual norm(max(p~_x - q, 0))."""
    g = torch.Generator().manual_seed(9)
    for _ in range(200):
        V = int(torch.randint(3, 12, (1,), generator=g))
        p, q, table = rand_dist(g, V), rand_dist(g, V), rand_table(g, V)
        rule = AcceptRule("lantern", delta=0.3, k=V - 1)
        x = int(torch.randint(0, V, (1,), generator=g))
        a, _, m = accept_probability(p, q, torch.tensor(x), table, rule)
        pt = relaxed_target(p, x, table, int(m))
        assert a.item() == pytest.approx(min(1.0, (pt[x] / q[x]).item()))
        if a < 1:
            want = (pt - q).clamp(min=0)
            assert torch.allclose(residual(p, q, x, int(m), table, rule), want / want.sum(), atol=1e-12)


def test_sampled_drafts_escape_the_per_step_bound():
    """Why the bound is claimed for deterministic drafting only: with x ~ q every draft borrows on its own.
    Ten small codes (p = 0.01) lend to each other; q spreads over them; delta = 0.01 but the emitted mass of the
    small codes doubles (0.1 -> 0.2), whatever the residual does."""
    p = torch.cat([torch.full((10,), 0.01, dtype=F64), torch.full((10,), 0.09, dtype=F64)])
    q = torch.cat([torch.full((10,), 0.1, dtype=F64), torch.zeros(10, dtype=F64)])
    table = torch.stack([
        torch.tensor([(i + 1) % 10] + [j for j in range(20) if j not in (i, (i + 1) % 10)]) if i < 10
        else torch.tensor([j for j in range(20) if j != i]) for i in range(20)
    ])
    E = emitted_chain(p, q, table, AcceptRule("lantern", delta=0.01, k=1))
    assert E[:10].sum().item() == pytest.approx(0.2)
    assert tv(E, p) == pytest.approx(0.1)  # ten times delta


# -- LANTERN reference residual (the authors' code) ---------------------------------------------------------------
def test_reference_residual_hand_case():
    # x = 0; neighbours 3, 1, 2, 4, 5; delta 0.03 aggregates only n_1 = 3 (c = 0.02), k = 2.
    rule_ref = AcceptRule("lantern", delta=0.03, k=2, residual="reference")
    rule_bnd = AcceptRule("lantern", delta=0.03, k=2)
    a, c, m = accept_probability(P6, None, torch.tensor(0), T6, rule_ref)
    assert int(m) == 1 and a.item() == pytest.approx(0.32)
    ref = residual(P6, None, 0, int(m), T6, rule_ref)
    bnd = residual(P6, None, 0, int(m), T6, rule_bnd)
    # reference zeroes x and its k + 1 = 3 nearest (3, 1, 2); bounded only x and the aggregated 3
    assert torch.allclose(ref, torch.tensor([0, 0, 0, 0, 0.20, 0.33], dtype=F64) / 0.53)
    assert torch.allclose(bnd, torch.tensor([0, 0.05, 0.10, 0, 0.20, 0.33], dtype=F64) / 0.68)
    # emitted: reference moves 0.17 of mass (far beyond delta), bounded exactly c = 0.02
    E_ref = emitted_siblings(P6, None, [0], T6, rule_ref)
    E_bnd = emitted_siblings(P6, None, [0], T6, rule_bnd)
    assert tv(E_bnd, P6) == pytest.approx(0.02) and tv(E_ref, P6) > 0.1
    # m* = 0: no relaxation, no extra zeroing
    a, _, m = accept_probability(P6, None, torch.tensor(0), T6, AcceptRule("lantern", delta=0.01, k=2, residual="reference"))
    assert int(m) == 0
    assert torch.allclose(residual(P6, None, 0, 0, T6, rule_ref), torch.cat([torch.zeros(1, dtype=F64), P6[1:] / 0.7]))


def test_reference_residual_with_no_mass_left_is_uniform():
    p = torch.tensor([0.5, 0.2, 0.2, 0.1, 0.0], dtype=F64)
    table = torch.tensor([[3, 1, 2, 4], [0, 2, 3, 4], [0, 1, 3, 4], [0, 1, 2, 4], [0, 1, 2, 3]])
    rule = AcceptRule("lantern", delta=0.15, k=2, residual="reference")
    _, _, m = accept_probability(p, None, torch.tensor(0), table, rule)
    assert int(m) == 1
    assert torch.allclose(residual(p, None, 0, int(m), table, rule), torch.full((5,), 0.2, dtype=F64))


def test_reference_tree_siblings_get_no_shared_budget():
    p = torch.tensor([0.25, 0.25, 0.05, 0.05, 0.4], dtype=F64)
    table = torch.tensor([[2, 1, 3, 4], [3, 0, 2, 4], [0, 1, 3, 4], [1, 0, 2, 4], [0, 1, 2, 3]])
    bounded, reference = AcceptRule("lantern", delta=0.05, k=1), AcceptRule("lantern", delta=0.05, k=1, residual="reference")
    assert sibling_budget(None, bounded) == 0.05 and sibling_budget(None, reference) is None
    assert sibling_budget(torch.ones(5) / 5, bounded) is None  # sampled siblings: per-draft delta
    assert tv(emitted_siblings(p, None, [0, 1], table, bounded), p) <= 0.05 + 1e-12
    assert tv(emitted_siblings(p, None, [0, 1], table, reference), p) > 0.05 + 1e-3


# -- the reference residual, case by case against the authors' code (jadohu/LANTERN ea_model_llamagen.py) ---------
REF = AcceptRule("lantern", delta=0.03, k=2, residual="reference")  # on P6 / T6, x = 0 borrows p(3): m* = 1, c = 0.02


def test_reference_dynamic_siblings_by_hand():
    """evaluate_posterior (q = 1): gtp[x] = 0 and, relaxed, gtp[nearest[x, :k + 1]] = 0, renormalise, next sibling;
    delta applies afresh to each sibling on the renormalised residual."""
    j, p1 = verify_candidates(P6, None, [0, 5], T6, REF, [0.5, 1.0])
    assert j == -1
    # x = 0 rejected (a = 0.32): 0 and nearest[0, :3] = 3, 1, 2 leave -> (0.20, 0.33) / 0.53 on codes 4, 5; then
    # x = 5 borrows c_1 = c_2 = 0 from codes 0, 1 (m* = 2, so relaxed) and is rejected: 5 and 0, 1, 2 leave
    assert torch.equal(p1, torch.tensor([0, 0, 0, 0, 1.0, 0], dtype=F64))
    j, p_at_5 = verify_candidates(P6, None, [0, 5], T6, REF, [0.5, 0.33 / 0.53 - 1e-9])
    assert j == 1 and torch.allclose(p_at_5, torch.tensor([0, 0, 0, 0, 0.20, 0.33], dtype=F64) / 0.53)


def test_reference_static_residual_zeroes_the_neighbours_in_q_not_in_p():
    """evaluate_posterior_v1: accept iff u <= p~(x) / q_cond(x); on rejection q' = the parent's q without earlier
    siblings (renormalised), nearest[x, :k + 1] zeroed in q' (not renormalised), residual norm(max(p - q', 0))."""
    q = torch.tensor([0.40, 0.10, 0.05, 0.05, 0.10, 0.30], dtype=F64)
    a, c, m = accept_probability(P6, q, torch.tensor(0), T6, REF)
    assert (int(m), c.item()) == (1, pytest.approx(0.02)) and a.item() == pytest.approx(0.32 / 0.40)
    # q' = (0.40, 0, 0, 0, 0.10, 0.30): codes 3, 1, 2 keep all of p; code 0 loses all, 4 and 5 lose q
    want = torch.tensor([0, 0.05, 0.10, 0.02, 0.10, 0.03], dtype=F64) / 0.30
    assert torch.allclose(residual(P6, q, 0, int(m), T6, REF), want)
    # (zeroing them in p instead, as our code did before, gave (0, 0, 0, 0, 0.10, 0.03) / 0.13); bounded differs too
    bounded = AcceptRule("lantern", delta=0.03, k=2)
    exact_sd = torch.tensor([0, 0, 0.05, 0, 0.10, 0.03], dtype=F64) / 0.18  # max(p - q, 0); n_1 = 3 has none left
    assert torch.allclose(residual(P6, q, 0, 1, T6, bounded), exact_sd)
    # not relaxed (m* = 0): exact SD's residual, nothing else leaves
    loose = AcceptRule("lantern", delta=0.01, k=2, residual="reference")
    assert int(accept_probability(P6, q, torch.tensor(0), T6, loose)[2]) == 0
    assert torch.allclose(residual(P6, q, 0, 0, T6, loose), exact_sd)


def test_reference_static_second_sibling_by_hand():
    """Siblings 0 then 5, drawn from q without replacement: 5 is tried with q_cond = 0.30 / (1 - 0.40) = 0.5 against
    the first residual r1, and its own residual subtracts q' = q without 0, renormalised, less nearest[5, :3]."""
    q = torch.tensor([0.40, 0.10, 0.05, 0.05, 0.10, 0.30], dtype=F64)
    r1 = torch.tensor([0, 0.05, 0.10, 0.02, 0.10, 0.03], dtype=F64) / 0.30
    p, q1, _ = after_rejection(P6, q, 0, 0.02, 1, T6, REF, None)
    assert torch.allclose(p, r1)
    assert torch.allclose(q1, torch.tensor([0, 0.10, 0.05, 0.05, 0.10, 0.30], dtype=F64) / 0.6)
    a, c, m = accept_probability(p, q1, torch.tensor(5), T6, REF)
    assert int(m) == 1 and c.item() == 0 and a.item() == pytest.approx(0.1 / 0.5)  # r1(0) = 0 still counts as m* = 1
    j, after = verify_candidates(P6, q, [0, 5], T6, REF, [0.9, 0.9])
    # max(r1 - (0, 0, 0, 1/12, 1/6, 1/2), 0) = (0, 1/6, 1/3, 0, 1/6, 0)
    assert j == -1 and torch.allclose(after, torch.tensor([0, 0.25, 0.5, 0, 0.25, 0], dtype=F64))
    assert verify_candidates(P6, q, [0, 5], T6, REF, [0.9, 0.19])[0] == 1


def test_reference_greedy_by_hand():
    """evaluate_posterior without a logits processor: p[x] replaced by p~(x), x accepted iff it is the argmax
    (torch's first maximum: ties go to the lower code); the neighbours keep their mass; delta > 1 in their code is
    our lanternpp lam."""
    p = torch.tensor([0.4, 0.2, 0.2, 0.2], dtype=F64)
    table = torch.tensor([[1, 2, 3], [0, 2, 3], [1, 3, 0], [2, 1, 0]])
    rule = AcceptRule("lantern", delta=0.2, k=3, residual="reference")
    assert greedy_accept(p.expand(4, -1), torch.arange(4), table, rule).tolist() == [True, False, False, False]
    p = torch.tensor([0.2, 0.2, 0.4, 0.2], dtype=F64)  # now x = 0 ties 0.4 with code 2 and wins as the lower index
    assert greedy_accept(p.expand(3, -1), torch.tensor([0, 1, 3]), table, rule).tolist() == [True, True, False]
    # lam = 2 (their delta = 2.0): bound (2 - 1) p(x) = 0.2, the same as delta 0.2 here
    pp = AcceptRule("lanternpp", lam=2.0, k=3, residual="reference")
    assert greedy_accept(p.expand(3, -1), torch.tensor([0, 1, 3]), table, pp).tolist() == [True, True, False]


def test_reference_without_relaxation_is_exact_sd():
    """m* = 0 (delta below every neighbour's mass): one reference verification emits p exactly, sampled or not."""
    g = torch.Generator().manual_seed(11)
    for _ in range(20):
        p, q, table = rand_dist(g, 6), rand_dist(g, 6, zeros=1), rand_table(g, 6)
        rule = AcceptRule("lantern", delta=float(p.min()) * 0.5, k=3, residual="reference")
        assert torch.allclose(emitted_chain(p, q, table, rule), p, atol=1e-12)
        assert torch.allclose(emitted_without_replacement(p, q, 1, table, rule), p, atol=1e-12)
        for x in range(6):
            assert torch.allclose(emitted_siblings(p, None, [x], table, rule), p, atol=1e-12)


def test_reference_treats_a_zero_mass_neighbour_as_a_relaxation():
    """Their `indices != -1` holds as soon as c_1 <= delta, even when n_1 has no mass (common after top-k: most of
    1000 neighbours lie outside the target's top-k), so a rejection then drops x's k + 1 nearest from the residual
    although nothing was borrowed; bounded drops only the zero-mass n_1 and stays exact SD."""
    p = torch.tensor([0.5, 0.0, 0.3, 0.2], dtype=F64)
    table = torch.tensor([[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]])
    ref = AcceptRule("lantern", delta=0.01, k=1, residual="reference")
    a, c, m = accept_probability(p, None, torch.tensor(0), table, ref)
    assert (int(m), c.item(), a.item()) == (1, 0.0, 0.5)
    assert torch.equal(residual(p, None, 0, 1, table, ref), torch.tensor([0, 0, 0, 1.0], dtype=F64))
    bounded = AcceptRule("lantern", delta=0.01, k=1)
    assert torch.allclose(residual(p, None, 0, 1, table, bounded), torch.tensor([0, 0, 0.6, 0.4], dtype=F64))


# -- the Lumina-mGPT residual, against a transcription of the authors' loop (jadohu/LANTERN ea_model_lumina_mgpt.py) --
def authors_lumina_level(p, q_parent, cands, table, k, delta, uniforms):
    """One level of their EaLumina_mGPT.evaluate_posterior under sampling, for image-token drafts, written out step
    by step: q_parent None is eagle_version 2 (dynamic tree, q = 1), else eagle_version 1 (static tree: the parent's
    drafter distribution, each child tried with its conditional draw probability). Their delta > 1 is LANTERN++'s
    lam. Returns (index of the accepted candidate or -1, gtp after the rejections)."""
    gtp = p.clone()
    for j, x in enumerate(cands):
        px = gtp[x]
        cum = torch.cumsum(gtp[table[x, :k]], 0)
        fits = (cum <= ((delta - 1) * px if delta > 1.0 else delta)).nonzero().flatten()
        relaxed = fits.numel() > 0
        if relaxed:
            px = px + cum[fits[-1]]
        if q_parent is not None:
            q = q_parent.clone()
            q[list(cands[:j])] = 0  # the earlier siblings (their b_indices), renormalised
            q = q / q.sum()
            qx = q[x]
        else:
            qx = 1.0
        if uniforms[j] <= px / qx:
            return j, gtp
        if relaxed:
            gtp[table[x, : k + 1]] = 0  # in p (gtp), where their LlamaGen and Anole code zeroes q
        if q_parent is not None:
            gtp = (gtp - q).clamp(min=0)
        else:
            gtp[x] = 0
        if gtp.sum() == 0:
            gtp = torch.ones_like(gtp)
        gtp = gtp / gtp.sum()
    return -1, gtp


LUMINA = AcceptRule("lantern", delta=0.03, k=2, residual="lumina")


def test_lumina_static_residual_zeroes_the_neighbours_in_p_by_hand():
    """x = 0 borrows p(3) (m* = 1): nearest[0, :3] = 3, 1, 2 leave p, then max(p - q', 0): (0, 0, 0, 0, 0.10, 0.03)
    / 0.13, where `reference` keeps those codes' whole mass (0, 0.05, 0.10, 0.02, 0.10, 0.03) / 0.30."""
    q = torch.tensor([0.40, 0.10, 0.05, 0.05, 0.10, 0.30], dtype=F64)
    a, c, m = accept_probability(P6, q, torch.tensor(0), T6, LUMINA)
    assert (int(m), a.item()) == (1, pytest.approx(0.32 / 0.40))
    want = torch.tensor([0, 0, 0, 0, 0.10, 0.03], dtype=F64) / 0.13
    assert torch.allclose(residual(P6, q, 0, 1, T6, LUMINA), want)
    assert torch.allclose(authors_lumina_level(P6, q, [0], T6, 2, 0.03, [0.9])[1], want)
    # deterministic drafts (their dynamic tree): the reference residual
    assert torch.equal(residual(P6, None, 0, 1, T6, LUMINA), residual(P6, None, 0, 1, T6, REF))
    # not relaxed: exact SD's residual
    loose = AcceptRule("lantern", delta=0.01, k=2, residual="lumina")
    exact_sd = torch.tensor([0, 0, 0.05, 0, 0.10, 0.03], dtype=F64) / 0.18
    assert torch.allclose(residual(P6, q, 0, 0, T6, loose), exact_sd)
    # everything zeroed: uniform, as their torch.ones_like
    assert torch.equal(residual(P6, P6.clone(), 5, 1, T6, LUMINA), torch.full((6,), 1 / 6, dtype=F64))


@pytest.mark.parametrize("static", [True, False])
@pytest.mark.parametrize("bound", [0.05, 0.2, 3.0])  # LANTERN's delta, and LANTERN++'s lam as their delta > 1
def test_lumina_siblings_equal_the_authors_loop(static, bound):
    """Random (p, q) pairs and candidate lists: verify_candidates under residual `lumina` accepts the candidate the
    authors' loop accepts and leaves the same target, for LANTERN and LANTERN++ bounds, static and dynamic trees."""
    g = torch.Generator().manual_seed(7 + int(10 * bound) + static)
    V, k = 9, 3
    rule = (AcceptRule("lanternpp", lam=bound, k=k, residual="lumina") if bound > 1
            else AcceptRule("lantern", delta=bound, k=k, residual="lumina"))
    outcomes = set()
    for trial in range(60):
        p, table = rand_dist(g, V, zeros=trial % 3), rand_table(g, V)
        q = rand_dist(g, V) if static else None
        cands = torch.randperm(V, generator=g)[:4].tolist()
        u = torch.rand(4, generator=g, dtype=F64).tolist()
        j, got = verify_candidates(p, q, cands, table, rule, u)
        want_j, want = authors_lumina_level(p, q, cands, table, k, bound, u)
        assert j == want_j
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
        outcomes.add(j)
    assert -1 in outcomes and len(outcomes) >= 3  # rejections of every candidate and acceptances were exercised


def test_lumina_is_exact_without_relaxation_and_unbounded_with_it():
    """m* = 0: one verification emits p exactly. Relaxed, it keeps no TV bound: a draft that borrows nothing (its
    nearest code has no mass, so m* = 1, c = 0) zeroes code 2's 0.3 in p, the residual max(p' - q', 0) is empty and
    falls back to uniform: TV 0.075 at delta 0.01 (0.125 with a second sibling), and code 1, outside p's support, is
    emitted. `reference` (zeroing in q') and `bounded` emit p exactly here."""
    g = torch.Generator().manual_seed(3)
    for _ in range(10):
        p, q, table = rand_dist(g, 6), rand_dist(g, 6, zeros=1), rand_table(g, 6)
        rule = AcceptRule("lantern", delta=float(p.min()) * 0.5, k=3, residual="lumina")
        assert torch.allclose(emitted_without_replacement(p, q, 1, table, rule), p, atol=1e-12)
    p = torch.tensor([0.5, 0.0, 0.3, 0.2], dtype=F64)
    q = torch.tensor([0.6, 0.1, 0.1, 0.2], dtype=F64)
    table = torch.tensor([[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]])
    emitted = {mode: [emitted_without_replacement(p, q, n, table, AcceptRule("lantern", delta=0.01, k=1,
                                                                                residual=mode)) for n in (1, 2)]
               for mode in ("lumina", "reference", "bounded")}
    one, two = emitted["lumina"]
    assert torch.allclose(one, torch.tensor([0.525, 0.025, 0.225, 0.225], dtype=F64))
    assert tv(one, p) == pytest.approx(0.075) and tv(two, p) == pytest.approx(0.125) and two[1] > 0
    assert all(torch.allclose(e, p, atol=1e-12) for mode in ("reference", "bounded") for e in emitted[mode])


@pytest.mark.parametrize("residual_mode", ["bounded", "reference", "lumina"])
def test_compact_int16_tables_give_the_same_answers(residual_mode):
    rule = AcceptRule("lantern", delta=0.1, k=3, residual=residual_mode)
    q = torch.tensor([0.40, 0.10, 0.05, 0.05, 0.10, 0.30], dtype=F64)
    small = T6.to(torch.int16)
    for x in range(6):
        c, m = relaxed_mass(P6, torch.tensor(x), T6, rule)
        c16, m16 = relaxed_mass(P6, torch.tensor(x), small, rule)
        assert c.item() == c16.item() and int(m) == int(m16)
        for qq in (None, q):
            assert torch.equal(residual(P6, qq, x, int(m), T6, rule), residual(P6, qq, x, int(m), small, rule))
    assert torch.equal(greedy_accept(P6.expand(6, -1), torch.arange(6), small, rule),
                       greedy_accept(P6.expand(6, -1), torch.arange(6), T6, rule))


@pytest.mark.parametrize("residual_mode", ["bounded", "reference", "lumina"])
@pytest.mark.parametrize("with_q", [True, False])
def test_residual_rows_equal_residual_row_by_row(residual_mode, with_q):
    """The device-side batched residual (chains accept every image at once) gives `residual`'s numbers, including
    rows with no relaxation (m* = 0) and rows left with no mass (the fallbacks)."""
    from lantern.engine.rules.acceptance import residual_rows

    g = torch.Generator().manual_seed(4)
    V, n = 12, 40
    table = torch.stack([row[row != i][:5] for i, row in enumerate(torch.stack([torch.randperm(V, generator=g)
                                                                                 for _ in range(V)]))])
    p = torch.rand(n, V, generator=g, dtype=torch.float64) ** 3
    p[:, :3] = 0.0
    p /= p.sum(-1, keepdim=True)
    q = torch.rand(n, V, generator=g, dtype=torch.float64)
    q /= q.sum(-1, keepdim=True)
    q[0] = p[0] + 0.0  # max(p - q, 0) = 0 after x: the fallback
    x = torch.randint(V, (n,), generator=g)
    m = torch.randint(0, 4, (n,), generator=g)
    rule = AcceptRule("lantern", delta=0.3, k=3, residual=residual_mode)
    qq = q if with_q else None
    got = residual_rows(p, qq, x, m, table, rule)
    for i in range(n):
        want = residual(p[i], None if qq is None else q[i], int(x[i]), int(m[i]), table, rule)
        torch.testing.assert_close(got[i], want, rtol=0, atol=1e-15)


def test_device_draws_equal_sample_index():
    """sampling.draw (each row's uniform drawn ahead, Uniforms, then one draw on the device for all rows) picks
    sample_index's token for every row, zero-mass codes included; Uniforms.used leaves each generator where
    drawing one at a time leaves it."""
    from lantern.engine.decoding.sampling import Uniforms, draw

    g = torch.Generator().manual_seed(1)
    probs = torch.rand(300, 9, generator=g) ** 4
    probs[:, [0, 4, 8]] = 0.0
    gens = [torch.Generator().manual_seed(i) for i in range(300)]
    ahead = Uniforms(gens, 5, "cpu")
    got = draw(probs, ahead.u[:, 0])
    ahead.used([1] * 300)
    want = [sample_index(row, torch.Generator().manual_seed(i)) for i, row in enumerate(probs)]
    assert got.tolist() == want
    fresh = [torch.Generator().manual_seed(i) for i in range(3)]
    for f in fresh:
        torch.rand((), generator=f, dtype=torch.float64)
    assert all(torch.equal(gen.get_state(), f.get_state()) for gen, f in zip(gens, fresh))
