"""Chain drafts (EAGLE-1): one round of gamma drafts x_1..x_g, verified in one causal target forward.

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
from lantern.engine.drafter import Drafter
from lantern.engine.model import GPT, causal_mask
from lantern.engine.sampling import SamplingParams, pick, row_probs
from lantern.errors import UserError


@dataclass
class ChainDraft:
    tokens: list[int]
    q: list[Tensor]  # the distributions the drafts were drawn from
    rows: int

    @property
    def drafter_passes(self) -> int:  # beyond the catch-up forward, which predicts x_1
        return len(self.tokens) - 1

    @property
    def max_depth(self) -> int:
        return len(self.tokens)

    def tokens_at(self, path: list[int]) -> list[int]:
        return [self.tokens[i] for i in path]


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

    def draft(self, drafter: Drafter, pred: Tensor, params: SamplingParams, Q: int, n_done: int, left: int,
              generator: torch.Generator) -> ChainDraft:
        R, device = pred.shape[0], pred.device
        g = min(self.gamma, left)
        tokens, qs = [], []
        for i in range(g):
            q = row_probs(drafter.head(pred[:, -1]), params, n_done + i)
            tokens.append(pick(q, params, generator))
            qs.append(q)
            if i < g - 1:
                x = drafter.embed_tokens(torch.tensor([tokens[-1]] * R, device=device))[:, None]
                pred = drafter.step(x, pred, Q + i)
        return ChainDraft(tokens, qs, R)

    def verify(self, target: GPT, y: int, draft: ChainDraft, Q: int) -> tuple[Tensor, Tensor]:
        device = target.output.weight.device
        g = len(draft.tokens)
        seq = torch.tensor([y] + draft.tokens, device=device)
        pos = torch.arange(Q, Q + g + 1, device=device)
        emb = target.embed_tokens(seq.expand(draft.rows, -1))
        return target.forward_cached(emb, pos, pos, causal_mask(g + 1, target.cache_len, device, start=Q))

    def accept(self, logits: Tensor, draft: ChainDraft, params: SamplingParams, n_done: int, table: Tensor | None,
               rule: AcceptRule, generator: torch.Generator) -> tuple[list[int], Tensor]:
        a, p = verify_chain(chain_probs(logits, params, n_done), draft.q, draft.tokens, params, table, rule, generator)
        return list(range(a)), p


def chain_probs(logits: Tensor, params: SamplingParams, n_done: int) -> Tensor:
    """[g + 1, V]: the target's processed distribution at each verified position (logits [R, g + 1, V], rows
    CFG-mixed), the first being that of image token n_done."""
    return torch.stack([row_probs(logits[:, j], params, n_done + j) for j in range(logits.shape[1])])


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
