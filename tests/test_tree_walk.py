"""tree_rounds.walk, the sampled acceptance of many trees at once on the device, against the definition it batches:
each visited node's children tried one at a time with acceptance.verify_candidates (uniforms in order, one per
offered child), tree by tree. For every rule: acceptance.py's (exact, LANTERN with its shared sibling budget and
the authors' residual, LANTERN++) and the rules with a verification of their own (Cool-SD at the children's depth,
GSD, LANTERN-TV's relaxed target per node), with sampled (q) and deterministic (q None) children."""
import pytest
import torch

from lantern.engine import methods
from lantern.engine.decoding.tree_rounds import walk
from lantern.engine.rules.acceptance import AcceptRule, verify_candidates
from test_acceptance import rand_dist, rand_table

PATHS = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [1, 0, 0], [1, 0, 0, 0]]  # node i: PATHS[i]; a parent precedes
RULES = {
    "exact": AcceptRule(),
    "lantern": AcceptRule("lantern", delta=0.3, k=3),
    "lantern-reference": AcceptRule("lantern", delta=0.3, k=3, residual="reference"),
    "lanternpp": AcceptRule("lanternpp", lam=4.0, k=3, residual="reference"),
    "lanternpp-lumina": AcceptRule("lanternpp", lam=4.0, k=3, residual="lumina"),
    "coolsd": methods.rule(methods.normalize({"name": "coolsd", "drafting": "static", "scale": 2.0, "nu": 0.5})),
    "gsd": methods.rule(methods.normalize({"name": "gsd", "drafting": "static", "group": 4, "k": 3, "gap": 0.5})),
    "lanterntv": methods.rule(methods.normalize({"name": "lanterntv", "delta": 0.3, "k": 3})),
}


def shape():
    """Each node's children in rank order, row 0 for y: [1 + M] lists."""
    M = len(PATHS)
    kids = [[] for _ in range(M + 1)]
    for i, path in enumerate(PATHS):
        parent = PATHS.index(path[:-1]) + 1 if len(path) > 1 else 0
        kids[parent].append(i)
    return kids


def one_tree(P, q, X, ok, kids, q_row, u, table, rule):
    """The definition: walk down from y, verify_candidates at each node, the uniforms taken in order."""
    node, path, used = -1, [], 0
    while True:
        p, cands = P[node + 1], [c for c in kids[node + 1] if ok[c]]
        if not cands:
            return path, p, used
        qq = None if q is None else q[q_row[node + 1]]
        j, p = verify_candidates(p, qq, [int(X[c]) for c in cands], table, rule, u[used: used + len(cands)].tolist(),
                                 len(path))
        used += len(cands)
        if j < 0:
            return path, p, used
        node = cands[j]
        path.append(node)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("sampled", [True, False])
def test_walk_is_verify_candidates_tree_by_tree(rule, sampled):
    torch.manual_seed(11)
    g = torch.Generator().manual_seed(5)
    n, V, M, D = 24, 12, len(PATHS), 4
    rule, table = RULES[rule], rand_table(g, V)
    kids = shape()
    C = max(map(len, kids))
    # peaked targets, so that paths go deep; siblings carry distinct tokens
    P = torch.stack([torch.stack([rand_dist(g, V, alpha=0.15) for _ in range(M + 1)]) for _ in range(n)])
    q = torch.stack([torch.stack([rand_dist(g, V) for _ in range(M + 1)]) for _ in range(n)]) if sampled else None
    X = torch.zeros(n, M, dtype=torch.long)
    for i in range(n):
        for row, children in enumerate(kids):  # drawn without replacement from q, or deterministic near p's top
            if children:
                X[i, children] = torch.multinomial(P[i, row] if q is None else q[i, row], len(children),
                                                   generator=g)
    ok = torch.rand(n, M, generator=g, dtype=torch.float64) < 0.85
    q_row = torch.arange(M + 1).expand(n, M + 1)
    u = torch.rand(n, D * C + 1, generator=g, dtype=torch.float64)
    kid_t = torch.tensor([c + [-1] * (C - len(c)) for c in kids]).expand(n, M + 1, C)
    path, p, used = walk(P, q, X, ok, kid_t, q_row, u, table, rule, D)
    depths = []
    for i in range(n):
        want_path, want_p, want_used = one_tree(P[i], None if q is None else q[i], X[i], ok[i], kids, q_row[i], u[i],
                                                table, rule)
        assert path[i][path[i] >= 0].tolist() == want_path
        assert int(used[i]) == want_used
        torch.testing.assert_close(p[i], want_p, rtol=0, atol=1e-12)
        depths.append(len(want_path))
    assert max(depths) >= 2 and min(depths) == 0  # the cases reach below the root's children and reject there
