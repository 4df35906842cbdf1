"""A static draft tree's round as ONE compiled call (compile=True), the tree counterpart of chain_graph.py: the
drafter's catch-up, the tree grown a level at a time (a sampled tree's children drawn without replacement, a greedy
tree's the drafter's top ranks), the target's verify over [y, nodes] with the tree mask, acceptance (greedy: the
deepest node whose path passes; sampling: tree_rounds.walk), the residual or bonus draw, the accepted path's
target cache entries moved into consecutive slots, and the commit, over every image at the shape's full size.

Near an image's end tree_rounds.TreeRounds cuts the shape at the tokens the image has left (StaticTree.upto);
here the full shape always runs and the nodes past the cut are padding: never offered, never accepted, run at
position 0 into the scratch slot, and their uniforms never drawn (a round takes the cut shape's growth uniforms,
`growth_uniforms`, then the walk's). So every image gets the tokens of the eager rounds, uniform for uniform.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from lantern.engine.decoding.chain_graph import GraphRounds
from lantern.engine.decoding.forced import code_positions
from lantern.engine.decoding.forced_trees import (end_groups, ends_at, ends_before, eol_parents, eol_visible,
                                                  eol_width, layout_extras, splice, tree_depth, tree_plan)
from lantern.engine.decoding.rounds import batch_probs, in_rows, ragged
from lantern.engine.decoding.sampling import SamplingParams, draw
from lantern.engine.decoding.tree_rounds import tree_greedy_paths, walk
from lantern.engine.decoding.trees import DynamicTree, StaticTree, successive_draws
from lantern.engine.models.drafter import Drafter
from lantern.engine.models.layout import Layout, image_logits
from lantern.engine.models.model import GPT
from lantern.engine.rules.acceptance import AcceptRule


def pad_mask(mask: Tensor, pad: tuple[int, ...]) -> Tensor:
    """F.pad of a bool tensor with False, through uint8: inductor's CPU code for a padded bool computed in the same
    graph does not compile (torch 2.14: a VecMask<unsigned char> against a VecMask<float>)."""
    return F.pad(mask.to(torch.uint8), pad) != 0


def tree_visible(Q: Tensor, block: Tensor, real: Tensor, cache_len: int) -> Tensor:
    """[B, S, cache_len]: for each image's queries (block [S, m] or [B, S, m] over the tree slots Q .. Q + m - 1), the committed
    slots < Q and their tree slots; nothing for the padding queries (real [B, S] False)."""
    B, (S, m) = Q.shape[0], block.shape[-2:]
    visible = (torch.arange(cache_len, device=Q.device) < Q[:, None])[:, None, :].expand(B, S, cache_len).clone()
    cols = (Q[:, None] + torch.arange(m, device=Q.device))[:, None, :].expand(B, S, m)
    visible.scatter_(2, cols, block.expand(B, S, m))
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


def catch_up(drafter: Drafter, buf: Tensor, n: Tensor, pend_h: Tensor, pend_len: Tensor, live: Tensor, Q: Tensor,
             params: SamplingParams, layout: Layout | None = None,
             pend_ids: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The drafter's catch-up over every image's pending inputs (chain_graph.py's state; Q [B] y's position): the
    predicted state below y [R * B, 1, d] and the root's distribution [B, 1, V]. layout: the pending inputs are the
    ids pend_ids (eol tokens among them), the distribution over the image head."""
    B, W, device = n.shape[0], pend_h.shape[1], n.device
    R, j = pend_h.shape[0] // B, torch.arange(W, device=device)
    lengths = torch.where(live, pend_len, 0)
    tokens = buf.gather(1, ((n - pend_len)[:, None] + j).clamp(0, buf.shape[1] - 1)) if layout is None else pend_ids
    pos, slots, visible = ragged(Q - pend_len, lengths, W, R, drafter.cache_len)
    out = drafter.forward_rows(in_rows(drafter.embed_tokens(tokens), R), pend_h, pos, slots, visible)
    last = (lengths - 1).clamp(min=0)
    hidden = out.view(R, B, W, -1)[:, torch.arange(B, device=device), last].reshape(R * B, 1, -1)
    head = drafter.head(hidden)
    return hidden, batch_probs(head if layout is None else image_logits(layout, head), params, n[:, None])


