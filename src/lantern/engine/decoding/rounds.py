"""The batch machinery of speculative.decode (ragged rows, packing, the verify forward, prefill, the drafter's
catch-up) and the rounds of chain drafts (ChainRounds: chain.py's drafts for every image at once).

Every image keeps its own state (its tokens, the target position Q of its newest token y, the drafter's pending
catch-up inputs from drafter position `start`) and draws from its own generator (first token, drafts, acceptance
uniforms, correction or bonus token), so its tokens never depend on the batch.
Chain round over the active images:
1. draft (`chain_drafts`): ONE drafter forward catches every active image up (ragged lengths, padded to the
   longest), then drafter step i runs over the images that still want a draft i + 2 (an image near its end drafts
   fewer than gamma);
2. verify: ONE target forward over every active image's [y, drafts] (padded);
3. accept and commit: the target's distributions of every verified position at once, then every image's chain
   accepted at once with its own uniforms (chain.accept_chains); the image's next round reads from its own new Q.
Rows: image b owns cache rows b, and b + B under CFG ([cond_1..cond_B, uncond_1..uncond_B], as generate.generate).
A forward over a subset of the images passes their cache rows (GPT.forward_rows, Drafter.forward_rows), each row
with its own RoPE positions, cache slots and causal mask, laid out as [cond rows of the subset; uncond rows], so
image i of a subset of n reads its rows out[i::n]. Finished images drop out of every forward: their cache rows are
never read or written again, and the others never see them.
Padding: a padded query sits at RoPE position 0 and writes the scratch slot, one spare slot at the end of each cache
whose index lies past every real position, so no real query ever sees it: padding costs compute, never values.
Stats per image: target_forwards = 1 + the verify forwards the image took part in.
compile=True (`target_forward`): the verify forward runs through torch.compile with static shapes, gpt-fast style:
every image's rows (a finished image's rows all padding) at a fixed width, the drafting kind's node budget + 1, so
one graph per (model shape, cache rows, width) serves every round of every batch; the KV caches are kept between
batches (compiled.setup_static_cache) for CUDA graphs. A chain's drafting (`chain_drafts`: catch-up, drafter steps,
draws) compiles the same way, at the catch-up width gamma + 1. Eager: only the active rows, padded to the longest
sequence of the round.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from lantern.engine.decoding import compiled
from lantern.engine.rules.acceptance import AcceptRule
from lantern.engine.decoding.chain import accept_chains
from lantern.engine.models.drafter import Drafter
from lantern.engine.decoding.generate import cfg_rows
from lantern.engine.models.model import GPT, causal_mask
from lantern.engine.decoding.sampling import SamplingParams, Uniforms, next_tokens, row_probs
from lantern.engine.decoding.stats import ImageStats, StepTimer
from lantern.engine.decoding.trees import Draft

SCRATCH = 1  # spare cache slots past the real positions: where padded queries write


@dataclass
class Image:
    """One image's decoding state."""

    index: int  # b: its cache rows are b (and b + B under CFG)
    generator: torch.Generator
    tokens: list[int] | None  # its tokens so far (chains keep them on the device: ChainRounds.buf)
    Q: int  # target position of the newest token y
    start: int  # drafter position of the first pending catch-up input
    pend_emb: Tensor  # [R, S, d] drafter inputs at positions start.. start + S - 1
    pend_h: Tensor  # [R, S, d] the target's hidden states there
    stats: ImageStats
    draft: Draft | None = None  # this round's tree (tree_rounds.py)
    n: int = 1  # tokens decoded so far


def cache_rows(images: list, B: int, R: int, device) -> Tensor | None:
    """forward_rows_of for a list of images."""
    if len(images) == B:
        return None
    return forward_rows_of(torch.tensor([im.index for im in images], device=device), B, R)


def pack(parts: list[Tensor], S: int) -> Tensor:
    """Per-image [R, S_i, ...] -> [R * n, S, ...] in forward layout (image i at rows i, n + i), zero-padded to S."""
    padded = [F.pad(p, (0, 0) * (p.ndim - 2) + (0, S - p.shape[1])) for p in parts]
    return torch.stack(padded, 1).flatten(0, 1)


def in_rows(x: Tensor, R: int) -> Tensor:
    """x [n, ...] for each of R row groups, in forward layout [R * n, ...]: x.repeat(R, ...), but a view when n = 1
    (batch-1 latency, 11 of them in a chain round): on this project's CPU a repeat of a round's mask took 13 us, the
    view 4 us."""
    return x.expand(R, *x.shape).flatten(0, 1)


