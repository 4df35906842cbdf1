"""Static draft-tree shapes as data (rank paths, see trees.py), and the check of a custom one: importable without
torch, so that config validation (at every Snakemake start) checks a sweep's trees cheaply."""

from __future__ import annotations

from lantern.errors import UserError

# The authors' sparse trees draw each parent's children from its top TOPK = 10 (models/drafters/utils_c.py).
STATIC_TOP_K = 10
# parent rank path -> number of children (ranks 0 .. c - 1); the authors' tree, one depth per line
NAIVE_EXTEND_57 = {
    (): 5,
    (0,): 4, (1,): 3, (2,): 3, (3,): 2, (4,): 1,
    (0, 0): 4, (0, 1): 3, (0, 2): 3, (0, 3): 2, (1, 0): 2, (1, 1): 1, (2, 0): 1,
    (0, 0, 0): 4, (0, 0, 1): 3, (0, 0, 2): 2, (0, 0, 3): 1, (0, 1, 0): 2, (0, 1, 1): 1, (0, 2, 0): 1,
    (0, 0, 0, 0): 3, (0, 0, 0, 1): 2, (0, 0, 1, 0): 2, (0, 0, 1, 1): 1, (0, 0, 2, 0): 1,
}
# The authors' Lumina-mGPT static tree (EAGLE-1's mc_sim_7b_63, 25 nodes, 4 / 8 / 8 / 3 / 2 per depth; their
# eagle_version 1 default for Lumina-mGPT-7B-768), written the same way
MC_SIM_7B_63 = {
    (): 4,
    (0,): 3, (1,): 2, (2,): 2, (3,): 1,
    (0, 0): 3, (0, 1): 2, (0, 2): 2, (1, 0): 1,
    (0, 0, 0): 3,
    (0, 0, 0, 0): 2,
}
# A CPU-sized shape: the two top-ranked first drafts, each continued by the drafter's top choice to depth 8. On a
# CPU verifying a node costs real compute (59 nodes cost about 4 vanilla steps for the toy target), while under
# relaxed acceptance nearly every top-ranked draft passes, so depth pays and width does not.
TWIN_CHAIN_8 = [(r,) + (0,) * j for r in (0, 1) for j in range(8)]
SHAPES = ("naive_extend_57", "mc_sim_7b_63", "twin_chain_8", "chain")


def validate_tree_paths(paths) -> list[tuple[int, ...]]:
    """A custom static tree (a list of rank paths) checked, as tuples sorted by depth, then lexicographically
    (parents before children, siblings by rank; the authors' order). Raises a one-line UserError otherwise."""
    if not isinstance(paths, (list, tuple)) or not paths:
        raise UserError("a static tree must be a non-empty list of rank paths such as [[0], [1], [0, 0]]")
    out = set()
    for p in paths:
        if not isinstance(p, (list, tuple)) or not p or any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in p):
            raise UserError(f"static tree path {p!r} must be a non-empty list of ranks (integers >= 0)")
        if max(p) >= STATIC_TOP_K:
            raise UserError(f"static tree path {list(p)} uses rank {max(p)}; ranks must be < {STATIC_TOP_K} "
                            f"(children come from the parent's drafter top-{STATIC_TOP_K})")
        if tuple(p) in out:
            raise UserError(f"static tree path {list(p)} appears twice")
        out.add(tuple(p))
    for p in out:
        if len(p) > 1 and p[:-1] not in out:
            raise UserError(f"static tree path {list(p)} has no parent {list(p[:-1])}; add it")
        if p[-1] > 0 and p[:-1] + (p[-1] - 1,) not in out:
            raise UserError(f"static tree path {list(p)} skips rank {p[-1] - 1}: children must take ranks 0 .. c - 1")
    return sorted(out, key=lambda p: (len(p), p))
