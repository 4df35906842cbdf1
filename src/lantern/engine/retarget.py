"""LANTERN-TV: a relaxed rule whose per-step TV bound holds for sampled drafts too (this project's own rule).

Bounded LANTERN verifies draft x toward p~_x, a relaxed target that depends on x itself; with drafts sampled from
q every x in q's support borrows up to delta on its own, so the emitted marginal can leave p by more than delta
(acceptance.py's docstring, tests/test_acceptance.py). LANTERN-TV instead fixes ONE relaxed target per verified
position before looking at the draft, p~ = retarget(p, q, table, k, delta), and runs exact speculative sampling
toward it: accept x with min(1, p~(x) / q(x)), on rejection sample norm(max(p~ - q, 0)). Exact SD emits its target
exactly, so the emitted token's distribution is p~, and TV(p~, p) <= delta by construction. Siblings in a tree:
p~ from the node's (p, q), then acceptance.verify_candidates' exact sibling verification toward p~.

retarget's invariants (tests/test_rules_tv.py):
- mass moves only along latent-neighbour edges, a -> b with b among a's k nearest codes or a among b's;
- only out of codes with p > q (surplus, at most p - q each) into codes with q > p (deficit, at most q - p each),
  so no code both gives and takes, p~ >= 0, sum p~ = 1, and TV(p~, p) = the total moved <= delta;
- it optimises the overlap sum_v min(p~(v), q(v)) = sum_v min(p(v), q(v)) + the total moved, i.e. the exact-SD
  acceptance rate toward p~. A maximum flow would move the most; this is ROUNDS rounds of a vectorised
  proportional allocation (each surplus code offers its surplus to its neighbouring deficits in proportion to
  their deficits, each deficit takes at most its deficit, and the round's flow is scaled into the budget left),
  each round feasible, so the result is feasible and usually near the maximum, not provably equal to it.
Cost per position: O(V k) to find the edges from a surplus into a deficit, then ROUNDS of gathers and scatter-adds
over those edges only; no loop over codes.

Deterministic drafts (q None: greedy chains, EAGLE-2 / greedy trees), whose tokens are a function of the drafter
alone: q is taken as the indicator of the candidates (the point mass on x for a chain), so p~ moves up to delta of
neighbour mass onto the candidate set. Greedy: x passes iff x = argmax p~; a rejection emits argmax p. Either way
the token emitted is the argmax of a distribution within TV delta of p. delta = 0 or k = 0 is exact decoding.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch import Tensor

from lantern.engine.acceptance import AcceptRule, verify_candidates

ROUNDS = 3


def neighbour_edges(table: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """(src, dst) of the symmetric neighbour graph: a -> table[a, j] and back, j < k (2 V k edges), edge a k + j
    being a -> table[a, j] and edge V k + a k + j its reverse. The definition of live_edges' order; decoding never
    builds this list (2 x 250 MiB of int64 at V = 16384, k = 1000), live_edges finds its live edges' ends from
    `neighbour_index` alone."""
    V = table.shape[0]
    a = torch.arange(V, device=table.device).repeat_interleave(k)
    b = neighbour_index(table, k)
    return torch.cat([a, b]), torch.cat([b, a])


# (id(table), k) -> (a weak reference to the table, its version, table[:, :k] flattened as int64)
_INDEX: dict[tuple[int, int], tuple[weakref.ref, int, Tensor]] = {}


def neighbour_index(table: Tensor, k: int) -> Tensor:
    """table[:, :k] flattened to int64 [V k], built once per (table, k) and reused while that table object lives
    unchanged (a decoder passes one table to every verification; an in-place edit bumps its version)."""
    key = (id(table), k)
    hit = _INDEX.get(key)
    if hit is not None and hit[0]() is table and hit[1] == table._version:
        return hit[2]
    for stale in [key_ for key_, (ref, _, _) in _INDEX.items() if ref() is None]:  # tables gone since
        del _INDEX[stale]
    index = table[:, :k].reshape(-1).long()
    _INDEX[key] = (weakref.ref(table), table._version, index)
    return index


def live_edges(surplus: Tensor, deficit: Tensor, table: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """(row, src, dst) of the edges of neighbour_edges that run from a surplus into a deficit code (surplus, deficit
    [B, V] booleans), in neighbour_edges' order within each row; src and dst index one flat space over the batch,
    row b's code v being b V + v, where 1-D gathers and scatter-adds are the fast path. Only these edges can ever
    carry flow, as both sides only shrink: on the toy target about a quarter of the codes have p > q, so a fraction
    of the 2 V k edges. They are found on [B, V, k] booleans before any index is built (the index arithmetic on all
    2 B V k edges was most of a LANTERN-TV job's time)."""
    B, V = surplus.shape
    nb = neighbour_index(table, k)
    forward = surplus.unsqueeze(-1) & deficit.index_select(1, nb).view(B, V, k)  # a -> table[a, j]
    back = surplus.index_select(1, nb).view(B, V, k) & deficit.unsqueeze(-1)  # table[a, j] -> a
    row, edge = torch.cat([forward.view(B, -1), back.view(B, -1)], dim=1).nonzero(as_tuple=True)
    # neighbour_edges' ends of the live edges only: edge e < V k is e // k -> nb[e], edge V k + e its reverse
    reverse = edge >= V * k
    e = edge - reverse * (V * k)
    a, b = torch.div(e, k, rounding_mode="floor"), nb.index_select(0, e)
    src, dst = torch.where(reverse, b, a), torch.where(reverse, a, b)
    return row, row * V + src, row * V + dst


def retarget(p: Tensor, q: Tensor, table: Tensor, k: int, delta: float, rounds: int = ROUNDS) -> Tensor:
    """p~ [..., V]: p with at most delta of mass moved along neighbour edges from p > q codes to q > p codes."""
    if k == 0 or delta <= 0:
        return p
    shape, V, dtype = p.shape, p.shape[-1], p.dtype
    # float64 inside: float32 sums over 16384 codes drift by ~1e-5, the order of a small delta's last digit
    p2, q2 = p.reshape(-1, V).double(), q.reshape(-1, V).double()
    B = p2.shape[0]
    give, take = (p2 - q2).clamp(min=0.0), (q2 - p2).clamp(min=0.0)
    row, src, dst = live_edges(give > 0, take > 0, table, k)
    give, take = give.reshape(-1), take.reshape(-1)
    budget = torch.full((B,), float(delta), dtype=torch.float64, device=p.device)
    moved_out, moved_in = torch.zeros_like(give), torch.zeros_like(give)
    for round_ in range(rounds):
        want = take.index_select(0, dst)  # each edge's sink deficit
        demand = torch.zeros_like(give).index_add_(0, src, want).index_select(0, src)  # around the edge's source
        # a source offers its surplus to its neighbouring sinks in proportion to their deficits: sum <= give
        offer = give.index_select(0, src) * want / demand.clamp(min=1e-300)
        offer = torch.where(demand > 0, offer, torch.zeros_like(offer))
        got = torch.zeros_like(give).index_add_(0, dst, offer)
        fill = torch.where(got > take, take / got.clamp(min=1e-300), torch.ones_like(got))
        flow = offer * fill.index_select(0, dst)  # a sink takes at most its deficit
        total = torch.zeros_like(budget).index_add_(0, row, flow)
        scale = torch.where(total > budget, budget / total.clamp(min=1e-300), torch.ones_like(total))
        flow = flow * scale.index_select(0, row)
        out = torch.zeros_like(give).index_add_(0, src, flow)
        inn = torch.zeros_like(give).index_add_(0, dst, flow)
        moved_out += out
        moved_in += inn
        give = (give - out).clamp(min=0.0)
        take = (take - inn).clamp(min=0.0)
        budget = (budget - total * scale).clamp(min=0.0)
        if round_ == rounds - 1:
            break
        # an edge out of an emptied surplus, into a filled deficit or in a row whose budget is spent carries nothing
        # in any later round (it adds exact zeros), so dropping it changes no number; the first round usually spends
        # the whole budget, and the later rounds then run over few edges or none (one read per round, as
        # live_edges' nonzero already makes)
        live = ((give.index_select(0, src) > 0) & (take.index_select(0, dst) > 0)
                & (budget.index_select(0, row) > 0)).nonzero().squeeze(1)
        if len(live) == 0:
            break
        row, src, dst = row.index_select(0, live), src.index_select(0, live), dst.index_select(0, live)
    return ((p2.reshape(-1) - moved_out).clamp(min=0.0) + moved_in).reshape(shape).to(dtype)


def _indicator(p: Tensor, x: Tensor | list[int]) -> Tensor:
    q = torch.zeros_like(p)
    x = torch.as_tensor(x, device=p.device)
    return q.scatter(-1, x.reshape(*p.shape[:-1], -1) if p.dim() > 1 else x.reshape(-1), 1.0)


@dataclass(frozen=True)
class RetargetRule:
    """LANTERN-TV's verification (AcceptRule.impl)."""

    delta: float
    k: int
    name: str = "lanterntv"

    @property
    def relaxed(self) -> bool:
        return self.k > 0 and self.delta > 0

    @property
    def table_width(self) -> int:
        return self.k if self.relaxed else 0

    def describe(self) -> str:
        return f"lanterntv(delta={self.delta:g}, k={self.k})" if self.relaxed else "exact"

    def target(self, p: Tensor, q: Tensor, table: Tensor | None) -> Tensor:
        if not self.relaxed:
            return p
        if table is None or table.shape[-1] < self.k:
            raise ValueError(f"{self.describe()} needs a neighbour table with >= {self.k} columns")
        return retarget(p, q, table, self.k, self.delta)

    def greedy_accept(self, p: Tensor, x: Tensor, table: Tensor | None) -> Tensor:
        return self.target(p, _indicator(p, x), table).argmax(-1) == x

    def accept_probability(self, p: Tensor, q: Tensor | None, x: Tensor, table: Tensor | None):
        q = _indicator(p, x) if q is None else q
        pt = self.target(p, q, table)
        take = lambda d: d.gather(-1, x.unsqueeze(-1)).squeeze(-1)  # noqa: E731
        zeros = torch.zeros(x.shape, dtype=p.dtype, device=p.device)
        return (take(pt) / take(q)).clamp(max=1.0), zeros, torch.zeros_like(x)

    def residual(self, p: Tensor, q: Tensor | None, x: int, m: int, table: Tensor | None) -> Tensor:
        q = _indicator(p, [x]) if q is None else q
        pt = self.target(p, q, table)
        r = (pt - q).clamp(min=0.0)
        r[x] = 0.0  # a rejection means p~(x) < q(x); this keeps rounding from reviving x
        total = r.sum()
        return r / total if total > 0 else pt / pt.sum()

    def verify_candidates(self, p, q, candidates, table, uniforms, depth=0):
        pt = self.target(p, _indicator(p, candidates) if q is None else q, table)
        return verify_candidates(pt, q, candidates, None, AcceptRule("exact"), uniforms)


def lanterntv_rule(spec: dict) -> AcceptRule:
    return AcceptRule("lanterntv", k=spec["k"], impl=RetargetRule(spec["delta"], spec["k"]))
