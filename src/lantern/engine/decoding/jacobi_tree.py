"""SJD-PAC's proactive drafting (Kang et al., arXiv 2603.18599): a Jacobi iteration (jacobi.py) that verifies, beside
its window, K candidate tokens at each of the first D window positions, as a tree, in the same ONE target forward.

The window (the main chain x_1..x_L) is jacobi.py's, refined and coupled as configured (`coupling`). Each of its
first D' = min(D, L) slots j also gets K - 1 siblings of x_j, drawn without replacement from the slot's draft
distribution q_j with x_j removed (successive inverse-CDF draws, trees.successive_draws, one uniform each; greedy:
the next K - 1 ranks of q_j). q_j is what SJD draws x_j from: the target's previous-iteration distribution at that
position (uniform for a fresh position). The tree is the full K-ary tree of depth D' below y, whose nodes at depth
d all hold the same K candidates of slot d - 1 (a position's stale distribution does not depend on the candidate
before it), with the window's tokens as its first-ranked path; the chain x_{D'+1}..x_L hangs below that path only.
Verify: one forward over [y, x_1..x_L, the other tree nodes] at RoPE positions Q + depth, cache slots Q, Q + 1, ..,
and the tree mask (trees._block). Accept: tree_rounds.walk (sampling; multi-candidate speculative sampling, a
rejected candidate's mass leaving p and q before the next sibling is tried, every rule of the registry) or
tree_rounds.tree_greedy_paths (greedy), then the correction or bonus token; the accepted nodes' cache entries move
into slots Q + 1 .. Q + a (GPT.keep_rows).
Re-draft: the next iteration refines from the stale distributions along the accepted path's continuation: below
the accepted node, its first-ranked children (the rejected candidate's row, as SJD uses the rejected token's), then
the window's chain. The maximal coupling keeps coupling each slot to its window token, the first-ranked candidate
of its slot, with the q it was drawn from.

Exactness (under `exact`, every coupling). Fix a position k. Its candidates are drawn from q_k with uniforms no
other position reads; the first is jacobi.py's draft, distributed as q_k given everything at positions < k
(coupling.py's argument), the others continue the draw without replacement, so the K are q_k's ordered draws
without replacement. Which parent the walk accepted, and the row q_k, depend on positions < k only (the
continuation above is chosen by the accepted path). walk tries them in order with q_k residualised over the tried
ones, which is multi-candidate speculative sampling (EAGLE / SpecInfer's rule): the committed token is a P_k draw.
A tested position is committed, so untested candidates were never seen. tests/test_jacobi_tree.py checks the joint
law by chi-square against exact enumeration, and that a broken variant (siblings drawn with replacement, i.e. q not
residualised) fails it.

Where the authors' code is not followed (scheduler/sjd_pac_iteration_lumina_mgpt.py in KangJialiang/SJD-PAC):
their L counts y and the tree's nodes, so the chain shortens as the tree grows (L 64, tree_width 3, tree_depth 3
counting y: 13 tree nodes, a main path of 53 window tokens plus 10 others); here `window` is the main path and
the tree adds nodes: their setting is window 53, proactive 3, proactive_depth 2. Their siblings are drawn from the
residual of the last test; here from q_k without the window's token, whose law the walk's residualised q matches.
They pick the longest accepted row over all tree paths at once; here the walk accepts in tree order.
Stats: accepted_per_step = accepted tree depth, tree_depth = the window L. Compile: jacobi_tree_graph.py runs the
iteration as one compiled call; a rule without a device form would keep these rounds, the verify forward compiled at
the static width window + tree nodes + 1 (+ eol_bound under a layout; speculative.decode).
Forced structural tokens (`layout`, docs/chameleon-layout.md): the window and its siblings hold codes; in the verify
every node at a depth whose code ends a row (y at depth 0) gets an eol child (forced_trees.splice, as draft trees'),
a node's children read its eol's row, and the commit moves the kept eols beside the accepted nodes.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from lantern.engine.decoding.forced import code_logits, code_positions
from lantern.engine.decoding.forced_trees import splice, tree_plan
from lantern.engine.decoding.jacobi import Image, Jacobi, JacobiRounds
from lantern.engine.decoding.rounds import batch_probs, forward_rows_of, in_rows, target_forward
from lantern.engine.decoding.sampling import Uniforms, draw
from lantern.engine.decoding.tree_rounds import tree_greedy_paths, walk
from lantern.engine.decoding.trees import _block, successive_draws
from lantern.engine.models.layout import Layout
from lantern.engine.models.model import GPT
from lantern.errors import UserError

MAX_TREE = 1024  # tree nodes per forward: K + K^2 + .. + K^D beyond this is refused


def tree_nodes(K: int, D: int) -> int:
    """Nodes of the full K-ary tree of depth D below y."""
    return sum(K ** d for d in range(1, D + 1))


@dataclass(frozen=True)
class ProactiveJacobi(Jacobi):
    """Jacobi drafting with SJD-PAC's proactive tree: `proactive` K candidates at each of the first
    `proactive_depth` D window positions (methods.py: proactive, proactive_depth)."""

    proactive: int = 4
    proactive_depth: int = 2

    def __post_init__(self):
        super().__post_init__()
        for key, low in (("proactive", 2), ("proactive_depth", 1)):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise UserError(f"{key}={v!r} must be an integer >= {low}")
        if self.proactive_depth > self.window:
            raise UserError(f"proactive_depth={self.proactive_depth} exceeds window={self.window}: the tree's levels "
                            "are window positions; lower proactive_depth or raise window")
        if tree_nodes(self.proactive, self.proactive_depth) > MAX_TREE:
            raise UserError(f"proactive={self.proactive} with proactive_depth={self.proactive_depth} verifies "
                            f"{tree_nodes(self.proactive, self.proactive_depth)} tree nodes per forward; keep "
                            f"K + K^2 + .. + K^D <= {MAX_TREE}")

    @property
    def extras(self) -> int:
        """Tree nodes beyond the window's first D tokens."""
        return tree_nodes(self.proactive, self.proactive_depth) - self.proactive_depth

    @property
    def nodes(self) -> int:
        return self.window + self.extras

    @property
    def target_extra(self) -> int:  # the tree's nodes past the window sit in spare cache slots
        return self.extras

    def check(self, target: GPT) -> None:
        if self.proactive > target.args.vocab_size:
            raise UserError(f"proactive={self.proactive} candidates per position exceed the vocabulary of "
                            f"{target.args.vocab_size}")


