"""Chain drafts (EAGLE-1): one round of gamma drafts x_1..x_g, verified in one causal target forward.

draft: gamma drafter forwards, the first from the catch-up's predicted hidden state, each later one feeding the
drafter its own predicted hidden state; every x_i is drawn from the drafter's CFG-mixed, temperature/top-k/top-p
processed distribution q_i (argmax under greedy).
verify: one target forward over [y, x_1..x_g] at positions Q..Q+g (slots Q..Q+g: the accepted prefix already sits
where it belongs, nothing to move).
accept: the longest prefix the rule allows: greedy tests all positions at once (acceptance.greedy_accept); sampling
draws one uniform per tried position, stops at the first rejection and names the residual there, or the target's
distribution after x_g when all pass.
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
        g = len(draft.tokens)
        P = torch.stack([row_probs(logits[:, j], params, n_done + j) for j in range(g + 1)])
        X = torch.tensor(draft.tokens, device=logits.device)
        if params.greedy:
            ok = greedy_accept(P[:g], X, table, rule).tolist()
            a = ok.index(False) if False in ok else g
            return list(range(a)), P[a]
        A, _, M = accept_probability(P[:g], torch.stack(draft.q), X, table, rule)
        a = 0
        while a < g and torch.rand((), generator=generator, dtype=torch.float64).item() < A[a].item():
            a += 1
        if a < g:
            return list(range(a)), residual(P[a], draft.q[a], draft.tokens[a], int(M[a]), table, rule)
        return list(range(g)), P[g]
