"""Draft trees: static shapes (EAGLE-1, LANTERN++) and dynamic trees (EAGLE-2), verified in one target forward.

One round, with y the newest token at target position Q (not yet fed to the target), as in speculative.py (the
batched rounds: tree_rounds.py):
1. draft: the drafter catches up over the last accepted path with the target's true hidden states (one forward),
   then grows the tree a level at a time: one drafter forward over the nodes of a depth that get children, each
   node reading its parent's predicted hidden state at drafter position Q + depth - 1 and seeing its ancestors;
2. verify: one target forward over [y, nodes] at RoPE positions Q + depth, written to cache slots Q, Q + 1, ..,
   with a tree mask (a node sees the committed prefix, y, its ancestors and itself);
3. accept: greedy keeps the deepest node whose whole path passes the (relaxed) greedy test, the longest accepted
   path; sampling walks down from y, trying each node's children in order with multi-candidate verification
   (acceptance.verify_candidates), and ends on a correction drawn from the residual or a bonus token below an
   accepted leaf; greedy emits the target's argmax after the path;
4. commit: the accepted nodes' cache entries move into slots Q + 1 .. Q + a (model.keep_rows); the next catch-up
   rewrites the drafter's.

Children of a node: under greedy, and on every dynamic tree, the parent's top-ranked drafter tokens, verified as
deterministic drafts (q = 1: a rejected token leaves p, which is renormalised). Under sampling a static tree draws
children from the drafter distribution without replacement (successive inverse-CDF draws, one uniform per child
from the image's generator: the law of ordered Gumbel-top-k) and keeps the parent's q: verification tries child j
with its conditional draft probability q(x_j) / (1 - q(x_1) - .. - q(x_{j-1})) and residualises p and q after each
rejection.

Static shapes are rank paths: (0, 2) is the third-ranked child of the root's top-ranked child. Every parent's
child ranks must be 0 .. c - 1 (successive draws) and below STATIC_TOP_K. `naive_extend_57` (the default) is the
authors' LANTERN++ tree, node for node (naive_extend_57 in jadohu/LANTERN models/drafters/choices.py): 57 nodes,
depth 5, 5 / 13 / 16 / 14 / 9 nodes per depth, ranks within the parent's top 5, widest near the root and along
the top-ranked path. `mc_sim_7b_63` (EAGLE-1's tree, the authors' Lumina-mGPT default): 25 nodes, depth 5,
4 / 8 / 8 / 3 / 2 per depth, ranks within the parent's top 4. `twin_chain_8` (16 nodes, depth 8) suits CPUs
(see below); `chain` is a depth-gamma chain.
Dynamic trees (EAGLE-2, the authors' parameter names): the root's top_k children, then `depth` expansions, each
running the drafter on the top_k frontier nodes by cumulative drafter log-probability and offering each one's
top_k children; the best total_tokens - 1 of all offered nodes form the tree (drafts reach depth + 1).
Stats (stats.ImageStats): accepted_per_step = drafts accepted per round, the accepted depth; tree_depth = the
deepest drafted node.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lantern.engine.rules.acceptance import AcceptRule
from lantern.engine.models.model import GPT
from lantern.engine.decoding.sampling import SamplingParams, draw
from lantern.engine.decoding.tree_shapes import (MC_SIM_7B_63, NAIVE_EXTEND_57, SHAPES, STATIC_TOP_K,  # noqa: F401
                                                 TWIN_CHAIN_8, validate_tree_paths)
from lantern.errors import UserError

def _paths_of(children: dict) -> list[tuple[int, ...]]:
    return [parent + (r,) for parent, c in children.items() for r in range(c)]


@dataclass
class Draft:
    """One round's tree over [y, nodes]; node i sits in row / slot offset i + 1, parents before children."""

    tokens: Tensor  # [n]
    depth: Tensor  # [n], >= 1
    parent: Tensor  # [n], -1: a child of y
    block: Tensor  # [n + 1, n + 1] bool: ancestors and self over [y, nodes]
    children: list[list[int]] | None  # children[i + 1] of node i (children[0]: of y), in the order they are tried
    q: Tensor | None = None  # [rows, V] drafter distributions children were sampled from; None: deterministic
    q_row: list[int] | None = None  # row of q for [y, nodes]
    drafter_passes: int = 0
    # The authors' greedy candidates for this tree are its leaves in node order (EAGLE-2's retrieve_indices, which
    # their greedy path does not re-sort); False where their rows are sorted paths (static trees), whose first
    # deepest accepted path is already the first deepest node.
    leaf_order: bool = False
    ok: Tensor | None = None  # [n] bool: a sampled child drawn from mass left in q (others are never offered)
    kids: Tensor | None = None  # [n + 1, c] the children on the device, -1 padded (when `children` is None)

    def child_lists(self) -> list[list[int]]:
        if self.children is None:
            self.children = [[c for c in row if c >= 0] for row in self.kids.tolist()]
        return self.children


