"""Chain drafts (EAGLE-1): one round of gamma drafts x_1..x_g, verified in one causal target forward; the rounds
themselves are chain_rounds.ChainRounds, which accepts every image's chain at once (`accept_chains`).

draft: gamma drafter forwards, the first from the catch-up's predicted hidden state, each later one feeding the
drafter its own predicted hidden state; every x_i is drawn from the drafter's CFG-mixed, temperature/top-k/top-p
processed distribution q_i (argmax under greedy).
verify: one target forward over [y, x_1..x_g] at positions Q..Q+g (slots Q..Q+g: the accepted prefix already sits
where it belongs, nothing to move).
accept: `accept_chains`, the longest prefix the rule allows, every image's chain at once (also Jacobi decoding's
verification).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lantern.engine.rules.acceptance import AcceptRule, accept_probability, greedy_accept, residual_rows
from lantern.engine.models.model import GPT
from lantern.engine.decoding.sampling import SamplingParams, draw
from lantern.errors import UserError


@dataclass(frozen=True)
class Chain:
    gamma: int = 4  # drafted tokens per round
    skip_every: int = 0  # VVS: every skip_every-th round of an image commits its drafts unverified (0: never)
    target_extra = 0
    drafter_extra = 0

    @property
    def nodes(self) -> int:
        return self.gamma

    def __post_init__(self):
        if isinstance(self.gamma, bool) or not isinstance(self.gamma, int) or self.gamma < 1:
            raise UserError(f"gamma={self.gamma!r} must be a positive integer (drafted tokens per round)")
        if self.skip_every == 1 or self.skip_every < 0:
            raise UserError(f"skip_every={self.skip_every!r} must be 0 (no skipping) or >= 2: the round after a "
                            "skipped one verifies what it committed")

    def to(self, device) -> "Chain":
        return self

    def check(self, target: GPT) -> None:
        pass


def accept_chains(P: Tensor, q: Tensor, X: Tensor, g: Tensor, u: Tensor | None, params: SamplingParams,
                  table: Tensor | None, rule: AcceptRule, tried_from: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The longest accepted prefix of n chains at once, on the device (greedy: the longest prefix of drafts that
    pass the rule's greedy test; sampling: one uniform per tried draft, accept while u < min(1, p~(x) / q(x))):
    drafts X [n, G] (chain i: its first g[i]) drawn from q
    [n, G, V], the target's P [n, G + 1, V]; u [n, ...] each chain's uniforms of the round (None: greedy), the
    tried drafts' at columns tried_from[i] + j (default g[i]: after the drafts' own) and the next token's at
    tried_from[i] + tries. Returns (accepted lengths a [n],
    next tokens [n]: the residual's draw at the first rejection, else the bonus token's from P[a]). No host sync.
    A rule with its own relaxed target (LANTERN-TV) is verified exactly against that target, computed once."""
    n, G = X.shape
    j, rows = torch.arange(G, device=X.device), torch.arange(n, device=X.device)
    tried_from = g if tried_from is None else tried_from
    valid = j < g[:, None]
    if params.greedy:
        ok = greedy_accept(P[:, :G], X, table, rule) & valid
    else:
        verified = P[:, :G]
        if hasattr(rule.impl, "target"):
            # a rule that verifies exactly against its own relaxed target (LANTERN-TV): that target is computed
            # once, for the acceptance and for the residual at the first rejection alike
            verified, rule = rule.impl.target(verified, q, table), AcceptRule("exact")
        A, _, M = accept_probability(verified, q, X, table, rule)
        ok = (u.gather(1, tried_from[:, None] + j) < A) & valid
    a = ok.long().cumprod(-1).sum(-1)
    p = P[rows, a]
    if params.greedy:
        return a, p.argmax(-1)
    at = a.clamp(max=G - 1)  # the first rejected draft (a row that accepted all of them ignores it)
    rejected = a < g
    res = residual_rows(verified[rows, at], q[rows, at], X[rows, at], M[rows, at], table, rule)
    p = torch.where(rejected[:, None], res, p)
    return a, draw(p, u.gather(1, (tried_from + torch.minimum(a + 1, g))[:, None])[:, 0])