def tree_pass(drafter: Drafter, tokens: Tensor, hidden: Tensor, Q: Tensor, pos, slots: Tensor, anc: Tensor,
              real: Tensor, index: Tensor, params: SamplingParams,
              layout: Layout | None = None) -> tuple[Tensor, Tensor]:
    """One drafter pass over S nodes of every image's tree (trees.TreePass at fixed shapes): tokens [B, S] at
    drafter position Q + pos, written to slots Q + slots ([S] or [B, S]), seeing the committed prefix and the tree
    slots anc ([S, m] or [B, S, m]) from Q on, reading hidden [R * B, S, d]; padding where real [B, S] is False.
    Returns the predicted states [R * B, S, d] and their distributions [B, S, V] at image-token index `index` [B].
    pos: an int or each image's [B]; layout: tokens are ids, the distributions over the image head."""
    B, S, L = tokens.shape[0], tokens.shape[1], drafter.cache_len
    R = hidden.shape[0] // B
    pos_ = torch.where(real, (Q + pos)[:, None], 0)
    slots_ = torch.where(real, Q[:, None] + slots, L - 1)
    out = drafter.forward_rows(in_rows(drafter.embed_tokens(tokens), R), hidden, in_rows(pos_, R),
                               in_rows(slots_, R), in_rows(tree_visible(Q, anc, real, L), R))
    head = drafter.head(out)
    return out, batch_probs(head if layout is None else image_logits(layout, head), params,
                            index[:, None].expand(-1, S))


class Eols:
    """Under a layout, what a graph round's drafter passes need of its row ends (forced_trees.py): y's code c0 [B],
    the codes N, the tree slots m, the slots an eol pass followed (marked [B, m]) and whether y's eol was fed."""

    def __init__(self, layout: Layout, n: Tensor, N: int, m: int, live: Tensor):
        self.layout, self.c0, self.N, self.m = layout, n - 1, N, m
        self.marked = torch.zeros(n.shape[0], m, dtype=torch.bool, device=n.device)
        self.y_eol = ends_at(layout, self.c0, 0, N) & live

    def root(self, drafter: Drafter, hidden: Tensor, q: Tensor, Q: Tensor, n: Tensor, params: SamplingParams):
        """The root's state and children's distribution after y's eol where y ends a row (a padding pass
        elsewhere)."""
        B, device = n.shape[0], n.device
        if self.layout.eol is None:  # a layout of codes only (Anole's): nothing to feed
            return hidden, q
        none = torch.zeros(1, 2 * self.m + 1, dtype=torch.bool, device=device)
        out, q_eol = tree_pass(drafter, torch.full((B, 1), self.layout.eol, device=device), hidden, Q, 0,
                               torch.full((1,), 2 * self.m, device=device), none, self.y_eol[:, None], n, params,
                               self.layout)
        return self.choose(self.y_eol, out, hidden), torch.where(self.y_eol[:, None, None], q_eol, q)

    def choose(self, at: Tensor, eol: Tensor, out: Tensor) -> Tensor:
        R = out.shape[0] // at.shape[0]
        return torch.where(in_rows(at, R)[:, None, None], eol, out)

    def nodes_pass(self, drafter: Drafter, tokens: Tensor, hidden: Tensor, Q: Tensor, k: int, slots: Tensor,
                   anc: Tensor, real: Tensor, index: Tensor, params: SamplingParams) -> tuple[Tensor, Tensor]:
        """tree_pass over codes at depth k (slots [S] of m), spliced: at their positions, seeing their ancestors'
        eols, then, for the images whose depth k ends a row, the eol's pass (slots m + theirs), whose states and
        distributions answer."""
        c0, layout, B = self.c0, self.layout, tokens.shape[0]
        pos = k - 1 + ends_before(layout, c0, torch.full_like(c0, k), self.N)
        visible = eol_visible(anc.expand(B, *anc.shape[-2:]), self.marked, self.y_eol, self.m)
        out, q = tree_pass(drafter, tokens + layout.code_offset, hidden, Q, pos, slots, visible, real, index, params,
                           layout)
        if layout.eol is None:
            return out, q
        at = ends_at(layout, c0, k, self.N)
        eol, q_eol = tree_pass(drafter, torch.full_like(tokens, layout.eol), out, Q, pos + 1, self.m + slots, visible,
                               real & at[:, None], index, params, layout)
        self.marked = self.marked | (at[:, None] & (torch.arange(self.m, device=c0.device) == slots[:, None]).any(0))
        return self.choose(at, eol, out), torch.where(at[:, None, None], q_eol, q)