@dataclass
class TreePass:
    """One drafter pass a tree's growth asks for, relative to y's target position Q: nodes `tokens` [S] at drafter
    position Q + pos, written to drafter cache slots Q + slots [S], each seeing the committed prefix and the tree
    slots anc [S, m] from Q on, and reading its parent's predicted hidden state hidden [R, S, d]. Its answer: the
    predicted hidden states [R, S, d] and their distributions [S, V] (row_probs at image-token index
    n_done + pos + 1). tree_rounds.TreeRounds runs the passes of every growing image in one drafter forward."""

    tokens: Tensor
    hidden: Tensor
    pos: int
    slots: Tensor
    anc: Tensor


class TreeShape:
    """A draft tree's shape: `growth` is its own drafting, a generator of the drafter passes it needs (TreePass)
    that returns the Draft (tree_rounds.TreeRounds runs it, and accepts the drafts, for a batch). A shape
    names its reserved cache slots: target_extra (its nodes) and drafter_extra (the nodes its drafter passes
    write)."""

    skip_every = 0  # VVS: every skip_every-th round commits a drafted path unverified (skipping.py); 0: never
    skip_similarity = None  # VVS: or skip when the paths' similarity reaches this (with skip_codebook [V, D])
    skip_codebook = None

    def check(self, target: GPT) -> None:
        if self.max_rank >= target.args.vocab_size:
            raise UserError(f"{self.describe()} drafts rank {self.max_rank}, beyond the vocabulary of "
                            f"{target.args.vocab_size}")


@dataclass
class _Level:
    """Depth d + 1 of a static shape: nodes lo..hi-1, drawn from the q rows of depth d's runners."""

    lo: int
    hi: int
    width: int  # top ranks to draw per parent
    parent_row: Tensor  # row of each node's parent among depth d's runners
    rank: Tensor
    runners: Tensor  # node indices at depth d + 1 that have children
    runner_parent_row: Tensor  # their parents' rows among depth d's runners
    runner_anc: Tensor  # [runners, n] their ancestors and themselves


