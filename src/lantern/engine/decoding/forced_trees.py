"""Draft trees under a layout with forced structural tokens (docs/chameleon-layout.md, "Tree rounds"): where a
round's end-of-line tokens sit in the drafter's passes and in the target's verify tree, for tree_rounds.TreeRounds.

A round of an image whose newest token y is code c0 holds, at depth k of its tree, code c0 + k (all nodes of a depth
share it). When code c0 + D ends a row (and is not the grid's last code, after which nothing is read), every node at
depth D (y when D = 0) is followed by an eol: a node of its own in the verify tree, the parent of that node's
children, at one position more; the drafter feeds it too (one pass more), so that the children are drawn from the
eol's predicted state, as the drafter was trained. Acceptance runs on the code tree: a node's children read the
target's row of its eol where it has one (`code_row`), so trees.py's walk and greedy paths are unchanged, and the
forced tokens are never drafted, never tested, never relaxed. Uniforms: none spent on an eol.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from lantern.engine.decoding.trees import Draft, StaticTree
from lantern.engine.models.layout import Layout


@dataclass
class TreePlan:
    """One image's round under a layout: the depths D whose code ends a row with an eol the round reads (0: y), and
    the drafter's tree slots (of m) whose node an eol pass followed (device, filled as the tree grows)."""

    ends: list[int]
    marked: Tensor

    def eols_before(self, k: int) -> int:
        """Eol tokens between y and the code at depth k: the spliced sequence puts that code k + this after y."""
        return sum(D < k for D in self.ends)


def tree_plan(layout: Layout, c0: int, depth: int, m: int, device) -> TreePlan:
    """The plan of a round whose y is code c0 and whose tree reaches `depth` (the drafter's tree slots: m)."""
    ends = [] if layout.eol is None else [D for D in range(depth + 1) if (c0 + D) % layout.cols == layout.cols - 1
                                          and c0 + D < layout.codes - 1]
    return TreePlan(ends, torch.zeros(m, dtype=torch.bool, device=device))


def depth_widths(drafting) -> list[int]:
    """The most nodes a tree holds at each depth 1, 2, .. (a static shape's counts; a dynamic tree's bound: the
    root's top_k, then top_k squared offered per expansion, never more than its nodes)."""
    if isinstance(drafting, StaticTree):
        return [sum(len(p) == d for p in drafting.paths) for d in range(1, drafting.depth + 1)]
    m, k = drafting.total_tokens - 1, drafting.top_k
    return [min(m, k)] + [min(m, k * k)] * drafting.depth


def tree_depth(drafting) -> int:
    """The deepest node a tree drafts (a dynamic tree's expansions reach depth + 1)."""
    return drafting.depth if isinstance(drafting, StaticTree) else drafting.depth + 1


def eol_width(drafting) -> int:
    """The most eol nodes one row end of a round adds: the widest depth's nodes."""
    return max(depth_widths(drafting))


def layout_extras(drafting, layout: Layout) -> tuple[int, int]:
    """(target, drafter) spare cache slots of a tree's rounds under a layout: the nodes and the eol nodes a round
    may verify; the drafter's tree slots, mirrored for the eol passes, and y's eol."""
    eols = end_groups(layout, tree_depth(drafting)) * eol_width(drafting)
    return drafting.target_extra + eols, 2 * drafting.drafter_extra + 1


def ends_before(layout: Layout, c0: Tensor, k: Tensor, N: int) -> Tensor:
    """The eol tokens a round reads between y = code c0 and its code at depth k (broadcast shapes): row ends at
    depths D < k whose code is not the grid's last. A node at depth k sits k + this after y."""
    if layout.eol is None:
        return torch.zeros_like(k)
    first = layout.cols - 1 - c0 % layout.cols  # the first depth whose code ends a row
    lim = torch.minimum(k, N - 1 - c0)
    return torch.where(lim > first, (lim - 1 - first).div(layout.cols, rounding_mode="floor") + 1, 0)


def ends_at(layout: Layout, c0: Tensor, k, N: int) -> Tensor:
    """Whether the code at depth k of a round from y = code c0 ends a row with an eol the round reads."""
    if layout.eol is None:
        return torch.zeros_like(c0, dtype=torch.bool)
    return ((c0 + k) % layout.cols == layout.cols - 1) & (c0 + k < N - 1)


