"""Acceptance rules for speculative decoding: exact, LANTERN (delta, k) and LANTERN++ (lambda, k).

Pure functions of target probabilities p, drafter probabilities q, drafted tokens x and a neighbour table (row x:
the other codes in order of latent proximity, see neighbours.py; any integer dtype, rows are widened where read).
Callers draw the uniforms, so the functions own no randomness. Chain verification uses `greedy_accept` /
`accept_probability` / `residual` per position; tree verification tries sibling candidates with `verify_candidates`.

Semantics of the relaxation (method.md section 3): c_m = p(n_1) + .. + p(n_m) over x's neighbours in proximity
order, m* = the largest m <= k with c_m <= bound (bound = delta for LANTERN, (lambda - 1) p(x) for LANTERN++) and
p~(x) = p(x) + c_{m*}.

Residual after rejecting x:
- `bounded` (paper-faithful): x and the aggregated n_1..n_{m*} leave the residual, which is exact SD's
  norm(max(p - q, 0)) otherwise. The verification of draft x is then exact SD toward p~_x, the target with the
  aggregated mass moved onto x, and TV(p~_x, p) = c_{m*} <= delta. With deterministic drafting (q = 1: greedy or
  top-k drafts) the emitted token's distribution is exactly p~_x, so the per-step bound holds; tree siblings share
  one TV budget so that it still holds after several rejections. With drafts sampled from q no rule of this form
  bounds the marginal: every x in q's support borrows up to delta on its own (see tests/test_acceptance.py).
- `reference` (the authors' code, jadohu/LANTERN models/ea_model_llamagen.py): the same acceptance; after
  rejecting x, with nearest[x, :k + 1] its k + 1 nearest other codes, zeroed only when m* >= 1:
  deterministic drafts (q None, their dynamic tree): x and nearest[x, :k + 1] leave p, which is renormalised;
  sampled drafts (their static tree): nearest[x, :k + 1] leave q' (the drafter distribution without the earlier
  siblings), not p, and the residual is norm(max(p - q', 0)), so those neighbours keep all their target mass.
  A residual left with no mass becomes uniform. Siblings get no shared budget; delta is absolute per draft.
- `lumina` (the authors' Lumina-mGPT code, jadohu/LANTERN models/ea_model_lumina_mgpt.py evaluate_posterior): as
  `reference`, except that on sampled drafts (their static tree) nearest[x, :k + 1] leave p, not q': the residual
  is norm(max(p - q', 0)) with those codes zeroed. Deterministic drafts: the same as `reference`.

Rules with a verification of their own (LANTERN-TV in retarget.py, Cool-SD and GSD in peers.py) come as an
AcceptRule whose `impl` implements greedy_accept / accept_probability / residual / verify_candidates; the four
functions here hand such a rule over to it, so chain.py and trees.py stay unaware of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

from lantern.errors import UserError

KINDS = ("exact", "lantern", "lanternpp")
RESIDUALS = ("bounded", "reference", "lumina")
AUTHORS_RESIDUALS = ("reference", "lumina")  # zero the k + 1 nearest codes once anything was borrowed (m* >= 1)


@dataclass(frozen=True)
class AcceptRule:
    kind: str = "exact"
    delta: float = 0.0  # LANTERN: total-variation bound per step
    lam: float = 1.0  # LANTERN++: p~(x) <= lam * p(x)
    k: int = 0  # neighbours of x that may lend their mass
    residual: str = "bounded"
    # A registered family's own rule (engine/methods.py): p(x) -> the neighbour mass x may claim.
    bound_fn: Callable[[Tensor], Tensor] | None = None
    # A rule with its own verification (retarget.py, peers.py); kind is then its name and only k is read here.
    impl: Any = None

    def __post_init__(self):
        if self.impl is not None:
            return
        if self.kind not in KINDS and self.bound_fn is None:
            raise UserError(f"acceptance kind must be one of {', '.join(KINDS)}; got {self.kind!r}")
        if self.residual not in RESIDUALS:
            raise UserError(f"residual must be one of {', '.join(RESIDUALS)}; got {self.residual!r}")
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 0:
            raise UserError(f"k={self.k!r} must be an integer >= 0 (the number of neighbours that may lend mass)")
        if not 0.0 <= self.delta <= 1.0:
            raise UserError(
                f"delta={self.delta} must lie in [0, 1] (a total-variation bound); "
                "for LANTERN++'s relative bound use kind: lanternpp with lam"
            )
        if not self.lam >= 1.0:
            raise UserError(f"lam={self.lam} must be >= 1 (1 means no relaxation)")
        if self.kind != "lantern" and self.delta != 0.0:
            raise UserError(f"delta applies to kind: lantern only; kind {self.kind} got delta={self.delta}")
        if self.kind != "lanternpp" and self.lam != 1.0:
            raise UserError(f"lam applies to kind: lanternpp only; kind {self.kind} got lam={self.lam}")
        if self.kind == "exact" and self.k != 0:
            raise UserError(f"k applies to kinds lantern and lanternpp only; kind exact got k={self.k}")

    @property
    def relaxed(self) -> bool:
        """False when the rule reduces to exact decoding (k = 0, delta = 0 or lam = 1)."""
        if self.impl is not None:
            return self.impl.relaxed
        if self.kind == "exact" or self.k == 0:
            return False
        if self.bound_fn is not None:
            return True
        return self.delta > 0 if self.kind == "lantern" else self.lam > 1

    @property
    def authors_ties(self) -> bool:
        """Greedy tree ties broken as the authors' code breaks them (tree_rounds.greedy_paths): part of `reference`."""
        return self.impl is None and self.residual == "reference"

    @property
    def table_width(self) -> int:
        """Neighbour-table columns the rule reads (the reference residual zeroes k + 1 of them)."""
        if self.impl is not None:
            return self.impl.table_width
        if not self.relaxed:
            return 0
        return self.k + 1 if self.residual in AUTHORS_RESIDUALS else self.k

    def describe(self) -> str:
        if self.impl is not None:
            return self.impl.describe()
        if not self.relaxed:
            return "exact"
        bound = ("" if self.bound_fn is not None else
                 f"delta={self.delta:g}, " if self.kind == "lantern" else f"lam={self.lam:g}, ")
        return f"{self.kind}({bound}k={self.k}, residual={self.residual})"