def ragged(starts: Tensor, lengths: Tensor, S: int, R: int, cache_len: int) -> tuple[Tensor, Tensor, Tensor]:
    """(pos, slots, visible) [R * n, S, ...] for n causal runs of `lengths` [n] positions from `starts` [n] (device
    tensors), padded to S >= the longest: real queries write their position's slot and see the slots up to it;
    padding writes the scratch slot."""
    j = torch.arange(S, device=starts.device)
    real = j < lengths[:, None]
    at = starts[:, None] + j
    pos = torch.where(real, at, 0)
    slots = torch.where(real, at, cache_len - 1)
    visible = (torch.arange(cache_len, device=starts.device) <= at[..., None]) & real[..., None]
    return in_rows(pos, R), in_rows(slots, R), in_rows(visible, R)


def to_device(device, *columns: list[int]) -> list[Tensor]:
    """Host integer lists as device tensors, in one copy (a round's host-side plan)."""
    flat = torch.tensor([v for c in columns for v in c], dtype=torch.long).to(device)
    return list(flat.split([len(c) for c in columns]))


def forward_rows_of(index: Tensor, B: int, R: int) -> Tensor | None:
    """The cache rows of the images `index` [n] (a device tensor) in forward layout [cond rows; uncond rows]; None
    when that is every row in order, which spares the models a copy of the cache rows."""
    return None if len(index) == B else torch.cat([index + r * B for r in range(R)])


def batch_probs(logits: Tensor, params: SamplingParams, index: Tensor) -> Tensor:
    """row_probs for n images at once: logits [R * n, S, V] in forward layout, index [n, S] the image-token index of
    each image's positions -> [n, S, V] (the very numbers row_probs gives image by image)."""
    R, V = logits.shape[0] // index.shape[0], logits.shape[-1]
    return row_probs(logits.reshape(R, -1, V), params, index.flatten()).view(*index.shape, V)


def verify_step(model: GPT, tokens: Tensor, pos: Tensor, slots: Tensor, visible: Tensor) -> tuple[Tensor, Tensor]:
    """The target's forward over every cache row at per-row positions: the static-shape step compile=True compiles."""
    return model.forward_rows(model.embed_tokens(tokens), pos, slots, visible)


def target_forward(target: GPT, rows: Tensor | None, tokens: Tensor, pos: Tensor, slots: Tensor, visible: Tensor,
                   width: int | None = None) -> tuple[Tensor, Tensor]:
    """The target's forward over the active images' cache rows `rows` (None: all; tokens, pos, slots [R * n, S],
    visible [R * n, S, L] in forward layout) -> (logits, hidden) [R * n, S, ...]. width None: eager, over those rows
    only. width W >= S: the compiled static-shape step over all cache rows and W positions; the other rows and
    positions are padding."""
    device = target.output.weight.device
    if width is None:
        return target.forward_rows(target.embed_tokens(tokens), pos, slots, visible, rows)
    S, L = tokens.shape[1], target.cache_len
    if S > width:
        raise ValueError(f"a verify pass of {S} positions exceeds the static width {width}")
    RB = target.cache_key_valid.shape[0]
    at = torch.arange(RB, device=device) if rows is None else rows
    full = lambda x, fill: x.new_full((RB, width, *x.shape[2:]), fill)  # noqa: E731
    t, p, s, v = full(tokens, 0), full(pos, 0), full(slots, L - 1), full(visible, False)
    t[at, :S], p[at, :S], s[at, :S], v[at, :S] = tokens, pos, slots, visible
    logits, hidden = compiled.compiled_step(verify_step, device)(target, t, p, s, v)
    return logits[at, :S], hidden[at, :S]