def end_groups(layout: Layout, depth: int) -> int:
    """The most row ends a round of a tree `depth` deep meets (y's included): one every cols depths."""
    return 0 if layout.eol is None else -(-(depth + 1) // layout.cols)


def eol_visible(anc: Tensor, marked: Tensor, y_eol: Tensor, m: int) -> Tensor:
    """A drafter pass's visibility over the 2 m + 1 tree slots (anc [B, S, m'] over the nodes' slots; marked [B, m]
    the slots an eol pass followed, not yet the pass's own; y_eol [B] whether y's eol was fed): its nodes' slots, the
    eols of its ancestors (slot m + the ancestor's) and y's eol (slot 2 m)."""
    anc = F.pad(anc, (0, m - anc.shape[-1]))
    return torch.cat([anc, anc & marked[:, None, :], y_eol[:, None, None].expand(-1, anc.shape[1], 1)], 2)


def drafter_pass(plan: TreePlan, pos: int, anc: Tensor, slots: Tensor, m: int) -> tuple[int, Tensor, bool]:
    """A growth pass of an eager round (trees.TreePass: nodes at depth pos + 1, seeing tree slots anc [S, m'] from
    Q on) under the image's plan: (its drafter position offset from Q, its visibility over the 2 m + 1 tree slots,
    whether an eol pass follows it). An eol pass writes slot m + (its node's slot) at one position more, sees what
    its node sees, and marks the slot for deeper passes."""
    k = pos + 1
    y_eol = torch.full((1,), 0 in plan.ends, dtype=torch.bool, device=anc.device)
    visible = eol_visible(anc[None], plan.marked[None], y_eol, m)[0]
    eol = k in plan.ends
    if eol:
        plan.marked[slots] = True
    return pos + plan.eols_before(k), visible, eol


def eol_parents(layout: Layout, depth: Tensor, c0: Tensor, N: int, groups: int, width: int) -> tuple[Tensor, Tensor]:
    """The eol nodes of B trees at fixed shapes: (parents [B, E], -1 for y; real [B, E]), E = groups x width: group
    g holds the eols after the nodes at the g-th row-end depth D (contiguous in node order: nodes of a depth are),
    y's alone when D = 0. depth [B, m]: the nodes' depths, 0 where not drafted."""
    B, m, device = depth.shape[0], depth.shape[1], depth.device
    D = layout.cols - 1 - c0 % layout.cols
    D = D[:, None] + layout.cols * torch.arange(groups, device=device)  # [B, G]
    valid = (c0[:, None] + D < N - 1) & (D <= depth.amax(1, keepdim=True))
    start = ((depth > 0)[:, None, :] & (depth[:, None, :] < D[..., None])).sum(-1)  # nodes shallower than D
    at = start[..., None] + torch.arange(width, device=device)  # [B, G, W]
    node = at.clamp(max=m - 1)
    real = (at < m) & (depth.gather(1, node.flatten(1)).view_as(at) == D[..., None])
    on_y = D[..., None] == 0
    real = torch.where(on_y, torch.arange(width, device=device) == 0, real) & valid[..., None]
    return torch.where(on_y, -1, node).flatten(1), real.flatten(1)


def splice(layout: Layout, X: Tensor, depth: Tensor, anc: Tensor, parents: Tensor, real: Tensor, y: Tensor,
           c0: Tensor, N: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The verify trees of B images, [y, nodes, eol nodes] (X, depth [B, m]; anc [B, m, m] each node's ancestors and
    itself; the eol nodes' parents and real [B, E]): (ids, position offsets from Q [B, 1 + m + E], tree mask
    [B, 1 + m + E, 1 + m + E], code_row [B, 1 + m]: the row that predicts the children of each of [y, nodes], its
    eol's where it has one). A node sees the eols of its ancestors; an eol sees what its node sees, and itself."""
    B, m, E, device = X.shape[0], X.shape[1], parents.shape[1], X.device
    block = torch.cat([torch.ones(B, 1 + m, 1, dtype=torch.bool, device=device),
                       torch.cat([torch.zeros(B, 1, m, dtype=torch.bool, device=device), anc], 1)], 2)
    row = parents + 1  # [B, E] the eol's node among [y, nodes]
    cols = block.gather(2, row[:, None, :].expand(B, 1 + m, E)) & real[:, None, :] & \
        (torch.arange(1 + m, device=device)[None, :, None] != row[:, None, :])
    top = torch.cat([block, cols], 2)
    own = torch.cat([torch.zeros(E, 1 + m, dtype=torch.bool, device=device),
                     torch.eye(E, dtype=torch.bool, device=device)], 1)
    mask = torch.cat([top, top.gather(1, row[..., None].expand(B, E, 1 + m + E)) | own], 1)
    d = F.pad(depth, (1, 0))
    node_off = d + ends_before(layout, c0[:, None], d, N)
    off = torch.cat([node_off, node_off.gather(1, row) + 1], 1)
    ids = torch.cat([y[:, None] + layout.code_offset, X + layout.code_offset,
                     torch.full((B, E), 0 if layout.eol is None else layout.eol, device=device)], 1)
    code_row = torch.arange(2 + m, device=device).expand(B, 2 + m).scatter(
        1, torch.where(real, row, 1 + m), (1 + m + torch.arange(E, device=device)).expand(B, E))[:, : 1 + m]
    return ids, off, mask, code_row


def spliced_tree(layout: Layout, draft: Draft, plan: TreePlan, widths: list[int], y: Tensor, c0: Tensor, N: int):
    """One image's verify tree in an eager round (`splice` for B = 1, eol groups as its plan's row ends, each as wide
    as its depth can be): (ids, position offsets, tree mask, real rows, code_row)."""
    width = max([1 if D == 0 else widths[D - 1] for D in plan.ends], default=0)
    parents, real = eol_parents(layout, draft.depth[None], c0, N, len(plan.ends), width)
    ids, off, mask, code_row = splice(layout, draft.tokens[None], draft.depth[None], draft.block[None, 1:, 1:],
                                      parents, real, y, c0, N)
    rows = torch.cat([torch.ones(1 + draft.tokens.shape[0], dtype=torch.bool, device=y.device), real[0]])
    return ids[0], off[0], mask[0], rows, code_row[0]


def spliced_path(nodes: list[int], preds: list[int]) -> list[int]:
    """The verify rows to keep, in sequence order, for an accepted code path: nodes the rows of y and the accepted
    nodes (0, then node + 1), preds their code_row (the row predicting their children); a node whose two differ has
    an eol after it. Returns [y's row 0, (y's eol), node 1, (its eol), ..]: the committed tokens and, last, the row
    that predicts the next code."""
    out = []
    for node, pred in zip(nodes, preds):
        out.append(node)
        if pred != node:
            out.append(pred)
    return out