def static_growth(tree: StaticTree, shape: "TreeTensors", hidden: Tensor, q: Tensor, Q: Tensor, n: Tensor,
                  cut: Tensor, stream: Tensor | None, taken: Tensor, drafter: Drafter, params: SamplingParams,
                  eols: Eols | None = None):
    """A static shape grown a level at a time for every image (trees.StaticTree.growth; nodes past an image's cut
    are grown too, as padding). Returns the tree (tokens X, whether each child may be offered ok, depth (0: not
    drafted), parent, anc, kids, q_row, the drafter rows q or None, the growth's uniforms) for verify_and_commit."""
    B, m, device = n.shape[0], tree.n, n.device
    X = torch.zeros(B, m, dtype=torch.long, device=device)
    ok = torch.ones(B, m, dtype=torch.bool, device=device)
    qs, offset = [q], taken + 0
    for d, lvl in enumerate(tree.levels):
        rows, width = q.shape[1], lvl.width
        if stream is None:
            top = q.topk(width, dim=-1).indices
        else:  # successive draws without replacement, `width` uniforms per row
            u = stream.gather(1, offset[:, None] + torch.arange(rows * width, device=device))
            top, mass = successive_draws(q.reshape(B * rows, -1), u.view(B * rows, width))
            top, mass = top.view(B, rows, width), mass.view(B, rows, width)
            ok[:, lvl.lo : lvl.hi] = mass[:, lvl.parent_row, lvl.rank]
            offset = offset + rows * width
        X[:, lvl.lo : lvl.hi] = top[:, lvl.parent_row, lvl.rank]
        if not len(lvl.runners):
            break
        real = (d + 1 < cut)[:, None].expand(B, len(lvl.runners))  # runners inside the cut
        grow = tree_pass if eols is None else eols.nodes_pass  # a layout: depth d + 1, spliced
        hidden, q = grow(drafter, X[:, lvl.runners], hidden[:, lvl.runner_parent_row], Q, d if eols is None else d + 1,
                         lvl.runners, lvl.runner_anc, real, n + d + 1, params)
        qs.append(q)
    drafted = tree.depths[None, :] <= cut[:, None]
    grown = None if stream is None else shape.grown[cut]
    return (X, ok & drafted, torch.where(drafted, tree.depths, 0), tree.parent.expand(B, m),
            tree.anc.expand(B, m, m), shape.kids.expand(B, m + 1, -1), shape.q_row.expand(B, m + 1),
            None if stream is None else torch.cat(qs, 1), grown)


