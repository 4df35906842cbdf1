"""LANTERN-TV (engine/rules/retarget.py): one relaxed target per position, TV <= delta for sampled drafts too.

Exact emitted distributions come from enumerating drafts (test_acceptance's helpers); the sampling path is checked
by chi-square against p~, and TV(emitted, p) <= delta is checked on cases where bounded LANTERN breaks it."""


import pytest
import torch

from lantern.engine.rules.acceptance import (AcceptRule, accept_probability, greedy_accept, residual, residual_rows,
                                       verify_candidates)
from lantern.engine.methods import normalize, rule as build_rule
from lantern.engine.rules.retarget import (RetargetRule, live_edges, neighbour_csr, neighbour_edges,
                                           padded_neighbours, retarget, retarget_padded)
from tiny import sample_index
from test_acceptance import F64, chi_square_pvalue, emitted_chain, rand_dist, rand_table, tv
from test_rules_peers import simulate


def tv_rule(delta, k):
    return build_rule(normalize({"name": "lanterntv", "delta": delta, "k": k}))


def overlap(a, b):
    return torch.minimum(a, b).sum().item()


def block_table(V, blocks):
    """Every code's nearest codes are those of its own block (in index order), then the rest."""
    rows = []
    for i in range(V):
        b = i * blocks // V
        same = [j for j in range(V) if j != i and j * blocks // V == b]
        rows.append(same + [j for j in range(V) if j * blocks // V != b])
    return torch.tensor(rows)


def escape_case():
    """test_acceptance's case where bounded LANTERN emits TV 0.1 at delta 0.01 with sampled drafts."""
    p = torch.cat([torch.full((10,), 0.01, dtype=F64), torch.full((10,), 0.09, dtype=F64)])
    q = torch.cat([torch.full((10,), 0.1, dtype=F64), torch.zeros(10, dtype=F64)])
    table = torch.stack([
        torch.tensor([(i + 1) % 10] + [j for j in range(20) if j not in (i, (i + 1) % 10)]) if i < 10
        else torch.tensor([j for j in range(20) if j != i]) for i in range(20)
    ])
    return p, q, table


@pytest.mark.parametrize("seed", range(6))
def test_retarget_keeps_its_invariants(seed):
    g = torch.Generator().manual_seed(seed)
    V, k, delta = 12, 2, [0.05, 0.2, 0.6][seed % 3]
    p, q, table = rand_dist(g, V), rand_dist(g, V, zeros=seed % 3), block_table(V, 3)
    pt = retarget(p, q, table, k, delta)
    assert pt.min() >= 0 and pt.sum().item() == pytest.approx(1.0, abs=1e-12)
    assert tv(pt, p) <= delta + 1e-12
    # mass leaves only p > q codes, arrives only at q > p codes, and never crosses a block (no edge crosses one)
    assert ((pt < p - 1e-15) <= (p > q)).all() and ((pt > p + 1e-15) <= (q > p)).all()
    for b in range(3):
        assert pt[4 * b: 4 * b + 4].sum().item() == pytest.approx(p[4 * b: 4 * b + 4].sum().item(), abs=1e-12)
    # what it optimises: the overlap with q grows by exactly the mass moved
    assert overlap(pt, q) == pytest.approx(overlap(p, q) + tv(pt, p), abs=1e-12)
    assert overlap(pt, q) >= overlap(p, q)


def test_the_chains_batched_residual_is_the_row_by_row_residual():
    """accept_chains retargets once and takes the exact rule's batched residual on the relaxed target: the
    residual `RetargetRule.residual` gives row by row."""
    g = torch.Generator().manual_seed(7)
    V, k, n = 24, 3, 6
    table = rand_table(g, V)
    p = torch.stack([rand_dist(g, V) for _ in range(n)])
    q = torch.stack([rand_dist(g, V, zeros=i % 3) for i in range(n)])
    x = torch.stack([torch.multinomial(q[i], 1, generator=g)[0] for i in range(n)])
    impl = RetargetRule(0.3, k)
    rows = residual_rows(impl.target(p, q, table), q, x, torch.zeros_like(x), table, AcceptRule("exact"))
    for i in range(n):
        torch.testing.assert_close(rows[i], impl.residual(p[i], q[i], int(x[i]), 0, table), rtol=0, atol=1e-15)
        assert rows[i][x[i]] == 0 and rows[i].sum().item() == pytest.approx(1.0, abs=1e-12)


def test_retarget_spends_the_budget_or_the_capacity_by_hand():
    p = torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=F64)
    q = torch.tensor([0.0, 0.0, 0.5, 0.5], dtype=F64)
    table = torch.tensor([[2, 1, 3], [3, 0, 2], [0, 1, 3], [1, 0, 2]])  # 0 <-> 2 and 1 <-> 3 at k = 1
    assert retarget(p, q, table, 1, 0.3).tolist() == pytest.approx([0.35, 0.35, 0.15, 0.15])
    assert retarget(p, q, table, 1, 1.0).tolist() == pytest.approx([0, 0, 0.5, 0.5])
    # a code listed only in the other's row still takes (edges run both ways): 3 lists 1 first, 1 does not list 3
    table = torch.tensor([[2, 1, 3], [0, 2, 3], [0, 1, 3], [1, 0, 2]])
    assert retarget(p, q, table, 1, 1.0).tolist() == pytest.approx([0, 0, 0.5, 0.5])
    src, dst = neighbour_edges(table, 1)
    assert sorted(zip(src.tolist(), dst.tolist())) == sorted([(0, 2), (1, 0), (2, 0), (3, 1), (2, 0), (0, 1),
                                                               (0, 2), (1, 3)])


@pytest.mark.parametrize("B, k, sources", [(1, 1, 12), (3, 4, 3), (5, 9, 1)])
def test_live_edges_run_from_the_largest_surpluses_into_deficits_in_order(B, k, sources):
    """live_edges lists, row by row and source by decreasing surplus, every neighbour_edges edge out of one of the
    row's `sources` largest surpluses into a deficit, in neighbour_edges' order: the order fixes retarget's float64
    sums."""
    g = torch.Generator().manual_seed(B * 10 + k)
    V = 12
    table = rand_table(g, V)
    give = torch.rand(B, V, generator=g, dtype=F64) * (torch.rand(B, V, generator=g) < 0.4)
    take = torch.rand(B, V, generator=g, dtype=F64) * ((give == 0) & (torch.rand(B, V, generator=g) < 0.7))
    src, dst = neighbour_edges(table, k)
    want = []
    for b in range(B):
        order = sorted((c for c in range(V) if give[b, c] > 0), key=lambda c: -give[b, c].item())[:sources]
        want += [(b, b * V + s, b * V + d) for a in order for s, d in zip(src.tolist(), dst.tolist())
                 if s == a and take[b, d] > 0]
    row, fsrc, fdst = live_edges(give, take, table, k, sources)
    assert list(zip(row.tolist(), fsrc.tolist(), fdst.tolist())) == want and want


def test_only_the_largest_surpluses_give():
    """sources = 1: the mass leaves the largest surplus alone; sources >= V is the full flow, where each code
    gives in proportion to its neighbours' deficits."""
    p = torch.tensor([0.4, 0.3, 0.1, 0.1, 0.1], dtype=F64)
    q = torch.tensor([0.1, 0.1, 0.1, 0.35, 0.35], dtype=F64)
    table = torch.tensor([[3, 4, 1, 2], [4, 3, 0, 2], [0, 1, 3, 4], [0, 1, 2, 4], [1, 0, 2, 3]])
    one = retarget(p, q, table, 1, 0.2, sources=1)  # 0 -> 3 only
    assert one.tolist() == pytest.approx([0.2, 0.3, 0.1, 0.3, 0.1])
    full = retarget(p, q, table, 1, 0.2)  # 0 -> 3 (0.25, 3's deficit) and 1 -> 4 (0.2), scaled into the budget
    s = 0.2 / 0.45
    assert full.tolist() == pytest.approx([0.4 - 0.25 * s, 0.3 - 0.2 * s, 0.1, 0.1 + 0.25 * s, 0.1 + 0.2 * s])
    assert torch.equal(retarget(p, q, table, 1, 0.2, sources=5), full)


def test_neighbour_csr_is_built_once_per_table_and_k():
    """LANTERN-TV's edges are not rebuilt per call: one CSR per (table object, k), dropped when the table is edited
    in place or gone; results are bit-identical to a first call on a fresh copy of the table."""
    import gc

    from lantern.engine.rules import retarget as module

    g = torch.Generator().manual_seed(7)
    V, k = 12, 4
    table = rand_table(g, V)
    p = torch.stack([rand_dist(g, V) for _ in range(3)])
    q = torch.stack([rand_dist(g, V, zeros=2) for _ in range(3)])

    def edges(csr):
        start, adj = csr
        return [(a, int(b)) for a in range(V) for b in adj[start[a]:start[a + 1]]]

    first = module.neighbour_csr(table, k)
    assert module.neighbour_csr(table, k) is first and module.neighbour_csr(table, 2) is not first
    src, dst = neighbour_edges(table, k)
    assert edges(first) == sorted(zip(src.tolist(), dst.tolist()), key=lambda e: e[0])  # stable: each list in order
    want = retarget(p, q, table.clone(), k, 0.2)  # a new table object: built afresh
    assert all(torch.equal(retarget(p, q, table, k, 0.2), want) for _ in range(3))
    assert module.neighbour_csr(table, k) is first  # the calls above reused it
    table[0] = table[0].flip(0)  # edited in place: rebuilt
    src, dst = neighbour_edges(table, k)
    assert edges(module.neighbour_csr(table, k)) == sorted(zip(src.tolist(), dst.tolist()), key=lambda e: e[0])
    del table
    gc.collect()
    other = rand_table(g, V)
    module.neighbour_csr(other, k)
    assert all(ref() is not None for ref, _, _ in module._KEPT.values())  # entries of dead tables pruned


def peaked(g, shape, V):
    """Random distributions [*shape, V] with a few exact zeros: few codes hold the surplus, as in a decode."""
    d = torch.rand(*shape, V, generator=g, dtype=F64) ** 6 * (torch.rand(*shape, V, generator=g) > 0.1)
    return d / d.sum(-1, keepdim=True)


@pytest.mark.parametrize("k", [1, 4, 11])
def test_padded_neighbours_rows_are_the_csr_slices(k):
    """Row a of the padded adjacency is neighbour_csr's slice for a, in order, then the sentinel V up to D, the
    largest degree, which is >= k (so RetargetRule.target's width check reads it as a table)."""
    g = torch.Generator().manual_seed(k)
    V = 12
    table = rand_table(g, V)
    adj = padded_neighbours(table, k)
    start, dst = neighbour_csr(table, k)
    degree = (start[1:] - start[:-1]).tolist()
    assert adj.dtype == torch.int32 and adj.shape == (V, max(degree)) and adj.shape[1] >= k
    for a in range(V):
        assert adj[a, :degree[a]].tolist() == dst[start[a]:start[a + 1]].tolist()
        assert (adj[a, degree[a]:] == V).all()


@pytest.mark.parametrize("seed, shape, V, k, sources", [
    (0, (4,), 12, 1, 64),  # k = 1
    (1, (3, 5), 16, 15, 64),  # k = V - 1: every code neighbours every other, twice
    (2, (2, 3), 16, 3, 16),  # sources = V: the full flow
    (3, (3, 5), 64, 4, 5),  # a chain round's [n, G, V]
    (4, (6,), 40, 2, 1),
    (5, (2, 2), 30, 7, 100),  # sources > V
])
def test_retarget_padded_is_retarget_bit_for_bit(seed, shape, V, k, sources):
    """The fixed-shape form gives retarget's p~ exactly on a CPU in float64: dead edges add exact zeros to sums
    taken in the same order. Rows with no surplus (q = p) and rows at small and large budgets included."""
    g = torch.Generator().manual_seed(seed)
    table = rand_table(g, V)
    adj = padded_neighbours(table, k)
    p, q = peaked(g, shape, V), peaked(g, shape, V)
    q.reshape(-1, V)[0] = p.reshape(-1, V)[0]  # a row with no surplus: p~ = p
    for delta in (0.01, 0.2, 1.0):
        want = retarget(p, q, table, k, delta, sources=sources)
        got = retarget_padded(p, q, adj, delta, sources=sources)
        assert got.shape == p.shape and torch.equal(got, want)
        assert torch.equal(got.reshape(-1, V)[0], p.reshape(-1, V)[0])
    assert torch.equal(retarget_padded(p.float(), q.float(), adj, 0.2), retarget(p.float(), q.float(), table, k, 0.2))


def test_graph_form_reads_the_padded_adjacency_and_gives_the_eager_rule():
    """graph_form: the rule a graph round runs (the padded adjacency in place of the table), with the eager rule's
    target, greedy test, acceptance probabilities and residuals; an unrelaxed rule comes back as it is."""
    g = torch.Generator().manual_seed(5)
    V, k = 20, 3
    table = rand_table(g, V)
    rule = RetargetRule(0.2, k)
    impl, adj = rule.graph_form(table)
    assert impl.padded and not rule.padded and torch.equal(adj, padded_neighbours(table, k))
    assert impl.graph_form(adj) == (impl, adj)  # a graph form is its own
    assert (impl.describe(), impl.table_width, impl.relaxed) == (rule.describe(), rule.table_width, rule.relaxed)
    p, q = peaked(g, (4,), V), peaked(g, (4,), V)
    x = q.argmax(-1)
    assert torch.equal(impl.target(p, q, adj), rule.target(p, q, table))
    assert torch.equal(impl.greedy_accept(p, x, adj), rule.greedy_accept(p, x, table))
    for a, b in zip(impl.accept_probability(p, q, x, adj), rule.accept_probability(p, q, x, table)):
        assert torch.equal(a, b)
    for i in range(4):
        assert torch.equal(impl.residual(p[i], q[i], int(x[i]), 0, adj), rule.residual(p[i], q[i], int(x[i]), 0, table))
        assert torch.equal(impl.residual(p[i], None, int(x[i]), 0, adj), rule.residual(p[i], None, int(x[i]), 0, table))
    exact = RetargetRule(0.0, k)
    assert exact.graph_form(table) == (exact, table) and RetargetRule(0.2, 0).graph_form(None)[1] is None
    with pytest.raises(ValueError, match=">= 3 columns"):
        rule.graph_form(None)


def test_the_padded_target_compiles_into_one_graph():
    """graph_form's rule runs inside torch.compile(fullgraph=True, dynamic=False) (inductor on this CPU), as the
    chain round's graph calls it: target and greedy test over a chain round's [n, G, V], equal to eager retarget's."""
    g = torch.Generator().manual_seed(0)
    V, k, delta = 64, 4, 0.2
    table = rand_table(g, V)
    impl, adj = RetargetRule(delta, k).graph_form(table)
    p, q = peaked(g, (3, 5), V), peaked(g, (3, 5), V)
    x = q.argmax(-1)
    fn = lambda p, q, x, adj: (impl.target(p, q, adj), impl.greedy_accept(p, x, adj))  # noqa: E731
    pt, ok = torch.compile(fn, fullgraph=True, dynamic=False)(p, q, x, adj)
    torch.testing.assert_close(pt, retarget(p, q, table, k, delta), rtol=0, atol=1e-12)
    point = torch.zeros_like(p).scatter(-1, x[..., None], 1.0)
    assert torch.equal(ok, retarget(p, point, table, k, delta).argmax(-1) == x)


@pytest.mark.parametrize("seed", range(4))
def test_sampled_drafts_emit_the_relaxed_target_within_delta(seed):
    g = torch.Generator().manual_seed(seed)
    V, k, delta = 10, 3, 0.15
    p, q, table = rand_dist(g, V), rand_dist(g, V, zeros=2), rand_table(g, V)
    E = emitted_chain(p, q, table, tv_rule(delta, k))
    assert E.tolist() == pytest.approx(retarget(p, q, table, k, delta).tolist(), abs=1e-12)
    assert tv(E, p) <= delta + 1e-12


def test_where_bounded_lantern_escapes_the_bound_lanterntv_does_not():
    p, q, table = escape_case()
    assert tv(emitted_chain(p, q, table, AcceptRule("lantern", delta=0.01, k=1)), p) == pytest.approx(0.1)
    E = emitted_chain(p, q, table, tv_rule(0.01, 1))
    assert tv(E, p) == pytest.approx(0.01)  # the budget is spent, and no more
    # with a budget the neighbourhood cannot fill, lanterntv is still a valid distribution that moves <= delta
    E = emitted_chain(p, q, table, tv_rule(0.5, 1))
    assert E.sum().item() == pytest.approx(1.0) and tv(E, p) <= 0.5 + 1e-12


def test_sampling_path_chi_square_matches_the_relaxed_target_and_stays_within_delta():
    g = torch.Generator().manual_seed(11)
    p, q, table = escape_case()
    rule, n = tv_rule(0.05, 2), 6000
    counts = simulate(p, q, table, rule, n, g)
    pt = retarget(p, q, table, 2, 0.05)
    assert chi_square_pvalue(counts, pt) > 1e-3
    assert chi_square_pvalue(counts, p) < 1e-6  # it is relaxed: p itself is rejected
    assert tv(pt, p) <= 0.05 + 1e-12


def test_sibling_verification_emits_the_relaxed_target():
    """Static trees (candidates drawn from q without replacement) and deterministic top-k siblings (q None)."""
    g = torch.Generator().manual_seed(3)
    V, k, delta, n = 8, 2, 0.2, 5000
    p, q, table = rand_dist(g, V), rand_dist(g, V), rand_table(g, V)
    rule = tv_rule(delta, k)
    counts = torch.zeros_like(p)
    for _ in range(n):
        cands = torch.multinomial(q.float(), 3, replacement=False, generator=g).tolist()
        u = torch.rand(3, generator=g, dtype=F64).tolist()
        j, r = verify_candidates(p, q, cands, table, rule, u)
        counts[cands[j] if j >= 0 else sample_index(r, g)] += 1
    assert chi_square_pvalue(counts, retarget(p, q, table, k, delta)) > 1e-3
    # deterministic siblings (q None): p~ moves mass onto the candidate set and is emitted exactly
    cands, indicator = [0, 3], torch.zeros_like(p)
    indicator[cands] = 1.0
    pt = retarget(p, indicator, table, k, delta)
    assert pt[cands].sum() > p[cands].sum() and tv(pt, p) <= delta + 1e-12
    counts = torch.zeros_like(p)
    for _ in range(n):
        j, r = verify_candidates(p, None, cands, table, rule, torch.rand(2, generator=g, dtype=F64).tolist())
        counts[cands[j] if j >= 0 else sample_index(r, g)] += 1
    assert chi_square_pvalue(counts, pt) > 1e-3


def test_greedy_target_is_the_point_mass_retarget():
    p = torch.tensor([0.30, 0.25, 0.20, 0.15, 0.10], dtype=F64)
    table = torch.tensor([[1, 2, 3, 4], [2, 0, 3, 4], [1, 3, 0, 4], [2, 4, 0, 1], [3, 2, 0, 1]])
    x = torch.tensor([1, 1, 2, 4])
    P = p.expand(4, -1)
    # x = 1 takes up to delta from 0 and 2 (its neighbours at k = 1, both ways): 0.25 + 0.06 beats 0.30 - 0.036
    assert greedy_accept(P, x, table, tv_rule(0.06, 1)).tolist() == [True, True, False, False]
    assert greedy_accept(P, x, table, tv_rule(0.01, 1)).tolist() == [False] * 4
    assert greedy_accept(P[:1], torch.tensor([0]), table, tv_rule(0.0, 1)).tolist() == [True]


@pytest.mark.parametrize("delta, k", [(0.0, 3), (0.3, 0)])
def test_no_relaxation_is_exact_decoding(delta, k):
    g = torch.Generator().manual_seed(1)
    p, q = rand_dist(g, 9), rand_dist(g, 9)
    rule, exact = tv_rule(delta, k), AcceptRule("exact")
    assert not rule.relaxed and rule.describe() == "exact" and rule.table_width == 0
    X = torch.arange(9)
    assert accept_probability(p.expand(9, -1), q.expand(9, -1), X, None, rule)[0].tolist() == \
        accept_probability(p.expand(9, -1), q.expand(9, -1), X, None, exact)[0].tolist()
    for x in range(9):
        assert residual(p, q, x, 0, None, rule).tolist() == pytest.approx(residual(p, q, x, 0, None, exact).tolist())


def test_bound_and_mass_hold_at_real_codebook_sizes():
    """The bound and total mass at the toy's and LlamaGen's codebook sizes (speed: benchmarks/bench_rules.py, never
    a timed test)."""
    g = torch.Generator().manual_seed(0)
    for V, rows in ((512, 5), (16384, 1)):
        table = torch.stack([torch.randperm(V, generator=g)[:50] for _ in range(V)]).to(torch.int16)
        p = torch.softmax(torch.randn(rows, V, generator=g), -1)
        q = torch.softmax(torch.randn(rows, V, generator=g), -1)
        pt = retarget(p, q, table, 50, 0.2)
        assert (0.5 * (pt - p).abs().sum(-1) <= 0.2 + 1e-5).all()
        assert (pt.sum(-1) - 1).abs().max() < 1e-5


def test_registry_spec_and_rule():
    spec = normalize({"name": "lanterntv", "delta": 0.1, "k": 5})
    rule = build_rule(spec)
    assert isinstance(rule.impl, RetargetRule) and rule.table_width == 5 and rule.relaxed
    assert rule.describe() == "lanterntv(delta=0.1, k=5)"