def prefill_rows(target: GPT, cond: Tensor, params: SamplingParams, timer: StepTimer, cond_mask: Tensor | None,
                 target_extra: int, static: bool):
    """The target's cache set up for the CFG rows of `cond` (cfg_rows; `target_extra` spare slots, then the scratch
    slot; static: the cache kept between calls for compiled steps, compiled.setup_static_cache), the target run over
    the condition positions (the padded caption rows' states follow target.pad_semantics), and each image's
    first-token distribution. Returns (the first-token distributions
    [B, V], condition embeddings, their hidden states, the rows' mask)."""
    device = target.output.weight.device
    B, T = cond.shape[0], target.args.cls_token_num
    rows, rows_mask = cfg_rows(target, cond, params, cond_mask)
    with timer.section("other"):
        if static:
            compiled.setup_static_cache(target, rows.shape[0], extra=target_extra + SCRATCH)
        else:
            target.setup_cache(rows.shape[0], extra=target_extra + SCRATCH)
    with timer.section("verify"):
        if rows_mask is not None:
            target.set_cond_mask(rows_mask)
        cond_emb = target.embed_cond(rows)
        logits, hidden = target.prefill_cond(cond_emb, rows_mask)
    with timer.section("other"):
        p0 = batch_probs(logits[:, -1:], params, torch.zeros(B, 1, dtype=torch.long, device=device))[:, 0]
    return p0, cond_emb, hidden, rows_mask


class DrafterRounds:
    """What the rounds of chains and trees share: the prefill of both models, the catch-up, the end."""

    def __init__(self, target: GPT, drafter: Drafter, drafting, params: SamplingParams, rule: AcceptRule,
                 table: Tensor | None, B: int):
        self.target, self.drafter, self.drafting, self.params, self.rule, self.table = (target, drafter, drafting,
                                                                                        params, rule, table)
        self.B, self.N, self.device = B, target.args.image_tokens, target.output.weight.device

    def prefill(self, cond: Tensor, generators: list[torch.Generator], timer: StepTimer, cond_mask: Tensor | None,
                static: bool) -> list[Image]:
        """Both caches set up (`*_extra` slots for tree nodes, then the scratch slot), one target forward over
        every condition row, each image's first token drawn with its own generator (self.first [B], on the
        device)."""
        target, drafter, B, T = self.target, self.drafter, self.B, self.target.args.cls_token_num
        p0, cond_emb, hidden, rows_mask = prefill_rows(target, cond, self.params, timer, cond_mask,
                                                       self.drafting.target_extra, static)
        images, R = [], cond_emb.shape[0] // B
        with timer.section("other"):
            extra = self.drafting.drafter_extra + SCRATCH
            if static:
                compiled.setup_static_cache(drafter, cond_emb.shape[0], extra=extra, cond_mask=rows_mask)
            else:
                drafter.setup_cache(cond_emb.shape[0], extra=extra, cond_mask=rows_mask)
            self.first = first_tokens(p0, self.params, generators)
            first_emb = drafter.embed_tokens(self.first)
            for b, g in enumerate(generators):
                mine = slice(b, None, B)  # rows b (and B + b)
                pend_emb = torch.cat([drafter.cond_inputs(cond_emb[mine]), first_emb[b].expand(R, 1, -1)], 1)
                images.append(Image(b, g, None, T, 0, pend_emb, hidden[mine],
                                    ImageStats(n_tokens=self.N, target_forwards=1)))
        return images

    def catch_up(self, images: list[Image], rows: Tensor | None, starts: Tensor | None = None,
                 lengths: Tensor | None = None) -> Tensor:
        """The drafter's catch-up of every active image in one forward (ragged, over the cache rows `rows`; starts
        and lengths [n] on the device, else sent): the predicted h_Q of each image, [R, n, d]."""
        n, R = len(images), images[0].pend_emb.shape[0]
        S = max(im.pend_emb.shape[1] for im in images)
        if starts is None:
            starts, lengths = to_device(self.device, [im.start for im in images],
                                        [im.pend_emb.shape[1] for im in images])
        pos, slots, visible = ragged(starts, lengths, S, R, self.drafter.cache_len)
        out = self.drafter.forward_rows(pack([im.pend_emb for im in images], S),
                                        pack([im.pend_h for im in images], S), pos, slots, visible, rows)
        for im in images:
            im.stats.drafter_forwards += 1
        return out.view(R, n, S, -1)[:, torch.arange(n, device=self.device), lengths - 1]

    def finish(self, images: list[Image], timer: StepTimer) -> tuple[Tensor, list[ImageStats]]:
        self.drafter.clear_cache()
        return finish(self.target, images, timer)


def first_tokens(p0: Tensor, params: SamplingParams, generators: list[torch.Generator]) -> Tensor:
    """Each image's first token [B] from the prefill's distributions p0 [B, V], drawn on the device with one uniform
    from its generator."""
    return next_tokens(p0, params, None if params.greedy else Uniforms(generators, 1, p0.device).u[:, 0])