def dynamic_growth(tree: DynamicTree, hidden: Tensor, q: Tensor, Q: Tensor, n: Tensor, N: int, live: Tensor,
                   drafter: Drafter, params: SamplingParams, eols: Eols | None = None):
    """EAGLE-2's expansions for every image (trees.DynamicTree.growth), always all of them: near an image's end,
    where the eager growth runs fewer, the nodes deeper than its levels are left out of the kept set (scored
    -inf, after every offered node, so the kept nodes and their order are the eager tree's, then padding).
    Returns what static_growth returns (no drafter rows: the drafts are deterministic; no uniforms)."""
    B, device = n.shape[0], n.device
    k, m, E = tree.top_k, tree.total_tokens - 1, tree.depth
    R = hidden.shape[0] // B
    levels = torch.where(live, (N - n).clamp(max=E + 1), 0)  # the eager growth's levels for each image
    eye = torch.eye(k, dtype=torch.bool, device=device)
    score, tok = q[:, 0].log().topk(k)
    c_tok, c_score = [tok], [score]
    c_parent, c_depth = [torch.full((B, k), -1, device=device)], [torch.full((B, k), 1, device=device)]
    front = torch.arange(k, device=device).expand(B, k)
    hidden = hidden.expand(-1, k, -1)
    anc = pad_mask(eye, (0, E * k - k)).expand(B, k, E * k)
    offered = k
    for e in range(1, E + 1):
        real = (e < levels)[:, None].expand(B, k)
        grow = tree_pass if eols is None else eols.nodes_pass  # a layout: depth e, spliced
        hidden, q = grow(drafter, tok, hidden, Q, e - 1 if eols is None else e,
                         (e - 1) * k + torch.arange(k, device=device), anc, real, n + e, params)
        ls, lt = q.log().topk(k, dim=-1)
        cs = (score[:, :, None] + ls).flatten(1)
        c_tok.append(lt.flatten(1))
        c_score.append(cs)
        c_parent.append(front.repeat_interleave(k, dim=1))
        c_depth.append(torch.full((B, k * k), e + 1, device=device))
        if e < E:
            best = cs.topk(k).indices
            par = best // k
            front, tok, score = offered + best, lt.flatten(1).gather(1, best), cs.gather(1, best)
            hidden = hidden.view(R, B, k, -1).gather(2, par[None, :, :, None].expand(R, B, k, hidden.shape[-1]))
            hidden = hidden.reshape(R * B, k, -1)
            anc = anc.gather(1, par[:, :, None].expand(B, k, E * k))
            anc = anc | pad_mask(eye, (e * k, (E - e - 1) * k))[None]
        offered += k * k
    depth = torch.cat(c_depth, 1)
    scores = torch.where(depth <= levels[:, None], torch.cat(c_score, 1), float("-inf"))
    keep = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :m].sort(1).values
    n_kept = torch.clamp(k + (levels - 1) * k * k, max=m)  # how many of them the eager tree keeps
    drafted = torch.arange(m, device=device) < n_kept[:, None]
    renumber = torch.full((B, offered), -1, dtype=torch.long, device=device).scatter(
        1, keep, torch.arange(m, device=device).expand(B, m))
    up = torch.cat(c_parent, 1).gather(1, keep)
    parent = torch.where(up >= 0, renumber.gather(1, up.clamp(min=0)), up)
    depth = torch.where(drafted, depth.gather(1, keep), 0)
    anc = torch.eye(m, dtype=torch.bool, device=device).expand(B, m, m)
    for d in range(2, E + 2):  # a level at a time: the parents' rows are complete
        parents = anc.gather(1, parent.clamp(min=0)[:, :, None].expand(B, m, m))
        anc = torch.where((depth == d)[:, :, None], anc | parents, anc)
    anc = anc & drafted[:, :, None] & drafted[:, None, :]
    is_child = (parent[:, None, :] + 1 == torch.arange(m + 1, device=device)[None, :, None]) & drafted[:, None, :]
    rank = torch.where(is_child, is_child.long().cumsum(2) - 1, k)
    kids = torch.full((B, m + 1, k + 1), -1, dtype=torch.long, device=device).scatter(
        2, rank, torch.arange(m, device=device).expand(B, m + 1, m))[:, :, :k]
    X = torch.cat(c_tok, 1).gather(1, keep)
    return X, drafted, depth, parent, anc, kids, torch.zeros(B, m + 1, dtype=torch.long, device=device), None, None