class StaticTree(TreeShape):
    """A static draft shape from rank paths; masks, levels and gather indices are computed once, on `device`."""

    def __init__(self, paths, name: str = "custom", device="cpu"):
        self.name, self.device = name, torch.device(device)
        paths = validate_tree_paths(paths)
        index = {p: i for i, p in enumerate(paths)}
        self.paths, self.n, self.depth = paths, len(paths), max(len(p) for p in paths)
        parent = [index.get(p[:-1], -1) for p in paths]
        self.children: list[list[int]] = [[] for _ in range(self.n + 1)]
        for i, p in enumerate(parent):
            self.children[p + 1].append(i)
        anc = torch.eye(self.n, dtype=torch.bool)
        for i, p in enumerate(parent):
            if p >= 0:
                anc[i] |= anc[p]
        host: list[Tensor] = []  # every index tensor of the shape, sent to the device in one copy below

        def t(x, dtype=torch.long) -> int:
            host.append(torch.as_tensor(x, dtype=dtype))
            return len(host) - 1

        parent_t, depths_t, anc_t, block_t = t(parent), t([len(p) for p in paths]), t(anc, torch.bool), \
            t(_block(anc), torch.bool)
        # runners: nodes that get children, in node order; their q rows are [y, runners of depth 1, 2, ..]
        runners = [[-1]] + [[i for i in range(self.n) if len(paths[i]) == d and self.children[i + 1]]
                            for d in range(1, self.depth)] + [[]]
        row_of = {r: j for j, r in enumerate(r for rs in runners for r in rs)}
        self.q_row = [row_of.get(i - 1, -1) for i in range(self.n + 1)]
        levels = []
        for d in range(self.depth):
            nodes = [i for i in range(self.n) if len(paths[i]) == d + 1]
            within = {r: j for j, r in enumerate(runners[d])}
            nxt = runners[d + 1]
            levels.append(dict(
                lo=nodes[0], hi=nodes[-1] + 1, width=max(paths[i][-1] for i in nodes) + 1,
                parent_row=t([within[parent[i]] for i in nodes]), rank=t([paths[i][-1] for i in nodes]),
                runners=t(nxt), runner_parent_row=t([within[parent[i]] for i in nxt]),
                runner_anc=t(anc[nxt], torch.bool),
            ))
        flat = torch.cat([h.long().flatten() for h in host]).to(self.device)
        dev = [f.view(h.shape) if h.dtype == torch.long else (f != 0).view(h.shape)
               for f, h in zip(flat.split([h.numel() for h in host]), host)]
        self.parent, self.depths, self.anc, self.block = (dev[i] for i in (parent_t, depths_t, anc_t, block_t))
        self.levels = [_Level(**{k: dev[v] if k not in ("lo", "hi", "width") else v for k, v in lvl.items()})
                       for lvl in levels]
        # the most children of any node at each depth (the root's first), 0 for the leaves' depth: a sampled walk
        # down the tree tries at most this many children per step (tree_rounds.walk)
        self.fanout = [max(len(self.children[i + 1]) for i in range(self.n) if len(paths[i]) == d) if d else
                       len(self.children[0]) for d in range(self.depth)] + [0]
        self._cut: dict[int, StaticTree] = {}
        self._on: dict[torch.device, StaticTree] = {}

    def to(self, device) -> "StaticTree":
        """The shape on `device`, made once per device (a compiled round keys its graph on the shape object)."""
        device = torch.device(device)
        if device == self.device:
            return self
        if device not in self._on:
            self._on[device] = StaticTree(self.paths, self.name, device)
            self._on[device].skip_every, self._on[device].skip_similarity = self.skip_every, self.skip_similarity
            self._on[device].skip_codebook = None if self.skip_codebook is None else self.skip_codebook.to(device)
        return self._on[device]

    @property
    def max_rank(self) -> int:
        return max(p[-1] for p in self.paths)

    @property
    def nodes(self) -> int:
        return self.n

    @property
    def target_extra(self) -> int:
        return self.n

    @property
    def drafter_extra(self) -> int:  # a runner's drafter pass writes slot Q + its node index
        return self.n

    def upto(self, depth: int) -> "StaticTree":
        """The shape cut at `depth` (the last rounds of an image have fewer tokens left to draft)."""
        if depth >= self.depth:
            return self
        if depth not in self._cut:
            self._cut[depth] = StaticTree([p for p in self.paths if len(p) <= depth], self.name, self.device)
        return self._cut[depth]

    def describe(self) -> str:
        return f"static tree {self.name} ({self.n} nodes, depth {self.depth})"

    def uniforms(self, max_depth: int) -> int:
        """Uniforms a sampled growth of the shape cut at max_depth draws: `width` per row of every level."""
        total, rows = 0, 1
        for lvl in self.upto(max_depth).levels:
            total, rows = total + rows * lvl.width, len(lvl.runners)
        return total

    def growth(self, pred: Tensor, q_root: Tensor, params: SamplingParams, max_depth: int, u: Tensor | None):
        """The shape cut at max_depth, a level at a time (TreeShape.growth); u: the image's `uniforms(max_depth)`
        uniforms on the device (sampling)."""
        shape = self.upto(max_depth)
        device = pred.device
        sampled = not params.greedy
        tokens = torch.empty(shape.n, dtype=torch.long, device=device)
        ok = torch.empty(shape.n, dtype=torch.bool, device=device) if sampled else None
        q, hidden, qs, used = q_root[None], pred, [q_root[None]], 0
        for d, lvl in enumerate(shape.levels):
            if sampled:  # successive inverse-CDF draws without replacement: `width` uniforms per row
                top, mass = successive_draws(q, u[used : used + q.shape[0] * lvl.width].view(q.shape[0], lvl.width))
                used += q.shape[0] * lvl.width
                ok[lvl.lo : lvl.hi] = mass[lvl.parent_row, lvl.rank]
            else:
                top = q.topk(lvl.width, dim=-1).indices
            tokens[lvl.lo : lvl.hi] = top[lvl.parent_row, lvl.rank]
            if not len(lvl.runners):
                break
            hidden, q = yield TreePass(tokens[lvl.runners], hidden[:, lvl.runner_parent_row], d, lvl.runners,
                                       lvl.runner_anc)
            qs.append(q)
        return Draft(tokens=tokens, depth=shape.depths, parent=shape.parent, block=shape.block,
                     children=shape.children, q=torch.cat(qs) if sampled else None, q_row=shape.q_row,
                     drafter_passes=len(qs) - 1, ok=ok)


