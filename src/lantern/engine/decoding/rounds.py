"""The batch machinery of speculative.decode (ragged rows, packing, the verify forward, prefill, the drafter's
catch-up) that every drafting kind's rounds share (chain_rounds.py, tree_rounds.py, jacobi.py).

Every image keeps its own state (its tokens, the target position Q of its newest token y, the drafter's pending
catch-up inputs from drafter position `start`) and draws from its own generator (first token, drafts, acceptance
uniforms, correction or bonus token), so its tokens never depend on the batch.
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
batches (compiled.setup_static_cache) for CUDA graphs. Eager: only the active rows, padded to the longest
sequence of the round.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from lantern.engine.decoding import compiled
from lantern.engine.rules.acceptance import AcceptRule
from lantern.engine.models.drafter import Drafter
from lantern.engine.decoding.generate import cfg_rows
from lantern.engine.models.layout import Layout, image_logits
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
                 target_extra: int, static: bool, layout: Layout | None = None):
    """The target's cache set up for the CFG rows of `cond` (cfg_rows; `target_extra` spare slots, then the scratch
    slot; static: the cache kept between calls for compiled steps, compiled.setup_static_cache), the target run over
    the condition positions (the padded caption rows' states follow target.pad_semantics), and each image's
    first-token distribution (over the image head with a layout: its first code's). Returns (the first-token
    distributions
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
        last = logits[:, -1:] if layout is None else image_logits(layout, logits[:, -1:])
        p0 = batch_probs(last, params, torch.zeros(B, 1, dtype=torch.long, device=device))[:, 0]
    return p0, cond_emb, hidden, rows_mask


class DrafterRounds:
    """What the rounds of chains and trees share: the prefill of both models, the catch-up, the end. `layout`
    (set by kinds.rounds_for): the target's sequence carries forced tokens (forced.py)."""

    layout: Layout | None = None

    def __init__(self, target: GPT, drafter: Drafter, drafting, params: SamplingParams, rule: AcceptRule,
                 table: Tensor | None, B: int):
        self.target, self.drafter, self.drafting, self.params, self.rule, self.table = (target, drafter, drafting,
                                                                                        params, rule, table)
        self.B, self.N, self.device = B, target.args.image_tokens, target.output.weight.device

    def use_layout(self, layout: Layout) -> None:
        """Decode a layout's codes (N = layout.codes), its forced tokens spliced in (forced.py)."""
        self.layout, self.N = layout, layout.codes

    def cache_extras(self) -> tuple[int, int]:
        """The (target, drafter) cache slots past the sequence that a round writes: the drafting kind's."""
        return self.drafting.target_extra, self.drafting.drafter_extra

    def prefill(self, cond: Tensor, generators: list[torch.Generator], timer: StepTimer, cond_mask: Tensor | None,
                static: bool) -> list[Image]:
        """Both caches set up (`*_extra` slots for tree nodes, then the scratch slot), one target forward over
        every condition row, each image's first token drawn with its own generator (self.first [B], on the
        device)."""
        target, drafter, B, T = self.target, self.drafter, self.B, self.target.args.cls_token_num
        target_extra, drafter_extra = self.cache_extras()
        p0, cond_emb, hidden, rows_mask = prefill_rows(target, cond, self.params, timer, cond_mask, target_extra,
                                                       static, self.layout)
        images, R = [], cond_emb.shape[0] // B
        with timer.section("other"):
            extra = drafter_extra + SCRATCH
            if static:
                compiled.setup_static_cache(drafter, cond_emb.shape[0], extra=extra, cond_mask=rows_mask)
            else:
                drafter.setup_cache(cond_emb.shape[0], extra=extra, cond_mask=rows_mask)
            self.first = first_tokens(p0, self.params, generators)
            first_emb = drafter.embed_tokens(self.first if self.layout is None else self.first + self.layout.code_offset)
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
