"""Chain drafts (EAGLE-1): one round of gamma drafts x_1..x_g, verified in one causal target forward; the rounds
themselves are batched.ChainRounds.

draft: gamma drafter forwards, the first from the catch-up's predicted hidden state, each later one feeding the
drafter its own predicted hidden state; every x_i is drawn from the drafter's CFG-mixed, temperature/top-k/top-p
processed distribution q_i (argmax under greedy).
verify: one target forward over [y, x_1..x_g] at positions Q..Q+g (slots Q..Q+g: the accepted prefix already sits
where it belongs, nothing to move).
accept: `verify_chain`, the longest prefix the rule allows (also Jacobi decoding's verification).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lantern.engine.acceptance import AcceptRule, accept_probability, greedy_accept, residual
from lantern.engine.model import GPT
from lantern.engine.sampling import SamplingParams
from lantern.errors import UserError


@dataclass
class ChainDraft:
    tokens: list[int]
    q: list[Tensor]  # the distributions the drafts were drawn from

    @property
    def max_depth(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class Chain:
    gamma: int = 4  # drafted tokens per round
    target_extra = 0
    drafter_extra = 0

    @property
    def nodes(self) -> int:
        return self.gamma

    def __post_init__(self):
        if isinstance(self.gamma, bool) or not isinstance(self.gamma, int) or self.gamma < 1:
            raise UserError(f"gamma={self.gamma!r} must be a positive integer (drafted tokens per round)")

    def to(self, device) -> "Chain":
        return self

    def check(self, target: GPT) -> None:
        pass


def verify_chain(P: Tensor, q: list[Tensor], tokens: list[int], params: SamplingParams, table: Tensor | None,
                 rule: AcceptRule, generator: torch.Generator) -> tuple[int, Tensor]:
    """(accepted prefix length a, the next token's distribution) for drafts x_1..x_g drawn from q_1..q_g, against
    the target's P [g + 1, V]: greedy tests all positions at once; sampling draws one uniform per tried position,
    stops at the first rejection and returns the residual there, or P[g] when all pass. Shared by the EAGLE chain
    and by Jacobi decoding (jacobi.py), whose drafts are the target's own earlier guesses."""
    g = len(tokens)
    X = torch.tensor(tokens, device=P.device)
    if params.greedy:
        ok = greedy_accept(P[:g], X, table, rule).tolist()
        a = ok.index(False) if False in ok else g
        return a, P[a]
    A, _, M = accept_probability(P[:g], torch.stack(q), X, table, rule)
    a = 0
    while a < g and torch.rand((), generator=generator, dtype=torch.float64).item() < A[a].item():
        a += 1
    if a < g:
        return a, residual(P[a], q[a], tokens[a], int(M[a]), table, rule)
    return g, P[g]