def chain_drafts(drafter: Drafter, emb: Tensor, hidden: Tensor, pos: Tensor, slots: Tensor, visible: Tensor,
                 rows: Tensor | None, last: Tensor, Q: Tensor, done: Tensor, gs: Tensor, u: Tensor | None,
                 params: SamplingParams, G: int) -> tuple[Tensor, Tensor]:
    """G chain drafts for n images, the drafting of a chain round in one function, eager or compiled with static
    shapes (gpt-fast style, as verify_step): the drafter's catch-up over each image's pending inputs (emb, hidden,
    pos, slots [R * n, S, ...], visible [R * n, S, L] in forward layout over the cache rows `rows`, None: all),
    whose predicted state at each image's last input (`last` [n]) gives q_1 and x_1; then drafter step i feeds x_i
    at target position Q + i (Q [n]: each image's newest token) for the images that want a draft i + 2 (gs [n]:
    drafts wanted; the others' queries are padding). q_i are CFG-mixed and filtered at image-token index done + i;
    x_i drawn with the image's uniform u[:, i] (None: greedy argmax). Returns (X [n, G], q [n, G, V])."""
    n, L, device = last.shape[0], drafter.cache_len, emb.device
    R = emb.shape[0] // n
    out = drafter.forward_rows(emb, hidden, pos, slots, visible, rows)
    pred = out.view(R, n, out.shape[1], -1)[:, torch.arange(n, device=device), last]  # [R, n, d]
    xs, qs = [], []
    for i in range(G):
        q = batch_probs(drafter.head(pred.reshape(R * n, 1, -1)), params, (done + i)[:, None])[:, 0]
        xs.append(next_tokens(q, params, None if u is None else u[:, i]))
        qs.append(q)
        if i == G - 1:
            break
        real = (i < gs - 1)[:, None]
        at = (Q + i)[:, None]
        step_pos, step_slots = torch.where(real, at, 0), torch.where(real, at, L - 1)
        step_visible = (torch.arange(L, device=device) <= at[..., None]) & real[..., None]
        pred = drafter.forward_rows(in_rows(drafter.embed_tokens(xs[-1]), R)[:, None], pred.reshape(R * n, 1, -1),
                                    in_rows(step_pos, R), in_rows(step_slots, R), in_rows(step_visible, R),
                                    rows).view(R, n, -1)
    return torch.stack(xs, 1), torch.stack(qs, 1)


