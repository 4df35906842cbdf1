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
Batches (`batched_jacobi_generate`): the images still decoding advance together, one target forward per iteration
over all their windows (ragged, the layout of batched.py: per-row positions, cache rows and a scratch slot for the
padding), each image refilling, accepting and refining with its own generator exactly as `jacobi_decode` does
(the same `Image` methods), so its tokens and stats never depend on the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from lantern.engine.acceptance import AcceptRule
from lantern.engine.batched import SCRATCH, batch_probs, pack, ragged, target_forward
from lantern.engine.chain import chain_probs, verify_chain
from lantern.engine.model import GPT, causal_mask
from lantern.engine.sampling import SamplingParams, pick
from lantern.engine.speculative import check_one_image, prefill_rows, target_prefill
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


@dataclass
class Image:
    """One image's Jacobi state, and its steps of one iteration (shared by the single-image and batched loops)."""

    index: int  # b: its cache rows are b (and b + B under CFG) in a batch (batched.cache_rows)
    generator: torch.Generator
    tokens: list[int]
    Q: int  # target position of the newest token y
    stats: ImageStats
    window: list[int] = field(default_factory=list)  # x_1..x_L
    qs: list[Tensor] = field(default_factory=list)  # the distributions they were drawn from

    def refill(self, jacobi: Jacobi, N: int, uniform: Tensor) -> None:
        """Step 1: the window topped up to L (fewer near the image's end) with uniform draws."""
        L = min(jacobi.window, N - len(self.tokens))
        self.window, self.qs = self.window[:L], self.qs[:L]
        fresh = L - len(self.window)
        if fresh:
            self.window += torch.randint(len(uniform), (fresh,), generator=self.generator,
                                         device=self.generator.device).tolist()  # a CPU generator draws on the CPU
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
    im = Image(0, generator, [first], T, ImageStats(n_tokens=N, target_forwards=1))

    while len(im.tokens) < N:
        with timer.section("draft"):
            im.refill(jacobi, N, uniform)
        with timer.section("verify"):
            L, Q = len(im.window), im.Q
            seq = torch.tensor([im.tokens[-1]] + im.window, device=device)
            pos = torch.arange(Q, Q + L + 1, device=device)
            logits, _ = target.forward_cached(target.embed_tokens(seq.expand(R, -1)), pos, pos,
                                              causal_mask(L + 1, target.cache_len, device, start=Q))
            im.stats.target_forwards += 1
        with timer.section("other"):
            P = chain_probs(logits, params, len(im.tokens))
            a = im.accept(P, params, table, rule, N)
        if a is None:
            break
        with timer.section("draft"):
            im.refine(P, a, params, N)

    target.clear_cache()
    return torch.tensor(im.tokens, device=device), im.stats.finish(timer)


@torch.no_grad()
def batched_jacobi_generate(target: GPT, cond: Tensor, params: SamplingParams, rule: AcceptRule, jacobi: Jacobi,
                            generators: list[torch.Generator], table: Tensor | None = None,
                            cond_mask: Tensor | None = None, compile: bool = False) -> tuple[Tensor, list[ImageStats]]:
    """Speculative Jacobi decoding of a batch, all images at once; same contract (and tokens, and stats but the
    times, which are the batch's wall time per section / B) as `jacobi_decode` image by image. compile: the verify
    forward through torch.compile at the static width window + 1 (batched.py)."""
    B, N, T, V = cond.shape[0], target.args.image_tokens, target.args.cls_token_num, target.args.vocab_size
    if len(generators) != B:
        raise ValueError(f"need one generator per image: {len(generators)} for a batch of {B}")
    check_one_image(cond[:1], rule, table)  # the rule's neighbour-table check (batches are ours to take)
    device = target.output.weight.device
    timer = StepTimer(device)
    reset_peak_memory(device)
    logits, cond_emb, _, _ = prefill_rows(target, cond, params, timer, cond_mask, SCRATCH, static=compile)
    width = jacobi.nodes + 1 if compile else None
    R = cond_emb.shape[0] // B
    with timer.section("other"):
        p0 = batch_probs(logits[:, -1:], params, torch.zeros(B, 1, dtype=torch.long, device=device))
        images = [Image(b, g, [pick(p0[b, 0], params, g)], T, ImageStats(n_tokens=N, target_forwards=1))
                  for b, g in enumerate(generators)]
    uniform = torch.full((V,), 1.0 / V, device=device)

    while active := [im for im in images if len(im.tokens) < N]:
        with timer.section("draft"):
            for im in active:
                im.refill(jacobi, N, uniform)
        with timer.section("verify"):  # one forward over every active image's [y, x_1..x_L], padded to the longest
            seqs = [[im.tokens[-1]] + im.window for im in active]
            lengths = [len(s) for s in seqs]
            x = pack([torch.tensor(s, device=device).expand(R, -1)[..., None] for s in seqs], max(lengths))[..., 0]
            pos, slots, visible = ragged([im.Q for im in active], lengths, R, target.cache_len, device)
            logits, _ = target_forward(target, active, B, x, pos, slots, visible, width)
            for im in active:
                im.stats.target_forwards += 1
        with timer.section("other"):
            index = torch.tensor([len(im.tokens) for im in active], device=device)[:, None] + torch.arange(
                logits.shape[1], device=device)
            P = batch_probs(logits, params, index)
            accepted = [im.accept(P[i], params, table, rule, N) for i, im in enumerate(active)]
        with timer.section("draft"):
            for i, (im, a) in enumerate(zip(active, accepted)):
                if a is not None:
                    im.refine(P[i], a, params, N)

    target.clear_cache()
    stats = []
    for im in images:
        s = im.stats.finish(timer)
        s.time_draft_s, s.time_verify_s, s.time_other_s = s.time_draft_s / B, s.time_verify_s / B, s.time_other_s / B
        s.batch_size = B
        stats.append(s)
    return torch.tensor([im.tokens for im in images], device=device), stats
