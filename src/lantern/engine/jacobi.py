"""Speculative Jacobi decoding (SJD; Teng et al. 2024, arXiv 2410.01699): the target drafts for itself.

A window of L future tokens is refined by Jacobi iterations of the target alone. One iteration, with y the newest
token at target position Q:
1. refill: the window is topped up to L (fewer near the image's end) with fresh tokens drawn uniformly from the
   vocabulary, whose draft distribution is therefore the uniform one;
2. verify: ONE target forward over [y, x_1..x_L] (positions Q..Q+L, the cache API of chain.py) gives P_1..P_{L+1};
3. accept: `chain.verify_chain`, exactly as the EAGLE chain verifies, with each window token's draft distribution
   q_i = the distribution it was drawn from (the previous iteration's P at its position, or uniform): accept with
   min(1, p(x)/q(x)) under `exact`, resample from the rule's residual at the first rejection (greedy: the longest
   prefix of argmaxes, then the argmax); every acceptance rule of the registry applies unchanged;
4. refine: the tokens after the first rejection are redrawn from this iteration's P at their positions (their
   prefix changed, so these are the Jacobi guesses), P_{L+1} included, and carried to the next iteration with
   those P as their q.
Exactness: every draft was drawn from a distribution fixed before its verification's uniform, so this is
speculative sampling, and under `exact` each image's tokens are distributed as plain AR's (tests/test_jacobi.py
checks it by chi-square; greedy Jacobi decoding reproduces greedy AR). Fresh tokens are uniform draws, our reading
of the paper's random initialisation (the authors' code was not available to confirm it); any fixed q keeps exactness. The cache, sampling path (sampling.row_probs / pick), timing sections and stats are those of the
drafter-based decoders (speculative.py); entries past the accepted prefix are overwritten by the next forward.
Stats: drafter_forwards = 0, accepted_per_step = window tokens accepted per iteration (the correction or bonus token
not counted), tree_depth = the window verified.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lantern.engine.acceptance import AcceptRule
from lantern.engine.chain import chain_probs, verify_chain
from lantern.engine.model import GPT, causal_mask
from lantern.engine.sampling import SamplingParams, pick
from lantern.engine.speculative import check_one_image, target_prefill
from lantern.engine.stats import ImageStats, StepTimer, reset_peak_memory
from lantern.errors import UserError


@dataclass(frozen=True)
class Jacobi:
    window: int = 16  # L: window tokens verified per target forward

    def __post_init__(self):
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise UserError(f"window={self.window!r} must be a positive integer (tokens per Jacobi iteration)")

    @property
    def nodes(self) -> int:
        return self.window


@torch.no_grad()
def jacobi_decode(target: GPT, cond: Tensor, params: SamplingParams, rule: AcceptRule, jacobi: Jacobi,
                  generator: torch.Generator, table: Tensor | None = None,
                  cond_mask: Tensor | None = None) -> tuple[Tensor, ImageStats]:
    """Decode one image (cond [1] or [1, T, C]) by speculative Jacobi decoding; returns its tokens [N] and stats."""
    check_one_image(cond, rule, table)
    N, T, V = target.args.image_tokens, target.args.cls_token_num, target.args.vocab_size
    device = target.output.weight.device
    timer = StepTimer(device)
    reset_peak_memory(device)
    first, cond_emb, _, _ = target_prefill(target, cond, params, generator, timer, cond_mask)
    R = cond_emb.shape[0]
    uniform = torch.full((V,), 1.0 / V, device=device)
    tokens, window, qs = [first], [], []
    Q = T
    stats = ImageStats(n_tokens=N, target_forwards=1)

    while len(tokens) < N:
        n_done = len(tokens)
        L = min(jacobi.window, N - n_done)
        with timer.section("draft"):
            window, qs = window[:L], qs[:L]
            fresh = L - len(window)
            if fresh:
                window += torch.randint(V, (fresh,), generator=generator, device=device).tolist()
                qs += [uniform] * fresh
        with timer.section("verify"):
            seq = torch.tensor([tokens[-1]] + window, device=device)
            pos = torch.arange(Q, Q + L + 1, device=device)
            logits, _ = target.forward_cached(target.embed_tokens(seq.expand(R, -1)), pos, pos,
                                              causal_mask(L + 1, target.cache_len, device, start=Q))
            stats.target_forwards += 1
        with timer.section("other"):
            P = chain_probs(logits, params, n_done)
            a, p = verify_chain(P, qs, window, params, table, rule, generator)
            tokens += window[:a]
            stats.accepted_per_step.append(a)
            stats.tree_depth.append(L)
            if len(tokens) == N:
                break
            tokens.append(pick(p, params, generator))
            Q += a + 1
        with timer.section("draft"):
            # positions after the new token: this iteration's guesses there, conditioned on the rejected prefix
            later = range(a + 1, min(L + 1, N - n_done))
            window = [pick(P[j], params, generator) for j in later]
            qs = [P[j] for j in later]

    target.clear_cache()
    return torch.tensor(tokens, device=device), stats.finish(timer)
