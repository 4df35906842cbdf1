"""Peer relaxed rules of LANTERN (method.md section 6): Cool-SD's annealed acceptance, GSD's grouped acceptance and
the entropy-aware acceptance.

All are lossy and reduce to exact decoding when their relaxation is off; only the entropy-aware rule has a per-step
TV bound (below). Each is an AcceptRule.impl (acceptance.py hands chain and tree verification over to it).

Cool-SD (Li, Zhang, Du, Ji, "Annealed Relaxation of Speculative Decoding for Faster Autoregressive Image
Generation", AAAI 2026, arXiv 2601.09212; no public code at github.com/xingyaoL/COOL-SD when this was written, so
this follows the paper's summary in method.md and the abstract): accept the i-th draft of a round with
min(1, w_i p(x) / q(x)), w_i = scale * exp(-nu i - mu), annealed over i = the draft's index within the round
(0 for the first draft, a tree node's depth - 1): the relaxation is strongest for the first draft and decays along
the round. On rejection sample norm(max(p - q f_i, 0)) with f_i = min(1, w_i p / q) the acceptance function, i.e.
p minus the mass the acceptance already gave each token, min(q, w_i p). w = 1 (scale 1, nu = mu = 0) is exact SD
token for token: q f = min(q, p), and p - min(q, p) = max(p - q, 0). w < 1 is allowed (stricter than exact) and
then the residual keeps the rejected x's unmet mass. Greedy: x passes iff it is the argmax of p with p(x) replaced
by w_i p(x). Deterministic drafts (q None) take q as the point mass on x. Reading choices (the paper's text was not
reachable here): i counts drafts within a round, not image positions; f is the acceptance function.
Where i comes from: a chain's verified rows are its drafts in order (row j: i = j), and the chain hands i on to
the residual in accept_probability's third slot (m for LANTERN); tree sampling passes the candidates' depth to
verify_candidates. Greedy tree verification (tree_rounds.greedy_paths) tests all nodes in one call without their
depths, so there i is the node's index in the tree, not its depth: Cool-SD's greedy trees anneal too fast.

GSD (So et al., "Grouped Speculative Decoding for Autoregressive Image Generation", ICCV 2025; the authors' code,
junhyukso/GSD scheduler/jacobi_iteration_lumina_mgpt.py, SpeculativeSampler.__call__): accept x with
min(1, p(C(x)) / q(C(x))), the cluster C(x) = x and the tokens that are (1) within a window of `group` ranks
around x in the target's probability order (theirs: 14 ranks, 7 below x and 6 above), (2) latent neighbours of x
(theirs: squared L2 < 0.5 between input embeddings; here: x's k nearest codes in the neighbour table) and (3)
within `gap` of p(x) in probability (theirs: |p(v) - p(x)| < 0.15). On rejection they sample norm(max(p - q, 0))
(x not zeroed: a grouped rejection can reject an x with p(x) > q(x)). They run it on SJD drafts in sampling mode
only; greedy here: x passes iff it is the argmax of p with p(x) replaced by p(C(x)) (LANTERN's greedy test).
Deterministic drafts (q None): q(C(x)) = 1 and the residual is p without x. group = 1, k = 0 or gap = 0 leave
C(x) = {x}: exact SD (the registry then builds the exact rule).

Entropy-aware acceptance (Ma et al., "Towards Better & Faster Autoregressive Image Generation: From the Perspective
of Entropy", NeurIPS 2025, arXiv 2510.09012; code github.com/krennic999/ARsample, which ships only the
LlamaGen sampling-temperature part, not its SJD rule): the acceptance of speculative (Jacobi) decoding scaled by the
target's entropy, so that drafts are taken more readily where the target is uncertain (textures, low information
density) and as strictly as exact SD where it is sure (structure). Our reading, since neither the paper's formula
nor its SJD code was reachable here: accept x with min(1, w p(x) / q(x)), w = exp(beta H(p) / log V), H the
target's entropy at the position, V the vocabulary (so w runs from 1 at a point mass to e^beta at the uniform);
on rejection sample norm(max(p - min(q, w p), 0)), the optimal residual for that acceptance (Cool-SD's, with w
from the entropy instead of the draft index; for w >= 1 it is exact SD's norm(max(p - q, 0))). Guarantee, from
the emitted distribution min(q, w p) + (1 - sum min(q, w p)) r: TV(emitted, p) <= sum_x min(q, w p) - min(q, p)
<= min(w - 1, TV(p, q)) per step; beta = 0 is exact SD. Greedy: x passes iff it is the argmax of p with p(x)
replaced by w p(x). w is recomputed from the p the draft is verified against (a tree sibling after a rejection:
the residual), so acceptance and residual always agree.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lantern.engine.rules.acceptance import AcceptRule, _take


def _point(p: Tensor, x: int) -> Tensor:
    q = torch.zeros_like(p)
    q[x] = 1.0
    return q


def try_siblings(rule, p: Tensor, q: Tensor | None, candidates: list[int], table, uniforms, depth: int):
    """Sibling verification (acceptance.verify_candidates' order and q update) with `rule`'s test and residual."""
    for j, x in enumerate(candidates):
        a = rule.accept_probability(p, q, torch.tensor(x, device=p.device), table, depth)[0]
        if uniforms[j] < a.item():
            return j, p
        p = rule.residual(p, q, x, depth, table)
        if q is not None:
            q = q.clone()
            q[x] = 0.0
            total = q.sum()
            q = q / total if total > 0 else q
    return -1, p


@dataclass(frozen=True)
class CoolRule:
    scale: float = 1.0
    nu: float = 0.0
    mu: float = 0.0
    name: str = "coolsd"
    k = 0
    table_width = 0

    @property
    def relaxed(self) -> bool:
        return not (self.scale == 1.0 and self.nu == 0.0 and self.mu == 0.0)

    def describe(self) -> str:
        return f"coolsd(scale={self.scale:g}, nu={self.nu:g}, mu={self.mu:g})" if self.relaxed else "exact"

    def weight(self, i: Tensor | int, like: Tensor) -> Tensor:
        i = torch.as_tensor(i, dtype=like.dtype, device=like.device)
        return self.scale * torch.exp(-self.nu * i - self.mu)

    def index(self, x: Tensor, depth) -> Tensor:
        """Draft index within the round: a chain's rows are its drafts in order; a tree's candidates share depth."""
        if x.dim() == 0 or depth is not None:
            return torch.full(x.shape, 0 if depth is None else depth, device=x.device)
        return torch.arange(x.shape[-1], device=x.device).expand(x.shape)

    def greedy_accept(self, p: Tensor, x: Tensor, table) -> Tensor:
        w = self.weight(self.index(x, None), p)
        boosted = p.scatter(-1, x.unsqueeze(-1), (w * _take(p, x)).unsqueeze(-1))
        return boosted.argmax(-1) == x

    def accept_probability(self, p: Tensor, q: Tensor | None, x: Tensor, table, depth=None):
        """(min(1, w_i p(x) / q(x)), 0, i): the third entry carries the draft index to `residual`."""
        i = self.index(x, depth)
        qx = 1.0 if q is None else _take(q, x)
        a = (self.weight(i, p) * _take(p, x) / qx).clamp(max=1.0)
        return a, torch.zeros_like(a), i.to(device=x.device, dtype=torch.long)

    def residual(self, p: Tensor, q: Tensor | None, x: int, i: int, table) -> Tensor:
        q = _point(p, x) if q is None else q
        r = (p - torch.minimum(q, self.weight(i, p) * p)).clamp(min=0.0)
        total = r.sum()
        return r / total if total > 0 else p / p.sum()

    def residual_rows(self, p: Tensor, q: Tensor | None, x: Tensor, i: Tensor, table) -> Tensor:
        """`residual` for rows p, q [n, V] at once, the rejected drafts x [n] with their draft indices i [n]."""
        q = p.new_zeros(p.shape).scatter(-1, x[:, None], 1.0) if q is None else q
        return normalised((p - torch.minimum(q, self.weight(i, p)[:, None] * p)).clamp(min=0.0), p)

    def verify_candidates(self, p, q, candidates, table, uniforms, depth=0):
        return try_siblings(self, p, q, candidates, table, uniforms, depth)

    def graph_form(self, table):
        return self, table


@dataclass(frozen=True)
class GroupRule:
    group: int = 14
    k: int = 0
    gap: float = 0.15
    name: str = "gsd"

    @property
    def relaxed(self) -> bool:
        return self.group > 1 and self.k > 0 and self.gap > 0

    @property
    def table_width(self) -> int:
        return self.k if self.relaxed else 0

    def describe(self) -> str:
        return f"gsd(group={self.group}, k={self.k}, gap={self.gap:g})" if self.relaxed else "exact"

    def members(self, p: Tensor, x: Tensor, table: Tensor) -> tuple[Tensor, Tensor]:
        """(x's k nearest codes [..., k], which of them are in C(x)) for drafts x [...] under p [..., V]."""
        if table is None or table.shape[-1] < self.k:
            raise ValueError(f"{self.describe()} needs a neighbour table with >= {self.k} columns")
        order = p.argsort(dim=-1, descending=True, stable=True)
        rank = torch.empty_like(order).scatter_(-1, order, torch.arange(p.shape[-1], device=p.device).expand_as(order))
        nb = table[x, : self.k].long()
        step = rank.gather(-1, nb) - _take(rank, x).unsqueeze(-1)  # > 0: less probable than x
        window = (step >= -(self.group - 1 - self.group // 2)) & (step <= self.group // 2)
        close = (p.gather(-1, nb) - _take(p, x).unsqueeze(-1)).abs() < self.gap
        return nb, window & close

    def group_mass(self, d: Tensor, x: Tensor, nb: Tensor, inside: Tensor) -> Tensor:
        return _take(d, x) + (d.gather(-1, nb) * inside).sum(-1)

    def greedy_accept(self, p: Tensor, x: Tensor, table) -> Tensor:
        if not self.relaxed:
            return p.argmax(-1) == x
        nb, inside = self.members(p, x, table)
        boosted = p.scatter(-1, x.unsqueeze(-1), self.group_mass(p, x, nb, inside).unsqueeze(-1))
        return boosted.argmax(-1) == x

    def accept_probability(self, p: Tensor, q: Tensor | None, x: Tensor, table, depth=None):
        if self.relaxed:
            nb, inside = self.members(p, x, table)
            pc = self.group_mass(p, x, nb, inside)
            qc = 1.0 if q is None else self.group_mass(q, x, nb, inside)
        else:
            pc, qc = _take(p, x), 1.0 if q is None else _take(q, x)
        a = (pc / qc).clamp(max=1.0)
        return a, torch.zeros_like(a), torch.zeros_like(x)

    def residual(self, p: Tensor, q: Tensor | None, x: int, m: int, table) -> Tensor:
        if q is None:
            r = p.clone()
            r[x] = 0.0
        else:
            r = (p - q).clamp(min=0.0)
        total = r.sum()
        return r / total if total > 0 else p / p.sum()

    def residual_rows(self, p: Tensor, q: Tensor | None, x: Tensor, m: Tensor, table) -> Tensor:
        """`residual` for rows p, q [n, V] at once, the rejected drafts x [n]."""
        r = p.scatter(-1, x[:, None], 0.0) if q is None else (p - q).clamp(min=0.0)
        return normalised(r, p)

    def verify_candidates(self, p, q, candidates, table, uniforms, depth=0):
        return try_siblings(self, p, q, candidates, table, uniforms, depth)

    def graph_form(self, table):
        return self, table


@dataclass(frozen=True)
class EntropyRule:
    beta: float = 0.0
    name: str = "entropy"
    k = 0
    table_width = 0

    @property
    def relaxed(self) -> bool:
        return self.beta != 0.0

    def describe(self) -> str:
        return f"entropy(beta={self.beta:g})" if self.relaxed else "exact"

    def weight(self, p: Tensor) -> Tensor:
        """w = exp(beta H(p) / log V) for each row of p [..., V]: 1 at a point mass, e^beta at the uniform."""
        H = -torch.special.xlogy(p, p).sum(-1)
        return torch.exp(self.beta * H / torch.log(torch.tensor(float(p.shape[-1]), dtype=p.dtype, device=p.device)))

    def greedy_accept(self, p: Tensor, x: Tensor, table) -> Tensor:
        boosted = p.scatter(-1, x.unsqueeze(-1), (self.weight(p) * _take(p, x)).unsqueeze(-1))
        return boosted.argmax(-1) == x

    def accept_probability(self, p: Tensor, q: Tensor | None, x: Tensor, table, depth=None):
        qx = 1.0 if q is None else _take(q, x)
        a = (self.weight(p) * _take(p, x) / qx).clamp(max=1.0)
        return a, torch.zeros_like(a), torch.zeros_like(x)

    def residual(self, p: Tensor, q: Tensor | None, x: int, m: int, table) -> Tensor:
        return self.residual_rows(p[None], None if q is None else q[None], torch.tensor([x], device=p.device), None,
                                  table)[0]

    def residual_rows(self, p: Tensor, q: Tensor | None, x: Tensor, m, table) -> Tensor:
        """norm(max(p - min(q, w p), 0)) for rows p, q [n, V] (q None: the point mass on each rejected x [n])."""
        q = p.new_zeros(p.shape).scatter(-1, x[:, None], 1.0) if q is None else q
        return normalised((p - torch.minimum(q, self.weight(p)[:, None] * p)).clamp(min=0.0), p)

    def verify_candidates(self, p, q, candidates, table, uniforms, depth=0):
        return try_siblings(self, p, q, candidates, table, uniforms, depth)

    def graph_form(self, table):
        return self, table


def normalised(r: Tensor, p: Tensor) -> Tensor:
    """Rows of r renormalised; a row left with no mass (only through rounding) falls back to p's."""
    total = r.sum(-1, keepdim=True)
    return torch.where(total > 0, r / total, p / p.sum(-1, keepdim=True))


def coolsd_rule(spec: dict) -> AcceptRule:
    impl = CoolRule(float(spec["scale"]), float(spec["nu"]), float(spec["mu"]))
    return AcceptRule("coolsd", impl=impl) if impl.relaxed else AcceptRule("exact")


def gsd_rule(spec: dict) -> AcceptRule:
    impl = GroupRule(spec["group"], spec["k"], float(spec["gap"]))
    return AcceptRule("gsd", k=spec["k"], impl=impl) if impl.relaxed else AcceptRule("exact")



def entropy_rule(spec: dict) -> AcceptRule:
    impl = EntropyRule(float(spec["beta"]))
    return AcceptRule("entropy", impl=impl) if impl.relaxed else AcceptRule("exact")
