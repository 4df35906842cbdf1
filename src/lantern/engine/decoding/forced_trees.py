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

from lantern.engine.decoding.trees import Draft, DynamicTree, StaticTree
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
    assert isinstance(drafting, DynamicTree)
    m, k = drafting.total_tokens - 1, drafting.top_k
    return [min(m, k)] + [min(m, k * k)] * drafting.depth


def tree_depth(drafting) -> int:
    """The deepest node a tree drafts (a dynamic tree's expansions reach depth + 1)."""
    return drafting.depth if isinstance(drafting, StaticTree) else drafting.depth + 1


def layout_extras(drafting) -> tuple[int, int]:
    """(target, drafter) spare cache slots of a tree's rounds under a layout: the nodes and every eol node a round
    may verify; the drafter's tree slots, mirrored for the eol passes, and y's eol."""
    return drafting.target_extra + 1 + sum(depth_widths(drafting)), 2 * drafting.drafter_extra + 1


def drafter_pass(plan: TreePlan, pos: int, anc: Tensor, slots: Tensor, m: int) -> tuple[int, Tensor, bool]:
    """A growth pass (trees.TreePass: nodes at depth pos + 1, seeing tree slots anc [S, m'] from Q on) under the
    plan: (its drafter position offset from Q, its visibility over the 2 m + 1 tree slots: the nodes', the eol
    passes' of its ancestors, y's eol, whether an eol pass follows it). An eol pass writes slot m + (its node's slot)
    at one position more, sees what its node sees, and marks the slot for deeper passes."""
    k = pos + 1
    anc = F.pad(anc, (0, m - anc.shape[1]))
    y_eol = torch.full((anc.shape[0], 1), 0 in plan.ends, dtype=torch.bool, device=anc.device)
    visible = torch.cat([anc, anc & plan.marked, y_eol], 1)  # a pass's own nodes are not marked yet
    eol = k in plan.ends
    if eol:
        plan.marked[slots] = True
    return pos + plan.eols_before(k), visible, eol


def spliced_tree(layout: Layout, draft: Draft, plan: TreePlan, widths: list[int], y: Tensor):
    """The verify tree of one image: [y, nodes, eol nodes] with their ids, position offsets from Q, tree mask,
    which rows are real (a dynamic tree's eol rows are its depths' bounds, real where a node of that depth is), and
    code_row [1 + n]: the row that predicts each of [y, nodes]' children (its eol's where it has one)."""
    device, n = draft.tokens.device, draft.tokens.shape[0]
    parents, real = [], []
    for D in plan.ends:
        if D == 0:
            parents.append(torch.full((1,), -1, device=device))
            real.append(torch.ones(1, dtype=torch.bool, device=device))
            continue
        at = (draft.depth < D).sum() + torch.arange(widths[D - 1], device=device)  # nodes of a depth are contiguous
        parents.append(at.clamp(max=n - 1))
        real.append((at < n) & (draft.depth[at.clamp(max=n - 1)] == D))
    E = sum(len(p) for p in parents)
    parents = torch.cat(parents) if E else torch.zeros(0, dtype=torch.long, device=device)
    real = torch.cat(real) if E else torch.zeros(0, dtype=torch.bool, device=device)
    row = parents + 1  # [E] the eol's parent among [y, nodes]
    block = draft.block
    cols = block[:, row] & (torch.arange(1 + n, device=device)[:, None] != row[None, :]) & real[None, :]
    top = torch.cat([block, cols], 1)
    mask = torch.cat([top, top[row] | F.pad(torch.eye(E, dtype=torch.bool, device=device), (1 + n, 0))], 0)
    before = torch.tensor([plan.eols_before(k) for k in range(int(max(plan.ends, default=0)) + 2)], device=device)
    depth = F.pad(draft.depth, (1, 0))
    node_off = depth + before[depth.clamp(max=len(before) - 1)]
    off = torch.cat([node_off, node_off[row] + 1])  # an eol right after its node (a padding row: anywhere)
    ids = torch.cat([y.reshape(1) + layout.code_offset, draft.tokens + layout.code_offset,
                     torch.full((E,), layout.eol if E else 0, device=device)])
    code_row = torch.arange(2 + n, device=device).scatter(0, torch.where(real, row, 1 + n),
                                                          1 + n + torch.arange(E, device=device))[: 1 + n]
    return ids, off, mask, torch.cat([torch.ones(1 + n, dtype=torch.bool, device=device), real]), code_row


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
