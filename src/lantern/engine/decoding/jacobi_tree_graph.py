"""SJD-PAC's proactive iteration (jacobi_tree.py) as ONE compiled function (compile=True): the window's refinement
and refill, the siblings at its first D slots, the tree's verify, the walk (or greedy paths), the correction or
bonus draw, the commit and the cache moves, over every image of the batch at static shapes. The host side is
graph.GraphLoop's (one launch and one read a round), the state jacobi_graph.py's.

Static shapes: every image's tree is jacobi_tree.build_shape's at its window length L, looked up in a table of the
W + 1 shapes by L (`shape_table`; L 0 for a finished image, which takes part as padding: no real row, no write that
is read). The verify is 1 + window + tree nodes rows wide, and with a layout also `eol_bound` eol rows: the nodes at
a row-ending depth are found on the device (forced_trees.ends_at) and listed in jacobi_tree.eol_nodes' order
(depth, then node), so the verify's rows are the eager round's, padded.
Uniforms: an iteration reads its window's L uniforms from `taken` on, then, sampling, the siblings' D (K - 1) and
the walk's block after them, and advances `taken` by what JacobiTreeRounds would have drawn, so every image gets
the eager rounds' tokens, uniform for uniform.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from lantern.engine.decoding.forced import code_logits, code_positions
from lantern.engine.decoding.forced_trees import ends_at, splice
from lantern.engine.decoding.jacobi import refill
from lantern.engine.decoding.jacobi_graph import GraphJacobiRounds
from lantern.engine.decoding.jacobi_tree import (ProactiveJacobi, build_shape, cache_moves, eol_bound, siblings,
                                                 tree_visible)
from lantern.engine.decoding.rounds import batch_probs, in_rows
from lantern.engine.decoding.sampling import SamplingParams, draw
from lantern.engine.decoding.tree_rounds import tree_greedy_paths, walk
from lantern.engine.models.layout import Layout
from lantern.engine.models.model import GPT
from lantern.engine.rules.acceptance import AcceptRule

FIELDS = ("depth", "parent", "src", "real", "block", "kids", "q_row", "cont")


@functools.lru_cache(maxsize=32)
def shape_table(K: int, D: int, W: int, device) -> tuple[Tensor, ...]:
    """build_shape's fields for L = 0 .. W, stacked [W + 1, ...] (FIELDS' order), on `device`."""
    shapes = [build_shape(K, D, W, L, device) for L in range(W + 1)]
    return tuple(torch.stack([getattr(s, f) for s in shapes]) for f in FIELDS)


def tree_uniforms(K: int, D: int, W: int) -> int:
    """The most uniforms a sampled iteration draws after its window's: the siblings', the walk's and the token's."""
    return D * (K - 1) + D * K + W - D + 1


def eol_rows(layout: Layout, depth: Tensor, real: Tensor, c0: Tensor, N: int, E: int) -> tuple[Tensor, Tensor]:
    """The eol nodes of B verify trees (depth, real [B, 1 + M] over [y, nodes]; y = code c0 [B]): (parents [B, E],
    -1 for y; real [B, E]), every node at a row-ending depth, by depth then node (jacobi_tree.eol_nodes' order)."""
    rows = depth.shape[1]
    flag = real & ends_at(layout, c0[:, None], depth, N)
    key = torch.where(flag, depth * rows + torch.arange(rows, device=depth.device), rows * rows)
    key = key.sort(-1).values[:, :E]
    valid = key < rows * rows
    return torch.where(valid, key % rows - 1, -1), valid


def jacobi_tree_round(target: GPT, buf: Tensor, n: Tensor, P: Tensor, L: Tensor, a: Tensor, prev: Tensor,
                      stream: Tensor, taken: Tensor, params: SamplingParams, table: Tensor | None, rule: AcceptRule,
                      jacobi: ProactiveJacobi, shapes: tuple[Tensor, ...], last: tuple[Tensor, Tensor] | None = None,
                      noise: Tensor | None = None, layout: Layout | None = None) -> Tensor:
    """One proactive iteration of every image (jacobi_graph.py's state, updated in place; shapes: shape_table's).
    Returns [B, 2]: the accepted depths (0 for finished images) and the windows verified."""
    B, W, K, D = n.shape[0], jacobi.window, jacobi.proactive, jacobi.proactive_depth
    R, device, cache = target.cache_key_valid.shape[0] // B, n.device, target.cache_len
    N, T = target.args.image_tokens if layout is None else layout.codes, target.args.cls_token_num
    live, scratch = n < N, cache - 1
    # the window (jacobi_graph.jacobi_round's steps 4 and 1), then its first D slots' siblings
    r = torch.minimum(torch.minimum(L + 1, N - prev), a + 1 + (N - n).clamp(max=W)) - a - 1
    r = torch.where(a < 0, 0, r.clamp(min=0))
    Ls = torch.where(live, (N - n).clamp(max=W), 0)
    u = stream.gather(1, taken[:, None] + torch.arange(W, device=device))
    prior = None if last is None else (*last, L)
    if noise is not None:
        at = (n[:, None] + torch.arange(W, device=device)).clamp(max=N - 1)
        noise = noise.gather(1, at[..., None].expand(B, W, noise.shape[-1]))
    window, q = refill(P, u, r, Ls, a.clamp(min=0) + 1, params.greedy, jacobi.coupling, prior, noise)
    if last is not None:
        last[0].copy_(window)
        last[1].copy_(q)
    ut = None
    if not params.greedy:  # after the window's L uniforms
        ut = stream.gather(1, (taken + Ls)[:, None] + torch.arange(tree_uniforms(K, D, W), device=device))
    sib, ok = siblings(q[:, :D].flatten(0, 1), window[:, :D].flatten(), K,
                       None if ut is None else ut[:, : D * (K - 1)].reshape(B * D, K - 1))
    tokens = torch.cat([window, sib.view(B, -1)], 1)
    ok = torch.cat([torch.ones(B, W, dtype=torch.bool, device=device), ok.view(B, -1)], 1)
    depth, parent, src, real, block, kids, q_row, cont = (s[Ls] for s in shapes)
    X = tokens.gather(1, src)
    # the verify: [y, nodes] (with a layout, and eol nodes), finished images' rows all padding
    y = buf.gather(1, (n - 1).clamp(min=0)[:, None])[:, 0]
    rows = torch.cat([torch.ones(B, 1, dtype=torch.bool, device=device), real], 1)
    d = F.pad(depth, (1, 0))
    if layout is None:
        seq, Q, off, mask = torch.cat([y[:, None], X], 1), T + n - 1, d, block
    else:
        c0 = n - 1
        parents, eol_real = eol_rows(layout, d, rows, c0, N, eol_bound(K, D, W, layout))
        seq, off, mask, code_row = splice(layout, X, depth, block[:, 1:, 1:], parents, eol_real, y, c0, N)
        Q, rows = code_positions(layout, T, c0), torch.cat([rows, eol_real], 1)
    rows = rows & live[:, None]
    pos = torch.where(rows, Q[:, None] + off, 0)
    slots = torch.where(rows, Q[:, None] + torch.arange(seq.shape[1], device=device), scratch)
    visible = tree_visible(Q, mask, rows, cache)
    logits, _ = target.forward_rows(target.embed_tokens(in_rows(seq, R)), in_rows(pos, R), in_rows(slots, R),
                                    in_rows(visible, R))
    if layout is not None:
        logits = code_logits(layout, logits, code_row)
    Pn = batch_probs(logits, params, n[:, None] + d)
    # accept (jacobi_tree.JacobiTreeRounds.commit), the correction or bonus token
    if params.greedy:
        path, p = tree_greedy_paths(Pn, X, parent, depth, block[:, 1:, 1:], table, rule)
        path, used, token = path[:, :W], torch.zeros_like(n), p.argmax(-1)
    else:
        uw = ut[:, D * (K - 1) :]
        path, p, used = walk(Pn, q, X, ok.gather(1, src) & real, kids, q_row, uw, table, rule, W,
                             [K] * D + [1] * (W - D) + [0])
        token = draw(p, uw.gather(1, used[:, None])[:, 0])
    path = torch.where(live[:, None], path, -1)
    a_new = (path >= 0).sum(-1)
    buf.scatter_(1, n[:, None] + torch.arange(W, device=device), X.gather(1, path.clamp(min=0)))
    buf.scatter_(1, (n + a_new)[:, None], token[:, None])
    end = torch.where(a_new > 0, path.gather(1, (a_new - 1).clamp(min=0)[:, None])[:, 0] + 1, 0)
    P.copy_(Pn.gather(1, cont[torch.arange(B, device=device), end][..., None].expand(B, W + 1, Pn.shape[-1])))
    # the cache moves (JacobiTreeRounds.commit's), every row of the cache, scratch onto itself where none
    src_slot, dst_slot = cache_moves(Q, path, scratch) if layout is None else \
        cache_moves(Q, path, scratch, code_row, off, live)
    every = torch.arange(R * B, device=device)[:, None].expand(-1, src_slot.shape[1])
    target.keep_rows(every.flatten(), src_slot.repeat(R, 1).flatten(), dst_slot.repeat(R, 1).flatten())
    spent = Ls if params.greedy else Ls + D * (K - 1) + used + (n + a_new < N).long()
    taken.add_(torch.where(live, spent, 0))
    prev.copy_(torch.where(live, n, prev))
    a.copy_(torch.where(live, a_new, a))
    L.copy_(torch.where(live, Ls, L))
    n.copy_(torch.where(live, (n + a_new + 1).clamp(max=N), n))
    return torch.stack([a_new, Ls], 1)


class GraphJacobiTreeRounds(GraphJacobiRounds):
    """Proactive iterations (jacobi_tree.py's, uniform for uniform) as one compiled call each."""

    round_fn = staticmethod(jacobi_tree_round)

    def __init__(self, target: GPT, jacobi: ProactiveJacobi, params: SamplingParams, rule: AcceptRule,
                 table: Tensor | None, B: int, layout: Layout | None = None):
        super().__init__(target, jacobi, params, rule, table, B, layout)
        K, D, W = jacobi.proactive, jacobi.proactive_depth, jacobi.window
        self.per_round = W + tree_uniforms(K, D, W)
        self.target_extra += 0 if layout is None else eol_bound(K, D, W, layout)
        self.shapes = shape_table(K, D, W, self.device)

    def round_inputs(self) -> tuple:
        return (self.target, self.buf, self.n, self.P, self.L, self.a, self.prev, self.stream, self.taken,
                self.params, self.table, self.rule, self.jacobi, self.shapes, self.last, self.noise, self.layout)
