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
drafter-based decoders (speculative.decode); entries past the accepted prefix are overwritten by the next forward.
Stats: drafter_forwards = 0, accepted_per_step = window tokens accepted per iteration (the correction or bonus token
not counted), tree_depth = the window verified.
Batches (`JacobiRounds`, run by speculative.decode): the images still decoding advance together, one target forward
per iteration over all their windows (ragged, the layout of batched.py), each image refilling, accepting and
refining with its own generator, so its tokens and stats never depend on the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from lantern.engine.acceptance import AcceptRule
from lantern.engine.batched import (
    batch_probs, cache_rows, finish, first_tokens, pack, prefill_rows, ragged, target_forward, to_device,
)
from lantern.engine.chain import verify_chain
from lantern.engine.model import GPT
from lantern.engine.sampling import SamplingParams, pick
from lantern.engine.stats import ImageStats, StepTimer
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


@dataclass
class Image:
    """One image's Jacobi state, and its steps of one iteration."""

    index: int  # b: its cache rows are b (and b + B under CFG) in a batch (batched.cache_rows)
    generator: torch.Generator
    tokens: list[int]
    Q: int  # target position of the newest token y
    stats: ImageStats
    window: list[int] = field(default_factory=list)  # x_1..x_L
    qs: list[Tensor] = field(default_factory=list)  # the distributions they were drawn from
    refine_from: tuple[Tensor, int] | None = None  # (P, a) of the last iteration, for step 4
    n: int = 1  # tokens decoded so far

    def refill(self, jacobi: Jacobi, N: int, uniform: Tensor) -> None:
        """Step 1: the window topped up to L (fewer near the image's end) with uniform draws."""
        L = min(jacobi.window, N - len(self.tokens))
        self.window, self.qs = self.window[:L], self.qs[:L]
        fresh = L - len(self.window)
        if fresh:
            self.window += torch.randint(len(uniform), (fresh,), generator=self.generator,
                                         device=uniform.device).tolist()
            self.qs += [uniform] * fresh

    def accept(self, P: Tensor, params: SamplingParams, table: Tensor | None, rule: AcceptRule, N: int) -> int | None:
        """Step 3 from the target's P [>= L + 1, V] at positions Q..Q+L: the accepted prefix and the correction or
        bonus token committed; returns the prefix length a, None once the image is complete."""
        a, p = verify_chain(P[: len(self.window) + 1], self.qs, self.window, params, table, rule, self.generator)
        self.tokens += self.window[:a]
        self.stats.accepted_per_step.append(a)
        self.stats.tree_depth.append(len(self.window))
        if len(self.tokens) == N:
            return None
        self.tokens.append(pick(p, params, self.generator))
        self.Q += a + 1
        return a

    def refine(self, P: Tensor, a: int, params: SamplingParams, N: int) -> None:
        """Step 4: positions after the new token get this iteration's guesses there, conditioned on the rejected
        prefix (P_{L+1} included, never past the image's end)."""
        later = range(a + 1, min(len(self.window) + 1, N - (len(self.tokens) - a - 1)))
        self.window = [pick(P[j], params, self.generator) for j in later]
        self.qs = [P[j] for j in later]


class JacobiRounds:
    """Jacobi iterations for a batch in speculative.decode's loop: one target forward per iteration over every
    active image's [y, x_1..x_L] (ragged, the layout of batched.py), each image refilling, accepting and refining
    with its own generator (the `Image` steps). Refinement (step 4) runs at the start of the next iteration's
    draft section, from the distributions the image kept."""

    def __init__(self, target: GPT, jacobi: Jacobi, params: SamplingParams, rule: AcceptRule, table: Tensor | None,
                 B: int):
        self.target, self.jacobi, self.params, self.rule, self.table, self.B = target, jacobi, params, rule, table, B
        self.N, self.device = target.args.image_tokens, target.output.weight.device
        self.uniform = torch.full((target.args.vocab_size,), 1.0 / target.args.vocab_size, device=self.device)

    def prefill(self, cond: Tensor, generators: list[torch.Generator], timer: StepTimer, cond_mask: Tensor | None,
                static: bool) -> list[Image]:
        p0, cond_emb, _, _ = prefill_rows(self.target, cond, self.params, timer, cond_mask, 0, static)
        self.R, T = cond_emb.shape[0] // self.B, self.target.args.cls_token_num
        with timer.section("other"):
            first = first_tokens(p0, self.params, generators).tolist()
            return [Image(b, g, [first[b]], T, ImageStats(n_tokens=self.N, target_forwards=1))
                    for b, g in enumerate(generators)]

    def draft(self, images: list[Image]) -> None:
        for im in images:
            if im.refine_from is not None:
                im.refine(*im.refine_from, self.params, self.N)
            im.refill(self.jacobi, self.N, self.uniform)

    def verify(self, images: list[Image], width: int | None) -> tuple[Tensor, Tensor]:
        """One forward over every active image's [y, x_1..x_L], padded to the longest."""
        device, R = self.device, self.R
        seqs = [[im.tokens[-1]] + im.window for im in images]
        lengths = [len(s) for s in seqs]
        x = pack([torch.tensor(s, device=device).expand(R, -1)[..., None] for s in seqs], max(lengths))[..., 0]
        pos, slots, visible = ragged(*to_device(device, [im.Q for im in images], lengths), max(lengths), R,
                                     self.target.cache_len)
        for im in images:
            im.stats.target_forwards += 1
        return target_forward(self.target, cache_rows(images, self.B, R, device), x, pos, slots, visible, width)

    def commit(self, images: list[Image], logits: Tensor, hidden: Tensor) -> None:
        index = torch.tensor([len(im.tokens) for im in images], device=self.device)[:, None] + torch.arange(
            logits.shape[1], device=self.device)
        P = batch_probs(logits, self.params, index)
        for i, im in enumerate(images):
            a = im.accept(P[i], self.params, self.table, self.rule, self.N)
            im.n = len(im.tokens)
            im.refine_from = None if a is None else (P[i], a)

    def finish(self, images: list[Image], timer: StepTimer) -> tuple[Tensor, list[ImageStats]]:
        return finish(self.target, images, timer)
