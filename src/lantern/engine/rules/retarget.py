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
  each round feasible, so the result is feasible and usually near the maximum, not provably equal to it;
- only the SOURCES largest surpluses of a position give. The surplus sits on few codes (where p peaks above q):
  `benchmarks/bench_retarget.py` (851 positions of a LANTERN-TV decode on the shipped toy world, delta 0.2, k 100)
  finds that the 64 largest of a position's ~380 surplus codes hold 96 % of its surplus, and that limiting the
  sources to them lowers the acceptance rate toward p~ from 0.5879 to 0.5852 while the flow runs over a fraction
  of the edges: a retarget of 32 positions takes 17.6 ms instead of 141.2 (8x, one thread). For deterministic
  drafts (q a point mass) the mass moved falls from 0.180 to 0.176 and x becomes p~'s argmax at 0.871 of the
  positions instead of 0.888. sources >= V is the full flow.
Cost per position: O(SOURCES x the sources' degree) to list the edges out of the sources (a CSR of the symmetric
neighbour graph, built once per table and k), then ROUNDS of gathers and scatter-adds over the edges into deficits.

Deterministic drafts (q None: greedy chains, EAGLE-2 / greedy trees), whose tokens are a function of the drafter
alone: q is taken as the indicator of the candidates (the point mass on x for a chain), so p~ moves up to delta of
neighbour mass onto the candidate set. Greedy: x passes iff x = argmax p~; a rejection emits argmax p. Either way
the token emitted is the argmax of a distribution within TV delta of p. delta = 0 or k = 0 is exact decoding.