@dataclass
class Shape:
    """One image's tree at window length L, padded to M = window + extras nodes (node i at row / slot i + 1)."""

    size: int  # 1 + real nodes
    depth: Tensor  # [M], 0 for padding
    parent: Tensor  # [M], -1: a child of y (and padding)
    src: Tensor  # [M] the node's token in [window [W], siblings [D (K - 1)]] (its `ok` likewise)
    real: Tensor  # [M] bool
    block: Tensor  # [1 + M, 1 + M] the tree mask over [y, nodes]
    kids: Tensor  # [1 + M, K] children in rank order, -1: none
    q_row: Tensor  # [1 + M] the window slot the node's children were drawn from
    cont: Tensor  # [1 + M, W + 1] per accepted end node: the row over [y, nodes] that predicts each depth e + 1


@functools.lru_cache(maxsize=256)
def tree_lists(K: int, D: int, W: int, L: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """The proactive tree's nodes for a window of L tokens, on the host: (depth, parent, src) per node, the window's
    L first, then the other nodes depth by depth."""
    Dc = min(D, L)
    depth, parent, src = [j + 1 for j in range(L)], [j - 1 for j in range(L)], list(range(L))
    node = {(0,) * d: d - 1 for d in range(1, Dc + 1)}  # a tree path's node: the window's first-ranked path
    for d in range(1, Dc + 1):
        for path in itertools.product(range(K), repeat=d):
            if any(path):
                r = path[-1]
                node[path] = len(depth)
                depth.append(d)
                parent.append(node[path[:-1]] if d > 1 else -1)
                src.append(d - 1 if r == 0 else W + (d - 1) * (K - 1) + r - 1)
    return tuple(depth), tuple(parent), tuple(src)


@functools.lru_cache(maxsize=256)
def build_shape(K: int, D: int, W: int, L: int, device) -> Shape:
    """The proactive tree for a window of L tokens (module docstring), on the host, then sent to `device`."""
    M = W + tree_nodes(K, D) - D
    depth, parent, src = (list(x) for x in tree_lists(K, D, W, L))
    m = len(depth)
    children: list[list[int]] = [[] for _ in range(1 + M)]
    for i, p in enumerate(parent):  # in node order: the window's child first, then ranks 1..
        children[p + 1].append(i)
    anc = torch.zeros(M, M, dtype=torch.bool)
    for i, p in enumerate(parent):
        anc[i, i] = True
        if p >= 0:
            anc[i] |= anc[p]
    cont = torch.zeros(1 + M, W + 1, dtype=torch.long)
    for v in range(1 + m):  # v: a row over [y, nodes] at depth dv; the rows of depths < dv are never read
        dv = 0 if v == 0 else depth[v - 1]
        c = cont[v, dv] = v
        for e in range(dv + 1, W + 1):  # c's first-ranked child, else the window's node at depth e (row e)
            c = children[c][0] + 1 if children[c] else (e if e <= L else 0)
            cont[v, e] = c
    kids = torch.full((1 + M, K), -1, dtype=torch.long)
    for i, c in enumerate(children):
        kids[i, : len(c)] = torch.tensor(c, dtype=torch.long)
    pad = lambda x, value=0: F.pad(torch.tensor(x, dtype=torch.long), (0, M - m), value=value)  # noqa: E731
    block = torch.zeros(1 + M, 1 + M, dtype=torch.bool)
    block[: 1 + m, : 1 + m] = _block(anc[:m, :m])
    q_row = F.pad(torch.tensor([0] + depth, dtype=torch.long).clamp(max=W - 1), (0, M - m))
    host = [pad(depth), pad(parent, -1), pad(src), pad([1] * m), block, kids, q_row, cont]
    flat = torch.cat([h.long().flatten() for h in host]).to(device)  # one copy
    dev = [f.view(h.shape) for f, h in zip(flat.split([h.numel() for h in host]), host)]
    return Shape(1 + m, dev[0], dev[1], dev[2], dev[3] != 0, dev[4] != 0, dev[5], dev[6], dev[7])


def eol_bound(K: int, D: int, W: int, layout: Layout) -> int:
    """The most eol nodes one verify carries under `layout` (its spare cache slots and static width): an eol after
    every node at a depth e whose code ends a row, K^e nodes at e <= D, one (the window's, or y at e = 0) elsewhere,
    at depths cols apart, over every alignment of the first row end."""
    if layout.eol is None:
        return 0
    width = lambda e: K ** e if 1 <= e <= D else 1  # noqa: E731
    return max(sum(width(e) for e in range(first, W + 1, layout.cols)) for first in range(layout.cols))


@functools.lru_cache(maxsize=1024)
def eol_nodes(K: int, D: int, W: int, L: int, ends: tuple[int, ...], device) -> Tensor:
    """The nodes an eol follows in a verify (-1: y) for a window of L tokens whose row ends fall at depths `ends`
    (forced_trees.tree_plan's): every node at those depths, on `device`."""
    depth = tree_lists(K, D, W, L)[0]
    nodes = [i for e in ends for i in ([-1] if e == 0 else [i for i, d in enumerate(depth) if d == e])]
    return torch.tensor(nodes, dtype=torch.long).to(device)


def tree_visible(Q: Tensor, mask: Tensor, real: Tensor, cache: int) -> Tensor:
    """Each verify row's visible cache slots [n, S, cache]: the prefix before y's slot Q [n] for real rows (real
    [n, S]), and the rows' tree mask [n, S, S] over the slots Q, Q + 1, .. they write."""
    S = mask.shape[1]
    rel = torch.arange(cache, device=Q.device) - Q[:, None]  # [n, cache]: a slot's offset from y's
    tree = mask.gather(2, rel.clamp(0, S - 1)[:, None, :].expand(-1, S, cache)) & ((rel >= 0) & (rel < S))[:, None]
    return ((rel < 0)[:, None, :] & real[..., None]) | tree


def cache_moves(Q: Tensor, path: Tensor, scratch: int, code_row: Tensor | None = None, off: Tensor | None = None,
                y_eol: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(src, dst) cache slots [n, k] that compact an iteration's accepted nodes (path [n, D], -1 past it; their rows
    sit at Q + 1 + node) after y's slot Q [n]; scratch onto itself where nothing moves. Under a layout (code_row,
    off: splice's), y's eol (unless y_eol [n] says not), the nodes and their eols each move to their position's
    slot."""
    Q = Q[:, None]
    if code_row is None:
        src = torch.where(path >= 0, Q + 1 + path, scratch)
        return src, torch.where(path >= 0, Q + 1 + torch.arange(path.shape[1], device=path.device), scratch)
    node = (path + 1).clamp(min=0)
    eol = code_row.gather(1, node)
    kept = torch.cat([code_row[:, :1], node, eol], 1)
    first = (code_row[:, :1] != 0) & (True if y_eol is None else y_eol[:, None])
    keep = torch.cat([first, path >= 0, (path >= 0) & (eol != node)], 1)
    return torch.where(keep, Q + kept, scratch), torch.where(keep, Q + off.gather(1, kept), scratch)


def siblings(q: Tensor, x: Tensor, K: int, u: Tensor | None) -> tuple[Tensor, Tensor]:
    """The K - 1 candidates after x [n] at slots with draft distributions q [n, V]: q's ordered draws without
    replacement, x removed first (u [n, K - 1] uniforms), or under greedy (u None) q's top ranks after x. Returns
    (tokens [n, K - 1], whether q had mass left for each [n, K - 1]: the others are never offered)."""
    left = q.double().scatter(-1, x[:, None], 0.0)
    if u is None:
        return left.topk(K - 1, dim=-1).indices, torch.ones(len(x), K - 1, dtype=torch.bool, device=q.device)
    return successive_draws(left, u)


class JacobiTreeRounds(JacobiRounds):
    """Proactive Jacobi iterations for a batch (module docstring); jacobi.JacobiRounds drafts the window. An image
    draws, after its window's L uniforms: D (K - 1) for the siblings, then the walk's tries and the correction
    (sampling; the generator then advances by what it used), so its tokens never depend on the batch. Host syncs per
    iteration: JacobiRounds' plan and window uniforms, the siblings' and walk's uniforms (sampling), the one read;
    the cache moves are built on the device (four per iteration sampling, three greedy; SJD's: three)."""

    def __init__(self, target: GPT, jacobi: ProactiveJacobi, params, rule, table, B: int, layout: Layout | None = None):
        super().__init__(target, jacobi, params, rule, table, B, layout)
        self.K, self.D = jacobi.proactive, jacobi.proactive_depth
        self.eols = 0 if layout is None else eol_bound(self.K, self.D, jacobi.window, layout)
        self.target_extra += self.eols

    def draft(self, images: list[Image]) -> None:
        """The window (jacobi.JacobiRounds.draft), then each slot's siblings below the first D."""
        super().draft(images)
        K, D, W, n = self.K, self.D, self.jacobi.window, len(images)
        q, x, u = self.qs[self.index, :D].flatten(0, 1), self.window[self.index, :D].flatten(), None
        if not self.params.greedy:  # the window's acceptance block, drawn by JacobiRounds, is redrawn here
            for im, state in zip(images, self.states):
                im.generator.set_state(state)
            self.ahead = Uniforms([im.generator for im in images], D * (K - 1) + D * K + W - D + 1, self.device)
            u = self.ahead.u[:, : D * (K - 1)].reshape(n * D, K - 1)
        sib, ok = siblings(q, x, K, u)
        self.tokens = torch.cat([self.window[self.index], sib.view(n, -1)], 1)  # what Shape.src indexes
        self.ok = torch.cat([torch.ones(n, W, dtype=torch.bool, device=q.device), ok.view(n, -1)], 1)
        self.shapes = [build_shape(K, D, W, im.L, self.device) for im in images]

    def stacked(self, name: str, rows: int) -> Tensor:
        return torch.stack([getattr(s, name)[:rows] for s in self.shapes])

    def verify(self, images: list[Image], width: int | None) -> tuple[Tensor, Tensor]:
        """One forward over every active image's [y, nodes] with its tree mask, padded to the largest tree; with a
        layout, [y, nodes, eol nodes] (`spliced`)."""
        R, S, n = self.R, max(s.size for s in self.shapes), len(images)
        M, L_cache = S - 1, self.target.cache_len
        self.X = self.tokens.gather(1, self.stacked("src", M))
        real = torch.cat([torch.ones(n, 1, dtype=torch.bool, device=self.device), self.stacked("real", M)], 1)
        depth = F.pad(self.stacked("depth", M), (1, 0))
        y = self.buf[self.index, self.done - 1]
        block = torch.stack([s.block[:S, :S] for s in self.shapes])
        if self.layout is None:
            x, self.off = torch.cat([y[:, None], self.X], 1), depth
            self.Q = self.target.args.cls_token_num + self.done - 1
        else:
            x, real, block = self.spliced(images, y, depth, real, block)
            width = None if width is None else 1 + self.jacobi.nodes + self.eols
        S, Q = x.shape[1], self.Q
        pos = torch.where(real, Q[:, None] + self.off, 0)
        slots = torch.where(real, Q[:, None] + torch.arange(S, device=self.device), L_cache - 1)
        visible = tree_visible(Q, block, real, L_cache)
        for im in images:
            im.stats.target_forwards += 1
        return target_forward(self.target, forward_rows_of(self.index, self.B, R), in_rows(x, R), in_rows(pos, R),
                              in_rows(slots, R), in_rows(visible, R), width)

    def spliced(self, images: list[Image], y: Tensor, depth: Tensor, real: Tensor, block: Tensor):
        """The verify under a layout, as a draft tree's (forced_trees.splice): every node at a depth whose code ends
        a row (y at depth 0) gets an eol child at its position + 1, nodes below sit one position further per eol
        above them, and a node's children read its eol's row (`code_row`). Eol nodes are padded to the batch's
        most. Sets Q (y's position), off (each row's position offset), code_row; returns (ids, real, tree mask)."""
        K, D, W, layout = self.K, self.D, self.jacobi.window, self.layout
        parents = [eol_nodes(K, D, W, im.L, tuple(tree_plan(layout, im.n - 1, im.L, 0, "cpu").ends), self.device)
                   for im in images]
        E = max(len(p) for p in parents)
        eol_real = torch.stack([torch.arange(E, device=self.device) < len(p) for p in parents])
        parents = torch.stack([F.pad(p, (0, E - len(p)), value=-1) for p in parents])
        c0 = self.done - 1
        ids, self.off, mask, self.code_row = splice(layout, self.X, depth[:, 1:], block[:, 1:, 1:], parents,
                                                    eol_real, y, c0, self.N)
        self.Q = code_positions(layout, self.target.args.cls_token_num, c0)
        return ids, torch.cat([real, eol_real], 1), mask

    def commit(self, images: list[Image], logits: Tensor, hidden: Tensor) -> None:
        """The tree's acceptance for every active image on the device, the commit, one read, the cache moves."""
        K, D, W, N, V = self.K, self.D, self.jacobi.window, self.N, self.V
        if self.layout is not None:  # [y, nodes]' predicting rows over the image head (an eol's after a row end)
            logits = code_logits(self.layout, logits, self.code_row)
        n, S = len(images), logits.shape[1]
        M, deepest = S - 1, max(im.L for im in images)
        depth = self.stacked("depth", M)
        P = batch_probs(logits, self.params, self.done[:, None] + F.pad(depth, (1, 0)))
        if self.params.greedy:
            anc = torch.stack([s.block[1:S, 1:S] for s in self.shapes])
            path, p = tree_greedy_paths(P, self.X, self.stacked("parent", M), depth, anc, self.table, self.rule)
            path, used, token = path[:, :deepest], torch.zeros(n, dtype=torch.long, device=self.device), p.argmax(-1)
        else:
            ok = self.ok.gather(1, self.stacked("src", M)) & self.stacked("real", M)
            u = self.ahead.u[:, D * (K - 1) :]
            fanout = [K] * D + [1] * (W - D) + [0]
            path, p, used = walk(P, self.qs[self.index], self.X, ok, self.stacked("kids", S), self.stacked("q_row", S),
                                 u, self.table, self.rule, deepest, fanout)
            token = draw(p, u.gather(1, used[:, None])[:, 0])
        a = (path >= 0).sum(-1)
        cols = self.done[:, None] + torch.arange(deepest, device=self.device)
        self.buf[self.index[:, None], cols] = self.X.gather(1, path.clamp(min=0))
        self.buf[self.index, self.done + a] = token  # past the image's end when the window completed it: unread
        end = torch.where(a > 0, path.gather(1, (a - 1).clamp(min=0)[:, None])[:, 0] + 1, 0)
        rows = self.stacked("cont", S)[torch.arange(n, device=self.device), end]  # [n, W + 1]
        self.P[self.index] = P.gather(1, rows[..., None].expand(n, W + 1, V))
        # the accepted nodes' cache entries into slots Q + 1 .., on the device; past its path an image copies the
        # scratch slot onto itself (Q + 1 + j may lie past the cache when another image's window is longer)
        scratch = self.target.cache_len - 1
        if self.layout is None:
            src, dst = cache_moves(self.Q, path, scratch)
        else:  # y's eol, the accepted nodes and their eols, each to its position (slots = positions)
            src, dst = cache_moves(self.Q, path, scratch, self.code_row, self.off)
        rows = forward_rows_of(self.index, self.B, self.R)
        rows = torch.arange(self.R * n, device=self.device) if rows is None else rows
        rows = rows[:, None].expand(-1, src.shape[1])
        read = torch.stack([a, used, (src != dst).any(-1).long()], 1).tolist()  # the iteration's one read
        counts = []
        for im, (a_i, used_i, _) in zip(images, read):
            im.stats.accepted_per_step.append(a_i)
            im.stats.tree_depth.append(im.L)
            done = im.n + a_i == N
            counts.append(D * (K - 1) + used_i + (not done))
            im.prev, im.a = im.n, a_i
            im.n = N if done else im.n + a_i + 1
        if not self.params.greedy:
            self.ahead.used(counts)
        if any(r[2] for r in read):
            self.target.keep_rows(rows.flatten(), src.repeat(self.R, 1).flatten(), dst.repeat(self.R, 1).flatten())