class ChainRounds(DrafterRounds):
    """Rounds of gamma chain drafts (chain.py) for a batch, three host syncs per round: the round's host integers
    go to the device in one copy, the images' uniforms (2 gamma + 1 each, drawn ahead: drafts, tried drafts, the
    next token; each generator then advances by what it used) in another; drafts, acceptance and next tokens are
    drawn on the device (chain.accept_chains) into a token buffer (self.buf), and one read per round, the accepted
    lengths, tells the host where every image stands."""

    def prefill(self, cond: Tensor, generators: list[torch.Generator], timer: StepTimer, cond_mask: Tensor | None,
                static: bool) -> list[Image]:
        images = super().prefill(cond, generators, timer, cond_mask, static)
        self.images, self.static = images, static
        self.buf = torch.zeros(self.B, self.N + self.drafting.gamma + 1, dtype=torch.long, device=self.device)
        self.buf[:, 0] = self.first
        return images

    def draft(self, images: list[Image]) -> None:
        """One batched catch-up, then the drafter steps (chain_drafts) over the active images (an image with fewer
        drafts left takes part as padding); compiled (self.static): over every image's rows at fixed shapes.
        Sets self.X [n, G] (drafts), self.q [n, G, V] (their distributions)."""
        params, device, gamma, T = self.params, self.device, self.drafting.gamma, self.target.args.cls_token_num
        R = images[0].pend_emb.shape[0]
        self.g = [min(gamma, self.N - im.n) for im in images]
        # the drafting plan of every image in the pass: the active ones, or (static) all of them, finished ones as
        # padding (no catch-up inputs, no drafts wanted)
        plan = self.images if self.static else images
        active = {im.index for im in images}
        wanted = dict(zip((im.index for im in images), self.g))
        lengths = [im.pend_emb.shape[1] if im.index in active else 0 for im in plan]
        self.index, done, starts, pending, gs = to_device(
            device, [im.index for im in images], [im.n for im in plan], [im.start for im in plan], lengths,
            [wanted.get(im.index, 0) for im in plan])
        # the active images' rows of the plan (static: the plan is every image, in index order)
        self.done, self.gs = (done[self.index], gs[self.index]) if self.static else (done, gs)
        self.uniforms = None if params.greedy else Uniforms([im.generator for im in images], 2 * gamma + 1, device)
        u = None if params.greedy else self.uniforms.u
        self.rows = forward_rows_of(self.index, self.B, R)
        S = max(lengths)
        if self.static:  # one graph per catch-up width: gamma + 1, and the first round's condition length if longer
            S = max(S, gamma + 1)
            if u is not None:
                u = u.new_zeros(self.B, u.shape[1]).index_copy_(0, self.index, u)
        emb = pack([im.pend_emb[:, : n] for im, n in zip(plan, lengths)], S)
        hidden = pack([im.pend_h[:, : n] for im, n in zip(plan, lengths)], S)
        pos, slots, visible = ragged(starts, pending, S, R, self.drafter.cache_len)
        step = compiled.compiled_step(chain_drafts, device) if self.static else chain_drafts
        X, q = step(self.drafter, emb, hidden, pos, slots, visible, None if self.static else self.rows,
                    (pending - 1).clamp(min=0), T + done - 1, done, gs, u, params, gamma if self.static else max(self.g))
        if self.static:
            X, q = X[self.index], q[self.index]
        for im, g in zip(images, self.g):
            im.stats.drafter_forwards += g  # the catch-up, then g - 1 steps
        self.X, self.q = X, q

    def verify(self, images: list[Image], width: int | None) -> tuple[Tensor, Tensor]:
        """One target forward over every active image's [y, drafts]: (logits, hidden) [R * n, 1 + G, ...] (width:
        target_forward's static shape)."""
        R = images[0].pend_emb.shape[0]
        seq = torch.cat([self.buf[self.index, self.done - 1][:, None], self.X], 1)
        Q = self.target.args.cls_token_num + self.done - 1
        pos, slots, visible = ragged(Q, self.gs + 1, seq.shape[1], R, self.target.cache_len)
        for im in images:
            im.stats.target_forwards += 1
        return target_forward(self.target, self.rows, in_rows(seq, R), pos, slots, visible, width)

    def commit(self, images: list[Image], logits: Tensor, hidden: Tensor) -> None:
        """Acceptance and the next token of every active image on the device, then the one read of the round."""
        n, R, T, N = len(images), images[0].pend_emb.shape[0], self.target.args.cls_token_num, self.N
        index = self.done[:, None] + torch.arange(logits.shape[1], device=self.device)
        P = batch_probs(logits, self.params, index)
        u = None if self.uniforms is None else self.uniforms.u
        a, token = accept_chains(P, self.q, self.X, self.gs, u, self.params, self.table, self.rule)
        self.buf[self.index[:, None], self.done[:, None] + torch.arange(self.X.shape[1], device=self.device)] = self.X
        self.buf[self.index, self.done + a] = token  # past the image's end when the drafts completed it: unread
        used = []
        for i, (im, a_i, g) in enumerate(zip(images, a.tolist(), self.g)):  # the round's one read
            im.stats.accepted_per_step.append(a_i)
            im.stats.tree_depth.append(g)
            done = im.n + a_i == N  # the drafts completed the image: no bonus token past its end
            used.append(g + min(a_i + 1, g) + (not done))
            if done:
                im.n = N
                continue
            im.pend_emb = self.drafter.embed_tokens(self.buf[im.index, im.n : im.n + a_i + 1]).expand(R, -1, -1)
            im.pend_h = hidden[i::n, : a_i + 1]
            im.start = T + im.n - 1
            im.n += a_i + 1
        if self.uniforms is not None:
            self.uniforms.used(used)

    def finish(self, images: list[Image], timer: StepTimer) -> tuple[Tensor, list[ImageStats]]:
        self.drafter.clear_cache()
        return finish(self.target, images, timer, self.buf[:, : self.N])


def finish(target: GPT, images: list, timer: StepTimer,
           tokens: Tensor | None = None) -> tuple[Tensor, list[ImageStats]]:
    """The target's cache freed; (tokens [B, N] (given, or the images' lists), stats per image with the batch's
    section times / B)."""
    target.clear_cache()
    B, stats = len(images), []
    for im in images:
        s = im.stats.finish(timer)
        s.time_draft_s, s.time_verify_s, s.time_other_s = s.time_draft_s / B, s.time_verify_s / B, s.time_other_s / B
        s.batch_size = B
        stats.append(s)
    if tokens is None:
        tokens = torch.tensor([im.tokens for im in images], device=target.output.weight.device)
    return tokens, stats
