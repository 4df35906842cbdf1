"""The authors' pipeline where it differs from ours (issue #29): greedy tie-breaking on dynamic trees.

The authors' greedy path (jadohu/LANTERN, EAGLE-2's evaluate_posterior) scores every retrieve row, one per leaf in
node order, by its accepted prefix and takes the first row of the longest; reimplemented here from that rule.
"""

import pytest
import torch

from lantern.engine.acceptance import AcceptRule, greedy_accept
from lantern.engine.trees import Draft, _block, accept_greedy


def make_draft(tokens, parent, leaf_order=True):
    n = len(tokens)
    parent = torch.tensor(parent)
    depth = torch.ones(n, dtype=torch.long)
    anc = torch.eye(n, dtype=torch.bool)
    for i in range(n):
        if parent[i] >= 0:
            depth[i] = depth[parent[i]] + 1
            anc[i] |= anc[parent[i]]
    children = [[] for _ in range(n + 1)]
    for i, p in enumerate(parent.tolist()):
        children[p + 1].append(i)
    return Draft(tokens=torch.tensor(tokens), depth=depth, parent=parent, block=_block(anc), children=children,
                 leaf_order=leaf_order)


def authors_greedy(P, draft, table, rule):
    """evaluate_posterior's greedy branch over leaf-ordered retrieve rows: (accepted nodes, next distribution)."""
    n = len(draft.tokens)
    ok = greedy_accept(P[draft.parent + 1], draft.tokens, table, rule).tolist()
    noleaf = {p for p in draft.parent.tolist()}
    rows = []
    for i in range(n):  # leaves in node order, each row its path from y
        if i in noleaf:
            continue
        path, c = [], i
        while c >= 0:
            path.insert(0, c)
            c = int(draft.parent[c])
        rows.append(path)
    lengths = []
    for path in rows:
        a = 0
        while a < len(path) and ok[path[a]]:
            a += 1
        lengths.append(a)
    best = max(lengths)
    if best == 0:
        return [], P[0]
    row = rows[lengths.index(best)]  # argmax: the first row of the longest accepted prefix
    return row[:best], P[row[best - 1] + 1]


def ours_greedy(P, draft, table, rule):
    """The project's rule: the first node, in node order, among the deepest accepted."""
    ok = greedy_accept(P[draft.parent + 1], draft.tokens, table, rule).tolist()
    best, path = 0, []
    for i in range(len(draft.tokens)):
        chain, c = [], i
        while c >= 0:
            chain.insert(0, c)
            c = int(draft.parent[c])
        if all(ok[j] for j in chain) and len(chain) > best:
            best, path = len(chain), chain
    return path, (P[path[-1] + 1] if path else P[0])


def four_node_case():
    """Two accepted first drafts (tokens 1 and 2) whose children (8 under 1, 9 under 2) are both rejected; the
    leaf under token 2 comes first in node order. After 1 the target's argmax is 6, after 2 it is 7."""
    V = 10
    table = torch.tensor([[(x + j) % V for j in range(1, V)] for x in range(V)])
    table[1, 0] = table[2, 0] = 3  # both borrow code 3's mass at the root
    table[1, 1], table[2, 1] = 2, 1  # (keep every row a permutation of the other codes)
    table[1, 2:] = torch.tensor([c for c in range(V) if c not in (1, 3, 2)])
    table[2, 2:] = torch.tensor([c for c in range(V) if c not in (2, 3, 1)])
    P = torch.full((5, V), 0.05)
    P[0] = torch.tensor([0.05, 0.2, 0.2, 0.25, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05])
    P[1, 6] = 0.55  # after node 0 (token 1)
    P[2, 7] = 0.55  # after node 1 (token 2)
    P = P / P.sum(-1, keepdim=True)
    draft = make_draft([1, 2, 9, 8], [-1, -1, 1, 0])
    return P, draft, table


@pytest.mark.parametrize("residual, want", [("reference", [2, 7]), ("bounded", [1, 6])])
def test_four_node_tie_break(residual, want):
    """The issue's case: the authors emit 2 -> 7, the project 1 -> 6; the same accepted length."""
    P, draft, table = four_node_case()
    rule = AcceptRule("lantern", delta=0.3, k=1, residual=residual)
    path, nxt = accept_greedy(P, draft, table, rule)
    assert draft.tokens[path].tolist() + [int(nxt.argmax())] == want
    a_path, a_next = authors_greedy(P, draft, table, rule)
    assert draft.tokens[a_path].tolist() + [int(a_next.argmax())] == [2, 7]
    # a static tree's rows are sorted paths: its ties stay ours under either residual
    static = make_draft([1, 2, 9, 8], [-1, -1, 1, 0], leaf_order=False)
    path, nxt = accept_greedy(P, static, table, rule)
    assert static.tokens[path].tolist() + [int(nxt.argmax())] == [1, 6]


def random_case(g, V=6, n=10):
    parent = [-1] + [int(torch.randint(-1, min(i, 4), (), generator=g)) for i in range(1, n)]  # bushy, shallow
    draft = make_draft(torch.randint(0, V, (n,), generator=g).tolist(), parent)
    P = torch.distributions.Dirichlet(torch.full((V,), 1.0)).sample((n + 1,))
    table = torch.stack([torch.tensor([c for c in torch.randperm(V, generator=g).tolist() if c != x])
                         for x in range(V)])
    return P, draft, table


def test_random_trees_follow_the_authors_rows_under_reference():
    """On random trees: `reference` picks exactly the authors' row, `bounded` the first deepest node; they differ
    in some cases (so the test could fail) and never in the accepted length."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    differ = 0
    for _ in range(400):
        P, draft, table = random_case(g)
        ref = AcceptRule("lantern", delta=0.5, k=3, residual="reference")
        bnd = AcceptRule("lantern", delta=0.5, k=3, residual="bounded")
        got, nxt = accept_greedy(P, draft, table, ref)
        want, want_next = authors_greedy(P, draft, table, ref)
        assert got == want and torch.equal(nxt, want_next)
        ours, ours_next = accept_greedy(P, draft, table, bnd)
        o_path, o_next = ours_greedy(P, draft, table, bnd)
        assert ours == o_path and torch.equal(ours_next, o_next)
        assert len(ours) == len(got)
        differ += ours != got
    assert 20 <= differ < 400
