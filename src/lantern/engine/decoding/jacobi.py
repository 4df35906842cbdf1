"""Speculative Jacobi decoding (SJD; Teng et al. 2024, arXiv 2410.01699): the target drafts for itself.

A window of L future tokens is refined by Jacobi iterations of the target alone. One iteration, with y the newest
token at target position Q:
1. refill: the window is topped up to L (fewer near the image's end) with fresh tokens drawn uniformly from the
   vocabulary (floor(u V) of one uniform u each, from the image's generator, so that every draw of an image is one
   stream of uniforms), whose draft distribution is therefore the uniform one;
2. verify: ONE target forward over [y, x_1..x_L] (positions Q..Q+L, the cache API of chain.py) gives P_1..P_{L+1};
3. accept: `chain.accept_chains`, exactly as the EAGLE chain verifies, with each window token's draft distribution
   q_i = the distribution it was drawn from (the previous iteration's P at its position, or uniform): accept with
   min(1, p(x)/q(x)) under `exact`, resample from the rule's residual at the first rejection (greedy: the longest
   prefix of argmaxes, then the argmax); every acceptance rule of the registry applies unchanged;
4. refine: the tokens after the first rejection are redrawn from this iteration's P at their positions (their
   prefix changed, so these are the Jacobi guesses), P_{L+1} included, and carried to the next iteration with
   those P as their q; independently (SJD), or coupled to the token each position held (`Jacobi.coupling`:
   SCD's maximal or Gumbel coupling, coupling.py, which states why every coupling stays exact).
Exactness: every draft was drawn from a distribution fixed before its verification's uniform, so this is
speculative sampling, and under `exact` each image's tokens are distributed as plain AR's (tests/test_jacobi.py
checks it by chi-square; greedy Jacobi decoding reproduces greedy AR). Fresh tokens are uniform draws, our reading
of the paper's random initialisation (the authors' code was not available to confirm it); any fixed q keeps exactness. The cache, sampling path (sampling.row_probs / pick), timing sections and stats are those of the
drafter-based decoders (speculative.decode); entries past the accepted prefix are overwritten by the next forward.
Stats: drafter_forwards = 0, accepted_per_step = window tokens accepted per iteration (the correction or bonus token
not counted), tree_depth = the window verified.
Batches (`JacobiRounds`, run by speculative.decode): the images still decoding advance together, one target forward
per iteration over all their windows (ragged, the layout of rounds.py), each image refilling, accepting and
refining with its own generator, so its tokens and stats never depend on the batch.
Forced structural tokens (`layout`, docs/chameleon-layout.md): the window, its q and P hold codes over the image
head (V = codebook, fresh codes uniform over it); the verify forward feeds the forced tokens between the window's
codes (forced.py: the chain rounds' splicing) and P is read at each code's predicting row, so no forced token is
drafted, refined or tested, and the uniforms per iteration are the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from lantern.engine.rules.acceptance import AcceptRule
from lantern.engine.decoding.rounds import (
    batch_probs, finish, first_tokens, forward_rows_of, in_rows, prefill_rows, ragged, target_forward, to_device,
)
from lantern.engine.decoding.chain import accept_chains
from lantern.engine.decoding.coupling import COUPLINGS, gumbel, gumbel_noise, maximal
from lantern.engine.decoding.forced import (code_logits, code_positions, slot_geometry, slot_ids, verify_rows,
                                            verify_width)
from lantern.engine.models.layout import Layout
from lantern.engine.models.model import GPT
from lantern.engine.decoding.sampling import SamplingParams, draw
from lantern.engine.decoding.stats import ImageStats, StepTimer
from lantern.errors import UserError


@dataclass(frozen=True)
class Jacobi:
    window: int = 16  # L: window tokens verified per target forward
    coupling: str = "independent"  # how step 4 re-drafts the window (coupling.py): independent is SJD
    target_extra = 0  # cache slots past the window (jacobi_tree.ProactiveJacobi's tree nodes)

    def __post_init__(self):
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise UserError(f"window={self.window!r} must be a positive integer (tokens per Jacobi iteration)")
        if self.coupling not in COUPLINGS:
            raise UserError(f"coupling={self.coupling!r} is not allowed; use one of {', '.join(COUPLINGS)}")

    @property
    def nodes(self) -> int:
        return self.window


@dataclass
class Image:
    """One image's Jacobi state on the host (its tokens, window and their q live in JacobiRounds' tensors)."""

    index: int  # b: its cache rows are b (and b + B under CFG) in a batch (rounds.cache_rows)
    generator: torch.Generator
    stats: ImageStats
    n: int = 1  # tokens decoded so far
    L: int = 0  # window tokens x_1..x_L
    a: int = -1  # the last iteration's accepted prefix (-1: none yet): its guesses after it refine the window
    prev: int = 0  # tokens decoded before the last iteration


def refill(P: Tensor, u: Tensor, r: Tensor, L: Tensor, start: Tensor, greedy: bool, coupling: str = "independent",
           prior: tuple[Tensor, Tensor, Tensor] | None = None, noise: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Steps 4 and 1 on the device for n windows: (the window [n, W], each token's q [n, W, V]) from the last
    iteration's P [n, W + 1, V], the windows' first W uniforms u [n, W], r [n] guesses refined from P's rows
    start + j, then fresh tokens floor(u V) up to L [n], and zeros past L. Sampling under a coupling (coupling.py):
    `maximal` couples each guess with the last window's token at its row, prior = (that window [n, W], its q
    [n, W, V], its length [n]); `gumbel` draws guesses and fresh tokens by Gumbel-max under noise [n, W, V], the
    noises of each window slot's absolute position."""
    n, W, V = u.shape[0], u.shape[1], P.shape[-1]
    j = torch.arange(W, device=u.device)
    take = (start[:, None] + j).clamp(max=W)  # row a + 1 + j of the last P for guess j
    Pr = P.gather(1, take[..., None].expand(n, W, V))
    fresh = (u * V).long().clamp(max=V - 1)
    if greedy:
        guess = Pr.argmax(-1)
    elif coupling == "gumbel":
        guess, fresh = gumbel(Pr, noise), noise.argmax(-1)
    else:
        guess = draw(Pr, u)
        if coupling == "maximal":
            old, q_old, L_old = prior
            row = take.clamp(max=W - 1)  # the last window's token at row a + 1 + j, where it had one
            kept = maximal(Pr, q_old.gather(1, row[..., None].expand(n, W, V)), old.gather(1, row), u)
            guess = torch.where(take < L_old[:, None], kept, guess)
    is_guess, is_fresh = j < r[:, None], (j >= r[:, None]) & (j < L[:, None])
    window = torch.where(is_guess, guess, torch.where(is_fresh, fresh, 0))
    return window, torch.where(is_guess[..., None], Pr, 1.0 / V).to(P.dtype)


