"""A static draft tree's round as ONE compiled call (compile=True), the tree counterpart of chain_graph.py: the
drafter's catch-up, the tree grown a level at a time (a sampled tree's children drawn without replacement, a greedy
tree's the drafter's top ranks), the target's verify over [y, nodes] with the tree mask, acceptance (greedy: the
deepest node whose path passes; sampling: batched_trees.walk), the residual or bonus draw, the accepted path's
target cache entries moved into consecutive slots, and the commit, over every image at the shape's full size.

Near an image's end batched_trees.TreeRounds cuts the shape at the tokens the image has left (StaticTree.upto);
here the full shape always runs and the nodes past the cut are padding: never offered, never accepted, run at
position 0 into the scratch slot, and their uniforms never drawn (a round takes the cut shape's growth uniforms,
`growth_uniforms`, then the walk's). So every image gets the tokens of the eager rounds, uniform for uniform.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from lantern.engine.acceptance import AcceptRule
from lantern.engine.batched import batch_probs, in_rows, ragged
from lantern.engine.batched_trees import tree_greedy_paths, walk
from lantern.engine.chain_graph import GraphRounds
from lantern.engine.drafter import Drafter
from lantern.engine.model import GPT
from lantern.engine.sampling import SamplingParams, draw
from lantern.engine.trees import StaticTree, successive_draws


def tree_visible(Q: Tensor, block: Tensor, real: Tensor, cache_len: int) -> Tensor:
    """[B, S, cache_len]: for each image's queries (block [S, m] over the tree slots Q .. Q + m - 1), the committed
    slots < Q and their tree slots; nothing for the padding queries (real [B, S] False)."""
    B, (S, m) = Q.shape[0], block.shape
    visible = (torch.arange(cache_len, device=Q.device) < Q[:, None])[:, None, :].expand(B, S, cache_len).clone()
    cols = (Q[:, None] + torch.arange(m, device=Q.device))[:, None, :].expand(B, S, m)
    visible.scatter_(2, cols, block[None].expand(B, S, m))
    return visible & real[..., None]


class TreeTensors:
    """What a static tree's graph round reads of its shape beyond StaticTree's own tensors, on its device, built
    once per shape: each node's children in order (kids [n + 1, C], -1 padded), each node's drafter row (q_row
    [n + 1]), and per cut depth c = 0 .. depth the uniforms its sampled growth draws (`grown`, StaticTree.uniforms)
    and its drafter passes (`passes`, host ints)."""

    def __init__(self, tree: StaticTree):
        device, C = tree.device, max(map(len, tree.children))
        self.tree = tree
        self.kids = torch.tensor([c + [-1] * (C - len(c)) for c in tree.children], device=device)
        self.q_row = torch.tensor(tree.q_row, device=device).clamp(min=0)  # leaves' rows are never read
        self.grown = torch.tensor([tree.uniforms(c) if c else 0 for c in range(tree.depth + 1)], device=device)
        self.passes = [sum(1 for lvl in tree.upto(c).levels if len(lvl.runners)) if c else 0
                       for c in range(tree.depth + 1)]


def static_tree_round(target: GPT, drafter: Drafter, buf: Tensor, n: Tensor, pend_h: Tensor, pend_len: Tensor,
                      stream: Tensor | None, taken: Tensor, params: SamplingParams, table: Tensor | None,
                      rule: AcceptRule, shape: TreeTensors) -> Tensor:
    """One round of a static tree for every image (chain_graph.py's state, updated in place; pend_h is D + 1 wide).
    Returns the accepted lengths a [B] (0 for finished images)."""
    tree = shape.tree
    B, D, m = n.shape[0], tree.depth, tree.n
    R, device = pend_h.shape[0] // B, n.device
    N, T, L = target.args.image_tokens, target.args.cls_token_num, drafter.cache_len
    live = n < N
    cut = torch.where(live, (N - n).clamp(max=D), 0)  # the shape's depth this image drafts
    Q = T + n - 1  # y's target position
    # 1. catch-up over the pending inputs: the predicted state below y
    j = torch.arange(D + 1, device=device)
    lengths = torch.where(live, pend_len, 0)
    tokens = buf.gather(1, ((n - pend_len)[:, None] + j).clamp(0, buf.shape[1] - 1))
    pos, slots, visible = ragged(T + n - pend_len - 1, lengths, D + 1, R, L)
    out = drafter.forward_rows(in_rows(drafter.embed_tokens(tokens), R), pend_h, pos, slots, visible)
    last = (lengths - 1).clamp(min=0)
    hidden = out.view(R, B, D + 1, -1)[:, torch.arange(B, device=device), last].reshape(R * B, 1, -1)
    q = batch_probs(drafter.head(hidden), params, n[:, None])  # [B, 1, V]: the root's row
    # 2. the tree, a level at a time
    X = torch.zeros(B, m, dtype=torch.long, device=device)
    ok = torch.ones(B, m, dtype=torch.bool, device=device)
    qs, offset = [q], taken + 0
    for d, lvl in enumerate(tree.levels):
        rows, width = q.shape[1], lvl.width
        if stream is None:
            top = q.topk(width, dim=-1).indices
        else:  # successive draws without replacement, `width` uniforms per row (eager: trees.StaticTree.growth)
            u = stream.gather(1, offset[:, None] + torch.arange(rows * width, device=device))
            top, mass = successive_draws(q.reshape(B * rows, -1), u.view(B * rows, width))
            top, mass = top.view(B, rows, width), mass.view(B, rows, width)
            ok[:, lvl.lo : lvl.hi] = mass[:, lvl.parent_row, lvl.rank]
            offset = offset + rows * width
        X[:, lvl.lo : lvl.hi] = top[:, lvl.parent_row, lvl.rank]
        if not len(lvl.runners):
            break
        S, real = len(lvl.runners), (d + 1 < cut)[:, None].expand(B, len(lvl.runners))  # runners inside the cut
        pos = torch.where(real, (Q + d)[:, None], 0)
        slots = torch.where(real, Q[:, None] + lvl.runners, L - 1)
        visible = tree_visible(Q, lvl.runner_anc, real, L)
        hidden = drafter.forward_rows(in_rows(drafter.embed_tokens(X[:, lvl.runners]), R),
                                      hidden[:, lvl.runner_parent_row], in_rows(pos, R), in_rows(slots, R),
                                      in_rows(visible, R))
        q = batch_probs(drafter.head(hidden), params, (n + d + 1)[:, None].expand(-1, S))
        qs.append(q)
    drafted = tree.depths[None, :] <= cut[:, None]  # [B, m]: the cut shape's nodes
    ok = ok & drafted
    # 3. verify [y, nodes]: RoPE positions Q + depth, slots Q .., the tree mask
    real = torch.cat([live[:, None], drafted], 1)
    seq = torch.cat([buf.gather(1, (n - 1)[:, None]), X], 1)
    pos = torch.where(real, Q[:, None] + F.pad(tree.depths, (1, 0)), 0)
    slots = torch.where(real, Q[:, None] + torch.arange(m + 1, device=device), target.cache_len - 1)
    visible = tree_visible(Q, tree.block, real, target.cache_len)
    logits, hidden = target.forward_rows(target.embed_tokens(in_rows(seq, R)), in_rows(pos, R), in_rows(slots, R),
                                         in_rows(visible, R))
    P = batch_probs(logits, params, n[:, None] + F.pad(tree.depths, (1, 0)))
    # 4. accept a path, draw the next token
    if stream is None:
        depth = torch.where(drafted, tree.depths, 0)
        path, p = tree_greedy_paths(P, X, tree.parent.expand(B, m), depth, tree.anc.expand(B, m, m), table, rule)
        path, token, used = path[:, :D], p.argmax(-1), 0
    else:
        kids, q_row = shape.kids.expand(B, m + 1, -1), shape.q_row.expand(B, m + 1)
        start = taken + shape.grown[cut]  # after the cut shape's growth (levels past the cut drew from later ones)
        u = stream.gather(1, start[:, None] + torch.arange(D * kids.shape[2] + 1, device=device))
        path, p, used = walk(P, torch.cat(qs, 1), X, ok, kids, q_row, u, table, rule, D, tree.fanout)
        token = draw(p, u.gather(1, used[:, None])[:, 0])
    a = torch.where(live, (path >= 0).sum(-1), 0)
    # 5. commit: the accepted nodes' cache entries into slots Q + 1 .. Q + a, the tokens, the next catch-up
    cols = torch.arange(D, device=device)
    src = torch.where(cols < a[:, None], Q[:, None] + 1 + path.clamp(min=0), Q[:, None] + 1 + cols)
    dst = Q[:, None] + 1 + cols
    rows = torch.arange(R * B, device=device)[:, None].expand(R * B, D).reshape(-1)
    target.keep_rows(rows, in_rows(src, R).reshape(-1), in_rows(dst, R).reshape(-1))
    drafts = F.pad(X.gather(1, path.clamp(min=0)), (0, 1)).scatter(1, a[:, None], token[:, None])
    buf.scatter_(1, n[:, None] + j, drafts)  # past a finished image's end: buf's scratch columns
    at = F.pad(path + 1, (1, 0)).clamp(min=0)
    pend_h.copy_(hidden.view(R, B, m + 1, -1)[:, torch.arange(B, device=device)[:, None], at].flatten(0, 1))
    pend_len.copy_(a + 1)
    if stream is not None:  # the growth's, the walk's, the next token's unless the drafts completed the image
        taken.add_(torch.where(live, shape.grown[cut] + used + (n + a < N).long(), 0))
    n.copy_(torch.where(live, (n + a + 1).clamp(max=N), n))
    return a


class GraphTreeRounds(GraphRounds):
    """Static-tree rounds (trees.StaticTree) as one compiled call each (`static_tree_round`)."""

    round_fn = staticmethod(static_tree_round)

    def __init__(self, target, drafter, drafting: StaticTree, *args):
        super().__init__(target, drafter, drafting, *args)
        tree = drafting.to(self.device)
        if not hasattr(tree, "graph_tensors"):
            tree.graph_tensors = TreeTensors(tree)
        self.shape = tree.graph_tensors
        self.width = tree.depth + 1
        self.per_round = int(self.shape.grown[-1]) + tree.depth * self.shape.kids.shape[1] + 1

    def round_args(self):
        return self.shape

    def tally(self, im, a: int) -> None:
        cut = min(self.shape.tree.depth, self.N - im.n)
        im.stats.drafter_forwards += 1 + self.shape.passes[cut]  # the catch-up, then the growth's passes
        im.stats.tree_depth.append(cut)