def verify_and_commit(target: GPT, buf: Tensor, n: Tensor, pend_h: Tensor, pend_len: Tensor, stream: Tensor | None,
                      taken: Tensor, params: SamplingParams, table: Tensor | None, rule: AcceptRule, live: Tensor,
                      tree, fanout: list[int] | None, leaf_order: bool, layout: Layout | None = None,
                      pend_ids: Tensor | None = None, eols: tuple[int, int] = (0, 0)) -> Tensor:
    """The target's verify over every image's [y, nodes] (`tree`: a growth's return), acceptance, the next token,
    the accepted nodes' cache moves and the commit (chain_graph.py's state, updated in place). Returns [B, 2]: the
    accepted lengths a (0 for finished images) and each tree's deepest node. layout: the verify tree spliced with
    eol nodes (forced_trees.splice, `eols` = (row-end groups, eol nodes per group)), acceptance on the code tree,
    the kept rows (eols included) moved into consecutive slots and fed to the drafter as ids (pend_ids)."""
    X, ok, depth, parent, anc, kids, q_row, q, grown = tree
    B, m, device = X.shape[0], X.shape[1], X.device
    R, D = pend_h.shape[0] // B, pend_h.shape[1] - 1 - eols[0]
    N, T = target.args.image_tokens if layout is None else layout.codes, target.args.cls_token_num
    Q = T + n - 1 if layout is None else code_positions(layout, T, n - 1)
    drafted = depth > 0
    y = buf.gather(1, (n - 1)[:, None])
    if layout is None:
        block = pad_mask(anc, (1, 0, 1, 0))  # trees._block for every image: [y, nodes], each row sees y
        block[:, :, 0] = True
        seq, off, real = torch.cat([y, X], 1), F.pad(depth, (1, 0)), torch.cat([live[:, None], drafted], 1)
    else:
        parents, real_eol = eol_parents(layout, depth, n - 1, N, *eols)
        seq, off, block, code_row = splice(layout, X, depth, anc, parents, real_eol, y[:, 0], n - 1, N)
        real = torch.cat([live[:, None], drafted, real_eol & live[:, None]], 1)
    S = seq.shape[1]
    pos = torch.where(real, Q[:, None] + off, 0)
    slots = torch.where(real, Q[:, None] + torch.arange(S, device=device), target.cache_len - 1)
    logits, hidden = target.forward_rows(target.embed_tokens(in_rows(seq, R)), in_rows(pos, R), in_rows(slots, R),
                                         in_rows(tree_visible(Q, block, real, target.cache_len), R))
    if layout is not None:  # each node's children read its eol's row where it has one, over the image head
        V = logits.shape[-1]
        logits = logits.view(R, B, S, V).gather(2, code_row[None, ..., None].expand(R, -1, -1, V))
        logits = image_logits(layout, logits.view(R * B, 1 + m, V))
    P = batch_probs(logits, params, n[:, None] + F.pad(depth, (1, 0)))
    if stream is None:
        path, p = tree_greedy_paths(P, X, parent, depth, anc, table, rule, leaf_order)
        path, token = path[:, :D], p.argmax(-1)
    else:
        start = taken + (0 if grown is None else grown)  # after the growth's uniforms
        u = stream.gather(1, start[:, None] + torch.arange(D * kids.shape[2] + 1, device=device))
        path, p, used = walk(P, q, X, ok, kids, q_row, u, table, rule, D, fanout)
        token = draw(p, u.gather(1, used[:, None])[:, 0])
    a = torch.where(live, (path >= 0).sum(-1), 0)
    W = pend_h.shape[1]
    if layout is None:  # the path's rows, y's first
        kept, length = F.pad(path + 1, (1, 0)).clamp(min=0), a + 1
    else:  # the path's rows and, after a node that ends a row, its eol's row
        kept, length = kept_rows(code_row, path, a, W)
    cols = torch.arange(1, W, device=device)
    src = torch.where(cols < length[:, None], Q[:, None] + kept[:, 1:], Q[:, None] + cols)
    rows = torch.arange(R * B, device=device)[:, None].expand(R * B, W - 1).reshape(-1)
    target.keep_rows(rows, in_rows(src, R).reshape(-1), in_rows(Q[:, None] + cols, R).reshape(-1))
    drafts = F.pad(X.gather(1, path.clamp(min=0)), (0, 1)).scatter(1, a[:, None], token[:, None])
    buf.scatter_(1, n[:, None] + torch.arange(D + 1, device=device), drafts)  # past an end: buf's scratch columns
    pend_h.copy_(hidden.view(R, B, S, -1)[:, torch.arange(B, device=device)[:, None], kept].flatten(0, 1))
    pend_len.copy_(length)
    if layout is not None:  # the ids after the kept rows, then the next code
        pend_ids.copy_(F.pad(seq.gather(1, kept[:, 1:]), (0, 1)).scatter(1, (length - 1)[:, None],
                                                                         token[:, None] + layout.code_offset))
    if stream is not None:  # the growth's, the walk's, the next token's unless the drafts completed the image
        taken.add_(torch.where(live, start - taken + used + (n + a < N).long(), 0))
    n.copy_(torch.where(live, (n + a + 1).clamp(max=N), n))
    return torch.stack([a, torch.where(live, depth.amax(1), 0)], 1)


def kept_rows(code_row: Tensor, path: Tensor, a: Tensor, W: int) -> tuple[Tensor, Tensor]:
    """The verify rows an accepted path keeps under a layout, in sequence order, [B, W] (padded), and how many:
    y's row, each accepted node's, and after y or a node that ends a row, its eol's (code_row: the row predicting
    each of [y, nodes]' children; it differs from the node's own where an eol follows)."""
    D, device = path.shape[1], path.device
    item = F.pad(path + 1, (1, 0)).clamp(min=0)  # [B, D + 1]: y, then the path's rows
    valid = torch.arange(D + 1, device=device) <= a[:, None]
    pred = code_row.gather(1, item)
    has = (pred != item) & valid
    at = torch.arange(D + 1, device=device) + has.long().cumsum(1) - has.long()  # each item's place
    kept = torch.zeros(path.shape[0], W + 1, dtype=torch.long, device=device)
    kept = kept.scatter(1, torch.where(valid, at, W), item).scatter(1, torch.where(has, at + 1, W), pred)
    return kept[:, :W], valid.sum(1) + has.sum(1)