def successive_draws(q: Tensor, u: Tensor) -> tuple[Tensor, Tensor]:
    """Ordered draws without replacement from each row of q [rows, V], one uniform each (u [rows, w]): draw j is
    an inverse-CDF draw from q without draws 1..j-1 (the law of ordered Gumbel-top-w with w uniforms instead of V).
    Returns (tokens [rows, w], whether q had mass left for each draw [rows, w])."""
    left = q.double().clone()
    tokens, mass = [], []
    for j in range(u.shape[1]):
        mass.append(left.sum(-1) > 0)
        tokens.append(draw(left, u[:, j]))
        left.scatter_(-1, tokens[-1][:, None], 0.0)
    return torch.stack(tokens, 1), torch.stack(mass, 1)


@dataclass(frozen=True)
class DynamicTree(TreeShape):
    """EAGLE-2 dynamic tree (the LANTERN code's defaults)."""

    total_tokens: int = 59  # y plus the kept nodes
    depth: int = 4  # expansions after the root's top_k; drafts reach depth + 1
    top_k: int = 10

    def __post_init__(self):
        for key in ("total_tokens", "depth", "top_k"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < (2 if key == "total_tokens" else 1):
                raise UserError(f"dynamic tree {key}={v!r} must be an integer >= {2 if key == 'total_tokens' else 1}")

    @property
    def max_rank(self) -> int:
        return self.top_k - 1

    @property
    def nodes(self) -> int:
        return self.total_tokens - 1

    @property
    def target_extra(self) -> int:
        return self.total_tokens - 1

    @property
    def drafter_extra(self) -> int:  # expansion e writes its top_k frontier nodes to slots Q + (e - 1) top_k ..
        return self.depth * self.top_k

    def to(self, device) -> "DynamicTree":
        return self

    def describe(self) -> str:
        return f"dynamic tree (total_tokens {self.total_tokens}, depth {self.depth}, top_k {self.top_k})"

    def uniforms(self, max_depth: int) -> int:
        return 0

    def growth(self, pred: Tensor, q_root: Tensor, params: SamplingParams, max_depth: int, u: Tensor | None):
        """EAGLE-2's expansions, one drafter pass each (TreeShape.growth); draws no uniform."""
        device = pred.device
        k, m = self.top_k, self.drafter_extra
        levels = min(self.depth + 1, max_depth)
        score, tok = q_root.log().topk(k)
        c_tok, c_score, c_parent = [tok], [score], [torch.full((k,), -1, device=device)]
        c_depth = [torch.full((k,), 1, device=device)]
        front, hidden = torch.arange(k, device=device), pred.expand(-1, k, -1)
        anc = torch.zeros(k, m, dtype=torch.bool, device=device)
        anc[:, :k] = torch.eye(k, dtype=torch.bool, device=device)
        offered = k
        for e in range(1, levels):
            hidden, q = yield TreePass(tok, hidden, e - 1, (e - 1) * k + torch.arange(k, device=device), anc)
            ls, lt = q.log().topk(k, dim=-1)
            cs = (score[:, None] + ls).flatten()
            c_tok.append(lt.flatten())
            c_score.append(cs)
            c_parent.append(front.repeat_interleave(k))
            c_depth.append(torch.full((k * k,), e + 1, device=device))
            if e + 1 < levels:
                best = cs.topk(k).indices
                par = best // k
                front, tok, score, hidden = offered + best, lt.flatten()[best], cs[best], hidden[:, par]
                anc = anc[par]
                anc[:, e * k : (e + 1) * k] |= torch.eye(k, dtype=torch.bool, device=device)
            offered += k * k
        scores = torch.cat(c_score)
        n = min(self.total_tokens - 1, scores.numel())
        # stable: among equal scores (q = 1, or -inf) shallower nodes first, so every kept node's parent is kept
        keep = torch.sort(scores, descending=True, stable=True).indices[:n].sort().values
        renumber = torch.full((scores.numel(),), -1, dtype=torch.long, device=device)
        renumber[keep] = torch.arange(n, device=device)
        up = torch.cat(c_parent)[keep]
        parent = torch.where(up >= 0, renumber[up.clamp(min=0)], up)
        depth = torch.cat(c_depth)[keep]
        anc = torch.eye(n, dtype=torch.bool, device=device)
        for d in range(2, levels + 1):  # a level at a time: the parents' rows are complete
            anc = torch.where((depth == d)[:, None], anc | anc[parent.clamp(min=0)], anc)
        # children on the device, [n + 1, top_k] in node order (-1: none): no host sync per tree
        is_child = parent[None, :] + 1 == torch.arange(n + 1, device=device)[:, None]
        rank = torch.where(is_child, is_child.long().cumsum(1) - 1, k)
        kids = torch.full((n + 1, k + 1), -1, dtype=torch.long, device=device)
        kids = kids.scatter(1, rank, torch.arange(n, device=device).expand(n + 1, n).clone())[:, :k]
        return Draft(tokens=torch.cat(c_tok)[keep], depth=depth, parent=parent, block=_block(anc), children=None,
                     kids=kids, drafter_passes=levels - 1, leaf_order=True)


def _block(anc: Tensor) -> Tensor:
    """[n + 1, n + 1] tree mask over [y, nodes] from the nodes' ancestor-or-self matrix."""
    n = anc.shape[0]
    block = torch.zeros(n + 1, n + 1, dtype=torch.bool, device=anc.device)
    block[:, 0] = True
    block[1:, 1:] = anc
    return block


def static_tree(name_or_paths, gamma: int = 4) -> StaticTree:
    if isinstance(name_or_paths, (list, tuple)):
        return StaticTree(name_or_paths)
    if name_or_paths == "naive_extend_57":
        return StaticTree(_paths_of(NAIVE_EXTEND_57), "naive_extend_57")
    if name_or_paths == "mc_sim_7b_63":
        return StaticTree(_paths_of(MC_SIM_7B_63), "mc_sim_7b_63")
    if name_or_paths == "twin_chain_8":
        return StaticTree(TWIN_CHAIN_8, "twin_chain_8")
    if name_or_paths == "chain":
        if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
            raise UserError(f"the chain tree needs gamma >= 1 (its depth), got {gamma!r}")
        return StaticTree([(0,) * d for d in range(1, gamma + 1)], f"chain{gamma}")
    raise UserError(f"unknown static tree {name_or_paths!r}; use {' or '.join(SHAPES)} or a list of rank paths")


# -- shared pieces ------------------------------------------------------------------------------------------------
def _visible(rows: int, cache_len: int, Q: int, block: Tensor) -> Tensor:
    """[rows, cache_len]: the committed slots < Q plus `block` over the slots from Q on."""
    visible = torch.zeros(rows, cache_len, dtype=torch.bool, device=block.device)
    visible[:, :Q] = True
    visible[:, Q : Q + block.shape[1]] = block
    return visible