class JacobiRounds:
    """Jacobi iterations for a batch in speculative.decode's loop, three host syncs per iteration: one copy of
    integers (rows, counts), one of uniforms (refinement and fresh tokens, then the acceptance block drawn ahead),
    one read of the accepted lengths; refinement (step 4, at the next iteration's start), the fresh tokens,
    acceptance (chain.accept_chains) and the correction are drawn on the device. Every image draws from its own
    generator in the order of drawing one token at a time: refinement, fresh tokens, tried drafts, the correction.
    With compile on, jacobi_graph.GraphJacobiRounds runs the same iterations as one compiled call each.
    layout: the target's sequence carries forced tokens; the rounds decode its N = layout.codes codes."""

    def __init__(self, target: GPT, jacobi: Jacobi, params: SamplingParams, rule: AcceptRule, table: Tensor | None,
                 B: int, layout: Layout | None = None):
        self.target, self.jacobi, self.params, self.rule, self.table, self.B = target, jacobi, params, rule, table, B
        self.layout, self.device = layout, target.output.weight.device
        self.target_extra = jacobi.target_extra  # spare cache slots (jacobi_tree: the tree's nodes, its eol nodes)
        self.N, self.V = (target.args.image_tokens, target.args.vocab_size) if layout is None else (layout.codes,
                                                                                                   layout.codebook)
        W = jacobi.window
        self.buf = torch.zeros(B, self.N + W + 1, dtype=torch.long, device=self.device)  # tokens
        self.window = torch.zeros(B, W, dtype=torch.long, device=self.device)
        self.qs = torch.full((B, W, self.V), 1.0 / self.V, device=self.device)  # q of each window token
        self.P = torch.zeros(B, W + 1, self.V, device=self.device)  # the last iteration's target distributions

    def prefill(self, cond: Tensor, generators: list[torch.Generator], timer: StepTimer, cond_mask: Tensor | None,
                static: bool) -> list[Image]:
        p0, cond_emb, _, _ = prefill_rows(self.target, cond, self.params, timer, cond_mask, self.target_extra,
                                          static, self.layout)
        self.R = cond_emb.shape[0] // self.B
        with timer.section("other"):
            self.buf[:, 0] = first_tokens(p0, self.params, generators)
            if self.jacobi.coupling == "gumbel" and not self.params.greedy:  # each image's noise per position
                self.noise = torch.stack([gumbel_noise(g, self.N, self.V, self.device) for g in generators])
        return [Image(b, g, ImageStats(n_tokens=self.N, target_forwards=1)) for b, g in enumerate(generators)]

    def draft(self, images: list[Image]) -> None:
        """Steps 4 and 1: each window refined from the last iteration's P after its accepted prefix (r guesses,
        never past the image's end), then topped up to L = min(window, tokens left) with uniform draws. An image
        draws L uniforms for them (the guesses' r, then the fresh tokens', floor(u V)) and, sampling, the
        acceptance block ahead: L tries and the correction."""
        W, N, greedy, device = self.jacobi.window, self.N, self.params.greedy, self.device
        refined, us, self.states, last = [], [], [], []
        for im in images:
            r = 0 if im.a < 0 else max(0, min(im.L + 1, N - im.prev, im.a + 1 + min(W, N - im.n)) - im.a - 1)
            last.append(im.L)
            g = im.generator  # draws on the generator's device, moved to the data device after
            im.L = min(W, N - im.n)
            u = F.pad(torch.rand(im.L, generator=g, dtype=torch.float64, device=g.device), (0, W - im.L))
            self.states.append(g.get_state())
            if not greedy:
                u = torch.cat([u, torch.rand(W + 1, generator=g, dtype=torch.float64, device=g.device)])
            us.append(u)
            refined.append(r)
        self.u = torch.stack(us).to(device)  # [n, W] greedy, [n, W + W + 1] sampling
        plan = to_device(device, [im.index for im in images], [im.n for im in images], [im.L for im in images],
                         refined, [max(im.a, 0) + 1 for im in images], last)
        self.index, self.done, self.Ls, r, start, last = plan
        coupling, prior, noise = self.jacobi.coupling, None, None
        if coupling == "maximal":
            prior = (self.window[self.index], self.qs[self.index], last)
        if coupling == "gumbel" and not greedy:
            at = (self.done[:, None] + torch.arange(W, device=device)).clamp(max=N - 1)
            noise = self.noise[self.index[:, None], at]
        self.window[self.index], self.qs[self.index] = refill(self.P[self.index], self.u[:, :W], r, self.Ls, start,
                                                              greedy, coupling, prior, noise)

    def verify(self, images: list[Image], width: int | None) -> tuple[Tensor, Tensor]:
        """One forward over every active image's [y, x_1..x_L], padded to the longest; with a layout, y and the
        slots after it up to the bonus code's row: the window's codes and the forced tokens between them."""
        R, S, layout, T = self.R, max(im.L for im in images) + 1, self.layout, self.target.args.cls_token_num
        y, window = self.buf[self.index, self.done - 1], self.window[self.index, : S - 1]
        if layout is None:
            x, Q, lengths = torch.cat([y[:, None], window], 1), T + self.done - 1, self.Ls + 1
        else:  # self.code_slot [n, S]: each code's predicting row, which commit reads
            forced, self.code_slot, _ = slot_geometry(layout, self.done, S - 1)
            longest = max(verify_rows(layout, im.n, im.L) for im in images)
            x = torch.cat([(y + layout.code_offset)[:, None], slot_ids(layout, forced, self.code_slot, window)], 1)
            x, Q = x[:, :longest], code_positions(layout, T, self.done - 1)
            lengths = verify_rows(layout, self.done, self.Ls)
            width = None if width is None else verify_width(layout, self.jacobi.window)
        pos, slots, visible = ragged(Q, lengths, x.shape[1], R, self.target.cache_len)
        for im in images:
            im.stats.target_forwards += 1
        rows = forward_rows_of(self.index, self.B, R)
        return target_forward(self.target, rows, in_rows(x, R), pos, slots, visible, width)

    def commit(self, images: list[Image], logits: Tensor, hidden: Tensor) -> None:
        """Step 3 for every active image on the device, then the one read of the iteration."""
        if self.layout is not None:  # each code's predicting row over the image head (the eol's after a row end)
            logits = code_logits(self.layout, logits, self.code_slot)
        W, N, S = self.jacobi.window, self.N, logits.shape[1]
        P = batch_probs(logits, self.params, self.done[:, None] + torch.arange(S, device=self.device))
        u = None if self.params.greedy else self.u[:, W:]
        a, token = accept_chains(P, self.qs[self.index, : S - 1], self.window[self.index, : S - 1], self.Ls, u,
                                 self.params, self.table, self.rule, tried_from=torch.zeros_like(self.Ls))
        cols = self.done[:, None] + torch.arange(S - 1, device=self.device)
        self.buf[self.index[:, None], cols] = self.window[self.index, : S - 1]
        self.buf[self.index, self.done + a] = token  # past the image's end when the window completed it: unread
        self.P[self.index, :S] = P
        for im, a_i, state in zip(images, a.tolist(), self.states):  # the iteration's one read
            im.stats.accepted_per_step.append(a_i)
            im.stats.tree_depth.append(im.L)
            done = im.n + a_i == N
            if u is not None:  # the generator advanced by the uniforms the image used
                im.generator.set_state(state)
                torch.rand(min(a_i + 1, im.L) + (not done), generator=im.generator, dtype=torch.float64,
                           device=im.generator.device)
            im.prev, im.a = im.n, a_i
            im.n = N if done else im.n + a_i + 1

    def finish(self, images: list[Image], timer: StepTimer) -> tuple[Tensor, list[ImageStats]]:
        return finish(self.target, images, timer, self.buf[:, : self.N])