def tree_round(target: GPT, drafter: Drafter, buf: Tensor, n: Tensor, pend_h: Tensor, pend_len: Tensor,
               stream: Tensor | None, taken: Tensor, params: SamplingParams, table: Tensor | None, rule: AcceptRule,
               shape: "TreeTensors | DynamicTree", layout: Layout | None = None, pend_ids: Tensor | None = None,
               eols: tuple[int, int] = (0, 0)) -> Tensor:
    """One round of a static or dynamic tree for every image (chain_graph.py's state, updated in place; pend_h is
    the tree's depth + 1 wide, under a layout its row ends' eols wider). Returns [B, 2]: the accepted lengths (0
    for finished images), the deepest nodes. layout: y's eol and each row end's eol fed to the drafter (Eols, a
    padding pass where an image has none), the verify spliced (verify_and_commit)."""
    N, T = target.args.image_tokens if layout is None else layout.codes, target.args.cls_token_num
    live = n < N
    Q = T + n - 1 if layout is None else code_positions(layout, T, n - 1)  # y's target position
    hidden, q = catch_up(drafter, buf, n, pend_h, pend_len, live, Q, params, layout, pend_ids)
    static = isinstance(shape, TreeTensors)
    spliced = None
    if layout is not None:
        spliced = Eols(layout, n, N, shape.tree.n if static else shape.drafter_extra, live)
        hidden, q = spliced.root(drafter, hidden, q, Q, n, params)
    if static:
        tree, D = shape.tree, shape.tree.depth
        cut = torch.where(live, (N - n).clamp(max=D), 0)  # the shape's depth this image drafts
        grown = static_growth(tree, shape, hidden, q, Q, n, cut, stream, taken, drafter, params, spliced)
        return verify_and_commit(target, buf, n, pend_h, pend_len, stream, taken, params, table, rule, live, grown,
                                 tree.fanout, False, layout, pend_ids, eols)
    grown = dynamic_growth(shape, hidden, q, Q, n, N, live, drafter, params, spliced)
    return verify_and_commit(target, buf, n, pend_h, pend_len, stream, taken, params, table, rule, live, grown, None,
                             True, layout, pend_ids, eols)


class GraphTreeRounds(GraphRounds):
    """Static and dynamic tree rounds (trees.StaticTree, trees.DynamicTree) as one compiled call each
    (`tree_round`)."""

    round_fn = staticmethod(tree_round)

    def __init__(self, target, drafter, drafting, *args):
        super().__init__(target, drafter, drafting, *args)
        if isinstance(drafting, StaticTree):
            tree = drafting.to(self.device)
            if not hasattr(tree, "graph_tensors"):
                tree.graph_tensors = TreeTensors(tree)
            self.shape, depth, C = tree.graph_tensors, tree.depth, tree.graph_tensors.kids.shape[1]
            grown = int(self.shape.grown[-1])
        else:
            self.shape, depth, C, grown = drafting, drafting.depth + 1, drafting.top_k, 0
        self.width = depth + 1
        self.per_round = grown + depth * C + 1

    def round_args(self):
        return self.shape

    def use_layout(self, layout: Layout) -> None:
        super().use_layout(layout)
        groups = end_groups(layout, tree_depth(self.drafting))
        self.width += groups  # the kept rows: a path's and its row ends' eols
        self.eols = (groups, eol_width(self.drafting))

    def cache_extras(self) -> tuple[int, int]:
        if self.layout is None:
            return super().cache_extras()
        return layout_extras(self.drafting, self.layout)

    def round_inputs(self) -> tuple:
        return super().round_inputs() + (() if self.layout is None else (self.eols,))

    def tally(self, im, a: int, deepest: int) -> None:
        if isinstance(self.shape, TreeTensors):
            depth = min(self.shape.tree.depth, self.N - im.n)
            passes = self.shape.passes[depth]
        else:
            depth = min(self.shape.depth + 1, self.N - im.n)
            passes = depth - 1
        if self.layout is not None:  # the eol passes an eager round runs: y's, and after each row end with runners
            ends = tree_plan(self.layout, im.n - 1, depth, 0, "cpu").ends
            passes += sum(D <= passes for D in ends)
        im.stats.drafter_forwards += 1 + passes  # the catch-up, then the growth's passes
        im.stats.tree_depth.append(deepest)