Two forms of the same computation. `retarget` (eager: decoders' rounds, trees) lists only the live edges, so its
shapes shrink with the data (nonzero, repeat_interleave, an early break, a CSR cached per table object).
`retarget_padded` (the chain round as one compiled graph, chain_graph.py) runs at fixed shapes over
`padded_neighbours(table, k)` [V, D], each code's CSR edges in order padded with the sentinel V to D, the largest
degree (D >= k, as every code has its own k edges): every row's `sources` top surpluses, all their D edge slots,
all ROUNDS rounds, dead edges (padding, emptied sources, filled sinks, spent budgets) carrying exact zeros. The
CPU's index_add_ sums in index order and adding an exact zero changes no sum, so on a CPU in float64 its p~ equals
retarget's bit for bit (tests/test_rules_tv.py). Eager it is slower, as every round runs over every slot: 32
positions at V 16384 on one thread take 86 ms instead of 62 at k 100 (D 245), 588 instead of 280 at k 1000 (D 2130,
a 133 MiB int32 adjacency), on random tables (benchmarks/bench_retarget.py --padded); its place is inside a graph.
`RetargetRule.graph_form(table)` gives the rule and the table that a graph round passes in place of the eager ones.
"""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass

import torch
from torch import Tensor

from lantern.engine.rules.acceptance import AcceptRule, verify_candidates

ROUNDS = 3
SOURCES = 64  # surplus codes per position that give (the largest); see the module docstring


def neighbour_edges(table: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """(src, dst) of the symmetric neighbour graph: a -> table[a, j] and back, j < k (2 V k edges), edge a k + j
    being a -> table[a, j] and edge V k + a k + j its reverse. A mutual pair is listed twice, as both lists name it."""
    V = table.shape[0]
    a = torch.arange(V, device=table.device).repeat_interleave(k)
    b = table[:, :k].reshape(-1).long()
    return torch.cat([a, b]), torch.cat([b, a])


# (store name, id(table), k) -> (a weak reference to the table, its version, what was built from it)
_KEPT: dict[tuple[str, int, int], tuple[weakref.ref, int, object]] = {}


def kept_for(name: str, table: Tensor, k: int, build):
    """build() once per (name, table, k), reused while that table object lives unchanged (a decoder passes one
    table to every verification; an in-place edit bumps its version); entries of tables gone since are dropped."""
    key = (name, id(table), k)
    hit = _KEPT.get(key)
    if hit is not None and hit[0]() is table and hit[1] == table._version:
        return hit[2]
    for stale in [key_ for key_, (ref, _, _) in _KEPT.items() if ref() is None]:
        del _KEPT[stale]
    value = build()
    _KEPT[key] = (weakref.ref(table), table._version, value)
    return value


def neighbour_csr(table: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """(start [V + 1] int64, dst [2 V k] int32): code a's edges of neighbour_edges, in that order, are
    dst[start[a]:start[a + 1]]. Built once per (table, k) (kept_for)."""

    def build():
        V = table.shape[0]
        src, dst = neighbour_edges(table, k)
        order = torch.sort(src, stable=True).indices
        start = torch.zeros(V + 1, dtype=torch.long, device=table.device)
        start[1:] = torch.bincount(src, minlength=V).cumsum(0)
        return start, dst.index_select(0, order).int()  # int32: 2 x 65 MiB at V = 16384, k = 1000

    return kept_for("csr", table, k, build)


def live_edges(give: Tensor, take: Tensor, table: Tensor, k: int, sources: int) -> tuple[Tensor, Tensor, Tensor]:
    """(row, src, dst) of the edges of neighbour_edges out of each row's `sources` largest surpluses (give [B, V] >
    0) into its deficits (take [B, V] > 0): by row, then source by decreasing surplus, then neighbour_csr's order.
    src and dst index one flat space over the batch, row b's code v being b V + v, where 1-D gathers and
    scatter-adds are the fast path. Only these edges can ever carry flow, as both sides only shrink."""
    B, V = give.shape
    start, adj = neighbour_csr(table, k)
    top = give.topk(min(sources, V), dim=-1)
    code = top.indices.reshape(-1)
    row = torch.arange(B, device=give.device).repeat_interleave(top.indices.shape[1])
    first = start.index_select(0, code)
    degree = torch.where(top.values.reshape(-1) > 0, start.index_select(0, code + 1) - first, 0)
    seg = torch.repeat_interleave(torch.arange(len(code), device=give.device), degree)  # one read: the edge count
    offset = torch.arange(len(seg), device=give.device) - (degree.cumsum(0) - degree).index_select(0, seg)
    row = row.index_select(0, seg)
    src = row * V + code.index_select(0, seg)
    dst = row * V + adj.index_select(0, first.index_select(0, seg) + offset).long()
    live = (take.reshape(-1).index_select(0, dst) > 0).nonzero().squeeze(1)
    return row.index_select(0, live), src.index_select(0, live), dst.index_select(0, live)


def retarget(p: Tensor, q: Tensor, table: Tensor, k: int, delta: float, rounds: int = ROUNDS,
             sources: int = SOURCES) -> Tensor:
    """p~ [..., V]: p with at most delta of mass moved along neighbour edges from p > q codes (the `sources` largest
    surpluses) to q > p codes."""
    if k == 0 or delta <= 0:
        return p
    shape, V, dtype = p.shape, p.shape[-1], p.dtype
    # float64 inside: float32 sums over 16384 codes drift by ~1e-5, the order of a small delta's last digit
    p2, q2 = p.reshape(-1, V).double(), q.reshape(-1, V).double()
    B = p2.shape[0]
    give, take = (p2 - q2).clamp(min=0.0), (q2 - p2).clamp(min=0.0)
    row, src, dst = live_edges(give, take, table, k, sources)
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


def padded_neighbours(table: Tensor, k: int) -> Tensor:
    """adj [V, D] int32: row a is neighbour_csr's dst[start[a]:start[a + 1]], code a's edges in that order, padded
    with V (a code past the last, whose surplus and deficit retarget_padded holds at 0) to D, the largest degree.
    D >= k: each code has its own k edges, plus one for each code that lists it, 2 k on average, more at hubs (the
    toy codebook's table at k 100: D 279). int32, as neighbour_csr's dst: half of int64's memory, 133 MiB at V 16384,
    k 1000 on a random table (D 2130). Built once per (table, k) (kept_for): the same tensor for every batch, so a
    CUDA graph that reads it is recorded once."""

    def build():
        V = table.shape[0]
        start, dst = neighbour_csr(table, k)
        degree = start[1:] - start[:-1]
        D = int(degree.max())  # the one read: the width; built once per table, outside any graph
        code = torch.repeat_interleave(torch.arange(V, device=table.device), degree)
        slot = torch.arange(len(dst), device=table.device) - start.index_select(0, code)
        adj = torch.full((V, D), V, dtype=torch.int32, device=table.device)
        adj[code, slot] = dst
        return adj

    return kept_for("padded", table, k, build)


def retarget_padded(p: Tensor, q: Tensor, adj: Tensor, delta: float, rounds: int = ROUNDS,
                    sources: int = SOURCES) -> Tensor:
    """retarget's p~ at fixed shapes, for a compiled graph: adj = padded_neighbours(table, k). The edges are every
    row's `sources` largest surpluses times their D slots, [B, sources, D] in retarget's edge order (row, source by
    decreasing surplus, neighbour_csr's order); sinks index one flat space where row b's code v is b (V + 1) + v and
    b (V + 1) + V is the sentinel's, with no deficit. An edge is live while retarget would list it; a dead edge's
    want is 0, so its offer and flow are 0 and every sum it enters is unchanged."""
    if delta <= 0:
        return p
    shape, V, dtype, device = p.shape, p.shape[-1], p.dtype, p.device
    p2, q2 = p.reshape(-1, V).double(), q.reshape(-1, V).double()  # float64 inside, as retarget
    B, W, D = p2.shape[0], V + 1, adj.shape[1]
    top = (p2 - q2).clamp(min=0.0).topk(min(sources, V), dim=-1)  # live_edges' call: the same sources, same order
    S = top.indices.shape[1]
    take = torch.cat([(q2 - p2).clamp(min=0.0), torch.zeros(B, 1, dtype=torch.float64, device=device)], 1)
    take = take.reshape(-1)
    dst = (torch.arange(B, device=device)[:, None, None] * W
           + adj.index_select(0, top.indices.reshape(-1)).reshape(B, S, D)).reshape(-1)
    # the sums run through index_add_ (in index order on a CPU, as retarget's): a source's over its slots, a row's
    # over its edges; source-side values stay [B, S] (a source is one code of its row), broadcast over the slots
    slot = torch.arange(B * S, device=device)[:, None].expand(B * S, D).reshape(-1)
    row = torch.arange(B, device=device)[:, None].expand(B, S * D).reshape(-1)
    give = top.values
    live = (give > 0)[:, :, None].expand(B, S, D)
    budget = torch.full((B,), float(delta), dtype=torch.float64, device=device)
    moved_out, moved_in = torch.zeros_like(give), torch.zeros_like(take)
    for _ in range(rounds):  # every round runs: once the flow stops, a round adds exact zeros
        sink = take.index_select(0, dst).reshape(B, S, D)
        live = live & (sink > 0)  # with the end of the round's checks: retarget's filter between rounds
        want = torch.where(live, sink, 0.0)
        demand = torch.zeros(B * S, dtype=torch.float64, device=device).index_add_(0, slot, want.reshape(-1))
        demand = demand.reshape(B, S, 1)
        offer = give[:, :, None] * want / demand.clamp(min=1e-300)
        offer = torch.where(demand > 0, offer, 0.0).reshape(-1)
        got = torch.zeros_like(take).index_add_(0, dst, offer)
        fill = torch.where(got > take, take / got.clamp(min=1e-300), 1.0)
        flow = offer * fill.index_select(0, dst)
        total = torch.zeros_like(budget).index_add_(0, row, flow)
        scale = torch.where(total > budget, budget / total.clamp(min=1e-300), 1.0)
        flow = (flow.reshape(B, S * D) * scale[:, None]).reshape(-1)
        out = torch.zeros(B * S, dtype=torch.float64, device=device).index_add_(0, slot, flow).reshape(B, S)
        inn = torch.zeros_like(take).index_add_(0, dst, flow)
        moved_out += out
        moved_in += inn
        give = (give - out).clamp(min=0.0)
        take = (take - inn).clamp(min=0.0)
        budget = (budget - total * scale).clamp(min=0.0)
        live = live & (give > 0)[:, :, None] & (budget > 0)[:, None, None]
    moved_out = torch.zeros_like(p2).scatter(1, top.indices, moved_out)  # a row's sources are distinct codes
    return ((p2 - moved_out).clamp(min=0.0) + moved_in.reshape(B, W)[:, :V]).reshape(shape).to(dtype)


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
    padded: bool = False  # tables are padded_neighbours' adjacency and the target is retarget_padded (graph_form)

    @property
    def relaxed(self) -> bool:
        return self.k > 0 and self.delta > 0

    @property
    def table_width(self) -> int:
        return self.k if self.relaxed else 0

    def describe(self) -> str:
        return f"lanterntv(delta={self.delta:g}, k={self.k})" if self.relaxed else "exact"

    def graph_form(self, table: Tensor | None) -> tuple[RetargetRule, Tensor | None]:
        """(rule, table) for a round compiled as one graph: this rule reading padded_neighbours(table, k) through
        retarget_padded, the same p~ at fixed shapes; unrelaxed or padded already, this rule and the table as they
        are."""
        if not self.relaxed or self.padded:
            return self, table
        self._check(table)
        return dataclasses.replace(self, padded=True), padded_neighbours(table, self.k)

    def _check(self, table: Tensor | None) -> None:
        # a padded adjacency has D >= k columns (padded_neighbours), so the check reads both kinds of table alike
        if table is None or table.shape[-1] < self.k:
            raise ValueError(f"{self.describe()} needs a neighbour table with >= {self.k} columns")

    def target(self, p: Tensor, q: Tensor, table: Tensor | None) -> Tensor:
        if not self.relaxed:
            return p
        self._check(table)
        if self.padded:
            return retarget_padded(p, q, table, self.delta)
        return retarget(p, q, table, self.k, self.delta)

    def greedy_accept(self, p: Tensor, x: Tensor, table: Tensor | None) -> Tensor:
        return self.target(p, _indicator(p, x), table).argmax(-1) == x

    def accept_probability(self, p: Tensor, q: Tensor | None, x: Tensor, table: Tensor | None, depth=None):
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
        return torch.where(total > 0, r / total, pt / pt.sum())  # no branch on the data: a graph round can call it

    def verify_candidates(self, p, q, candidates, table, uniforms, depth=0):
        pt = self.target(p, _indicator(p, candidates) if q is None else q, table)
        return verify_candidates(pt, q, candidates, None, AcceptRule("exact"), uniforms)


def lanterntv_rule(spec: dict) -> AcceptRule:
    return AcceptRule("lanterntv", k=spec["k"], impl=RetargetRule(spec["delta"], spec["k"]))