def _take(p: Tensor, x: Tensor) -> Tensor:
    return p.gather(-1, x.unsqueeze(-1)).squeeze(-1)


def relaxed_mass(p: Tensor, x: Tensor, table: Tensor | None, rule: AcceptRule, budget: float | None = None):
    """(c_{m*}, m*) for drafts x [...] under targets p [..., V]; both shaped like x.

    `budget` replaces delta as LANTERN's bound (tree siblings that share one TV budget).
    """
    if not rule.relaxed:
        return torch.zeros(x.shape, dtype=p.dtype, device=p.device), torch.zeros_like(x)
    if table is None or table.shape[-1] < rule.k:
        raise ValueError(f"{rule.describe()} needs a neighbour table with >= {rule.k} columns")
    cum = p.gather(-1, table[x, : rule.k].long()).cumsum(-1)  # non-decreasing: m* = how many c_m fit the bound
    if rule.bound_fn is not None:
        bound = torch.as_tensor(rule.bound_fn(_take(p, x)), dtype=p.dtype, device=p.device).unsqueeze(-1)
    elif rule.kind == "lanternpp":
        bound = (rule.lam - 1.0) * _take(p, x).unsqueeze(-1)
    else:
        bound = rule.delta if budget is None else budget
    m = (cum <= bound).sum(-1)
    c = cum.gather(-1, (m - 1).clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return torch.where(m > 0, c, torch.zeros_like(c)), m


def greedy_accept(p: Tensor, x: Tensor, table: Tensor | None, rule: AcceptRule) -> Tensor:
    """Greedy verification, batched: x is accepted iff it is the argmax of p with p(x) replaced by p~(x)."""
    if rule.impl is not None:
        return rule.impl.greedy_accept(p, x, table)
    c, _ = relaxed_mass(p, x, table, rule)
    boosted = p.scatter_add(-1, x.unsqueeze(-1), c.unsqueeze(-1))
    return boosted.argmax(-1) == x


def accept_probability(
    p: Tensor, q: Tensor | None, x: Tensor, table: Tensor | None, rule: AcceptRule, budget: float | None = None,
    depth: int | None = None,
):
    """(min(1, p~(x) / q(x)), c_{m*}, m*), batched over x [...]. q None: a deterministic draft (q(x) = 1).

    A sampled draft has q(x) > 0 by construction; accept iff a uniform u in [0, 1) is < the probability. depth: the
    drafts' index in the round when they are tree siblings (verify_candidates' depth, read by Cool-SD).
    """
    if rule.impl is not None:
        return rule.impl.accept_probability(p, q, x, table, depth)
    c, m = relaxed_mass(p, x, table, rule, budget)
    qx = 1.0 if q is None else _take(q, x)
    return ((_take(p, x) + c) / qx).clamp(max=1.0), c, m


def residual(p: Tensor, q: Tensor | None, x: int, m: int, table: Tensor | None, rule: AcceptRule) -> Tensor:
    """The distribution to sample from after rejecting draft x (1-D p, q; m = m* of that draft)."""
    if rule.impl is not None:
        return rule.impl.residual(p, q, x, m, table)
    if rule.residual in AUTHORS_RESIDUALS:
        return reference_residual(p, q, x, m, table, rule)
    r = p.clone() if q is None else (p - q).clamp(min=0.0)
    r[x] = 0.0
    if m > 0:
        r[table[x, :m].long()] = 0.0
    total = r.sum()
    return r / total if total > 0 else p / p.sum()  # only through rounding: exact arithmetic leaves mass


def residual_rows(p: Tensor, q: Tensor | None, x: Tensor, m: Tensor, table: Tensor | None, rule: AcceptRule) -> Tensor:
    """`residual` (and `reference_residual`, both authors' modes) for many rows at once, on the device and without a host sync: p, q
    [n, V] (q None: deterministic drafts), the rejected drafts x [n] and their m* [n] (for a rule with its own
    verification: the third entry of its accept_probability, handed to its residual_rows)."""
    if rule.impl is not None:
        return rule.impl.residual_rows(p, q, x, m, table)
    r = p.clone() if q is None else (p - q).clamp(min=0.0)
    if rule.residual in AUTHORS_RESIDUALS:
        fallback = torch.full_like(p, 1.0 / p.shape[-1])
        width, keep = rule.k + 1, lambda cols: (m > 0)[:, None].expand_as(cols)  # noqa: E731
    else:
        fallback = p / p.sum(-1, keepdim=True)
        width, keep = rule.k, lambda cols: cols < m[:, None]  # noqa: E731
    if rule.relaxed and width:
        _wide_enough(table, width, rule)
        nb = table[x, :width].long()
        hit = keep(torch.arange(width, device=p.device).expand_as(nb))
        if rule.residual == "reference" and q is not None:  # the neighbours leave q, not p
            q = q.scatter(-1, nb, torch.where(hit, 0.0, q.gather(-1, nb)))
            r = (p - q).clamp(min=0.0)
        else:  # they leave p (bounded, lumina): max(p - q, 0) with them zeroed is max(p' - q, 0), p' p without them
            r = r.scatter(-1, nb, torch.where(hit, 0.0, r.gather(-1, nb)))
    r = r.scatter(-1, x[:, None], 0.0)
    total = r.sum(-1, keepdim=True)
    return torch.where(total > 0, r / total, fallback)


def _wide_enough(table: Tensor, width: int, rule: AcceptRule) -> None:
    """A residual reads `width` columns (k + 1 for the authors' modes): a narrower table would be sliced short
    silently. A shape check, no host sync."""
    if table.shape[-1] < width:
        raise ValueError(f"{rule.describe()} needs a neighbour table with >= {width} columns for its residual")


def reference_residual(p: Tensor, q: Tensor | None, x: int, m: int, table: Tensor | None, rule: AcceptRule) -> Tensor:
    """The authors' residual after rejecting x (jadohu/LANTERN models/ea_model_llamagen.py, "Initial Release").

    q None follows EaModel.evaluate_posterior (dynamic tree, drafts taken as q = 1): gtp[x] = 0, then, if the draft
    was relaxed, gtp[nearest[x, :k + 1]] = 0; ones if nothing is left; renormalise. q given follows
    EaModel.evaluate_posterior_v1 (static tree): q' = the parent's q without the earlier siblings, renormalised
    (the q carried by after_rejection), then, if relaxed, q'[nearest[x, :k + 1]] = 0 with no renormalisation;
    gtp = max(gtp - q', 0), ones if nothing is left, renormalise. Their table excludes x itself
    (generate_codebook.py fills the diagonal with inf), so nearest[x, :k + 1] are k + 1 codes other than x: our
    table's first k + 1 columns. "Relaxed" is their `indices != -1`, i.e. m* >= 1.
    rule.residual `lumina` (models/ea_model_lumina_mgpt.py evaluate_posterior, static tree): nearest[x, :k + 1]
    leave p (gtp) instead of q', then gtp = max(gtp - q', 0), ones if nothing is left, renormalise.
    """
    relaxed = m > 0
    if relaxed:
        _wide_enough(table, rule.k + 1, rule)
    if q is None or rule.residual == "lumina":
        r = p.clone()
        if relaxed:
            r[table[x, : rule.k + 1].long()] = 0.0
        if q is not None:
            r = (r - q).clamp(min=0.0)
    else:
        q = q.clone()
        if relaxed:
            q[table[x, : rule.k + 1].long()] = 0.0
        r = (p - q).clamp(min=0.0)
    # Their static code leaves x to max(p - q', 0), which a rejection makes 0 (p(x) <= p~(x) < q'(x)); zeroing it
    # here says the same and keeps rounding from reviving a rejected draft.
    r[x] = 0.0
    total = r.sum()
    return r / total if total > 0 else torch.full_like(p, 1.0 / p.numel())


def sibling_budget(q: Tensor | None, rule: AcceptRule) -> float | None:
    """The TV budget siblings share: bounded LANTERN under deterministic drafting; None means per-draft delta."""
    shared = q is None and rule.relaxed and rule.kind == "lantern" and rule.residual == "bounded"
    return rule.delta if shared else None


def after_rejection(p: Tensor, q: Tensor | None, x: int, c: float, m: int, table: Tensor | None, rule: AcceptRule,
                    budget: float | None):
    """(p, q, budget) for the next sibling once draft x (relaxed mass c, m* = m) was rejected."""
    if budget is not None:
        # In units of the renormalised residual: what is left of delta over the mass still in play.
        left = float(p.sum() - p[x]) - c
        budget = max(budget - c, 0.0) / left if left > 0 else 0.0
    p = residual(p, q, x, m, table, rule)
    if q is not None:
        q = q.clone()
        q[x] = 0.0
        total = q.sum()
        q = q / total if total > 0 else q
    return p, q, budget


def verify_candidates(
    p: Tensor,
    q: Tensor | None,
    candidates: list[int],
    table: Tensor | None,
    rule: AcceptRule,
    uniforms: list[float],
    depth: int = 0,
) -> tuple[int, Tensor]:
    """Try sibling drafts at one position in order (multi-candidate verification, method.md section 2).

    q None: deterministic top-k drafting (q(x) = 1; a rejected x leaves p, which is renormalised). Otherwise the
    candidates were drawn from q without replacement in this order: candidate j is tried with its conditional
    draft probability, and after a rejection p becomes the residual and q loses x (renormalised).
    Returns (index of the accepted candidate or -1, the target after the rejected tries); when none is accepted
    the correction token is drawn from the returned distribution. `depth`: the candidates' index in the round
    (0 for the root's children), read by rules that anneal over it (Cool-SD).
    """
    if rule.impl is not None:
        return rule.impl.verify_candidates(p, q, candidates, table, uniforms, depth)
    budget = sibling_budget(q, rule)
    for j, x in enumerate(candidates):
        a, c, m = accept_probability(p, q, torch.tensor(x, device=p.device), table, rule, budget)
        if uniforms[j] < a.item():
            return j, p
        p, q, budget = after_rejection(p, q, x, c.item(), int(m), table, rule, budget)
    return -1, p
