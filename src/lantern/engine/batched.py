"""The batch machinery of speculative.decode (ragged rows, packing, the verify forward, prefill, the drafter's
catch-up) and the rounds of chain drafts (ChainRounds: chain.py's drafts for every image at once).

Every image keeps its own state (its tokens, the target position Q of its newest token y, the drafter's pending
catch-up inputs from drafter position `start`) and draws from its own generator (first token, drafts, acceptance
uniforms, correction or bonus token), so its tokens never depend on the batch.
Chain round over the active images:
1. draft: ONE drafter forward catches every active image up (ragged lengths, padded to the longest), then drafter
   step i runs over the images that still want a draft i + 2 (an image near its end drafts fewer than gamma);
2. verify: ONE target forward over every active image's [y, drafts] (padded);
3. accept and commit: the target's distributions of every verified position at once, then per image verify_chain
   with the image's generator; the image's next round reads from its own new Q.
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
one graph per (model shape, cache rows, width) serves every round of every batch; the KV cache is kept between
batches (compiled.setup_static_cache) for CUDA graphs. Eager: only the active rows, padded to the longest sequence
of the round.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from lantern.engine import compiled
from lantern.engine.acceptance import AcceptRule
from lantern.engine.chain import ChainDraft, verify_chain
from lantern.engine.drafter import Drafter
from lantern.engine.generate import cfg_rows
from lantern.engine.model import GPT, causal_mask
from lantern.engine.sampling import SamplingParams, pick, row_probs
from lantern.engine.stats import ImageStats, StepTimer
from lantern.engine.trees import Draft

SCRATCH = 1  # spare cache slots past the real positions: where padded queries write


@dataclass
class Image:
    """One image's decoding state."""

    index: int  # b: its cache rows are b (and b + B under CFG)
    generator: torch.Generator
    tokens: list[int]
    Q: int  # target position of the newest token y
    start: int  # drafter position of the first pending catch-up input
    pend_emb: Tensor  # [R, S, d] drafter inputs at positions start.. start + S - 1
    pend_h: Tensor  # [R, S, d] the target's hidden states there
    stats: ImageStats
    draft: ChainDraft | Draft | None = None  # this round's drafts (a chain's, or a tree's: batched_trees.py)


def cache_rows(images: list[Image], B: int, R: int, device) -> Tensor | None:
    """The cache rows of `images` in forward layout [cond rows; uncond rows]; None when that is every row in order
    (every image still active), which spares the models a copy of the cache rows."""
    if len(images) == B:
        return None
    idx = torch.tensor([im.index for im in images], device=device)
    return torch.cat([idx + r * B for r in range(R)])


def pack(parts: list[Tensor], S: int) -> Tensor:
    """Per-image [R, S_i, ...] -> [R * n, S, ...] in forward layout (image i at rows i, n + i), zero-padded to S."""
    padded = [F.pad(p, (0, 0) * (p.ndim - 2) + (0, S - p.shape[1])) for p in parts]
    return torch.stack(padded, 1).flatten(0, 1)


def ragged(starts: list[int], lengths: list[int], R: int, cache_len: int, device) -> tuple[Tensor, Tensor, Tensor]:
    """(pos, slots, visible) [R * n, S, ...] for n causal runs of `lengths` positions from `starts`, padded to the
    longest: real queries write their position's slot and see the slots up to it; padding writes the scratch slot."""
    S = max(lengths)
    j = torch.arange(S, device=device)
    real = j < torch.tensor(lengths, device=device)[:, None]
    at = torch.tensor(starts, device=device)[:, None] + j
    pos = torch.where(real, at, 0)
    slots = torch.where(real, at, cache_len - 1)
    visible = (torch.arange(cache_len, device=device) <= at[..., None]) & real[..., None]
    return pos.repeat(R, 1), slots.repeat(R, 1), visible.repeat(R, 1, 1)


def batch_probs(logits: Tensor, params: SamplingParams, index: Tensor) -> Tensor:
    """row_probs for n images at once: logits [R * n, S, V] in forward layout, index [n, S] the image-token index of
    each image's positions -> [n, S, V] (the very numbers row_probs gives image by image)."""
    R, V = logits.shape[0] // index.shape[0], logits.shape[-1]
    return row_probs(logits.reshape(R, -1, V), params, index.flatten()).view(*index.shape, V)


def verify_step(model: GPT, tokens: Tensor, pos: Tensor, slots: Tensor, visible: Tensor) -> tuple[Tensor, Tensor]:
    """The target's forward over every cache row at per-row positions: the static-shape step compile=True compiles."""
    return model.forward_rows(model.embed_tokens(tokens), pos, slots, visible)


def target_forward(target: GPT, images: list, B: int, tokens: Tensor, pos: Tensor, slots: Tensor, visible: Tensor,
                   width: int | None = None) -> tuple[Tensor, Tensor]:
    """The target's forward over the active images' rows (tokens, pos, slots [R * n, S], visible [R * n, S, L] in
    forward layout) -> (logits, hidden) [R * n, S, ...]. width None: eager, over those rows only. width W >= S: the
    compiled static-shape step over all R * B rows and W positions; the other rows and positions are padding."""
    device = target.output.weight.device
    R = tokens.shape[0] // len(images)
    rows = cache_rows(images, B, R, device)
    if width is None:
        return target.forward_rows(target.embed_tokens(tokens), pos, slots, visible, rows)
    S, L = tokens.shape[1], target.cache_len
    if S > width:
        raise ValueError(f"a verify pass of {S} positions exceeds the static width {width}")
    at = torch.arange(R * B, device=device) if rows is None else rows
    full = lambda x, fill: x.new_full((R * B, width, *x.shape[2:]), fill)  # noqa: E731
    t, p, s, v = full(tokens, 0), full(pos, 0), full(slots, L - 1), full(visible, False)
    t[at, :S], p[at, :S], s[at, :S], v[at, :S] = tokens, pos, slots, visible
    logits, hidden = compiled.compiled_step(verify_step, device)(target, t, p, s, v)
    return logits[at, :S], hidden[at, :S]


def prefill_rows(target: GPT, cond: Tensor, params: SamplingParams, timer: StepTimer, cond_mask: Tensor | None,
                 target_extra: int, static: bool):
    """The target's cache set up for the CFG rows of `cond` (cfg_rows; `target_extra` spare slots, then the scratch
    slot; static: the cache kept between calls for compiled steps, compiled.setup_static_cache), the target run over
    the condition positions, and each image's first-token distribution. Returns (the first-token distributions
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
        pos = torch.arange(T, device=device)
        cond_emb = target.embed_cond(rows)
        logits, hidden = target.forward_cached(cond_emb, pos, pos, causal_mask(T, target.cache_len, device))
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
        every condition row, each image's first token drawn with its own generator."""
        target, drafter, B, T = self.target, self.drafter, self.B, self.target.args.cls_token_num
        p0, cond_emb, hidden, rows_mask = prefill_rows(target, cond, self.params, timer, cond_mask,
                                                       self.drafting.target_extra, static)
        images, R = [], cond_emb.shape[0] // B
        with timer.section("other"):
            drafter.setup_cache(cond_emb.shape[0], extra=self.drafting.drafter_extra + SCRATCH, cond_mask=rows_mask)
            for b, g in enumerate(generators):
                mine = slice(b, None, B)  # rows b (and B + b)
                first = pick(p0[b], self.params, g)
                first_emb = drafter.embed_tokens(torch.tensor([first] * R, device=self.device))[:, None]
                pend_emb = torch.cat([drafter.cond_inputs(cond_emb[mine]), first_emb], 1)
                images.append(Image(b, g, [first], T, 0, pend_emb, hidden[mine],
                                    ImageStats(n_tokens=self.N, target_forwards=1)))
        return images

    def catch_up(self, images: list[Image]) -> list[Tensor]:
        """The drafter's catch-up of every active image in one forward (ragged): each image's predicted h_Q
        [R, 1, d]."""
        n, R = len(images), images[0].pend_emb.shape[0]
        lengths = [im.pend_emb.shape[1] for im in images]
        S = max(lengths)
        pos, slots, visible = ragged([im.start for im in images], lengths, R, self.drafter.cache_len, self.device)
        out = self.drafter.forward_rows(pack([im.pend_emb for im in images], S),
                                        pack([im.pend_h for im in images], S), pos, slots, visible,
                                        cache_rows(images, self.B, R, self.device))
        for im in images:
            im.stats.drafter_forwards += 1
        return [out[i::n, L - 1 : L] for i, L in enumerate(lengths)]

    def finish(self, images: list[Image], timer: StepTimer) -> tuple[Tensor, list[ImageStats]]:
        self.drafter.clear_cache()
        return finish(self.target, images, timer)


class ChainRounds(DrafterRounds):
    """Rounds of gamma chain drafts (chain.py) for a batch."""

    def draft(self, images: list[Image]) -> None:
        """Chain drafts for every active image: one batched catch-up, then batched drafter steps over the images
        that still draft. Sets each image's `draft`."""
        drafter, params, device = self.drafter, self.params, self.device
        n, R = len(images), images[0].pend_emb.shape[0]
        preds = self.catch_up(images)
        gammas = [min(self.drafting.gamma, self.N - len(im.tokens)) for im in images]
        for im in images:
            im.draft = ChainDraft([], [])
        for step in range(max(gammas)):
            drawing = [i for i in range(n) if step < gammas[i]]
            index = torch.tensor([[len(images[i].tokens) + step] for i in drawing], device=device)
            qs = batch_probs(drafter.head(pack([preds[i] for i in drawing], 1)), params, index)
            for i, q in zip(drawing, qs[:, 0]):
                im = images[i]
                im.draft.tokens.append(pick(q, params, im.generator))
                im.draft.q.append(q)
            going = [i for i in drawing if step < gammas[i] - 1]
            if not going:
                break
            sub = [images[i] for i in going]
            x = torch.tensor([im.draft.tokens[-1] for im in sub] * R, device=device)
            pos, slots, visible = ragged([im.Q + step for im in sub], [1] * len(sub), R, drafter.cache_len, device)
            out = drafter.forward_rows(drafter.embed_tokens(x)[:, None], pack([preds[i] for i in going], 1), pos,
                                       slots, visible, cache_rows(sub, self.B, R, device))
            for j, i in enumerate(going):
                preds[i] = out[j :: len(going)]
                images[i].stats.drafter_forwards += 1

    def verify(self, images: list[Image], width: int | None) -> tuple[Tensor, Tensor]:
        """One target forward over every active image's [y, drafts]: (logits, hidden) [R * n, 1 + longest draft,
        ...] (width: target_forward's static shape)."""
        target, device = self.target, self.device
        R = images[0].pend_emb.shape[0]
        seqs = [[im.tokens[-1]] + im.draft.tokens for im in images]
        lengths = [len(s) for s in seqs]
        tokens = pack([torch.tensor(s, device=device).expand(R, -1)[..., None] for s in seqs], max(lengths))[..., 0]
        pos, slots, visible = ragged([im.Q for im in images], lengths, R, target.cache_len, device)
        for im in images:
            im.stats.target_forwards += 1
        return target_forward(target, images, self.B, tokens, pos, slots, visible, width)

    def commit(self, images: list[Image], logits: Tensor, hidden: Tensor) -> None:
        """verify_chain and the commit for every active image."""
        device, params, N = self.device, self.params, self.N
        index = torch.tensor([len(im.tokens) for im in images], device=device)[:, None] + torch.arange(
            logits.shape[1], device=device)
        P = batch_probs(logits, params, index)
        for i, im in enumerate(images):
            g, h = len(im.draft.tokens), hidden[i :: len(images)]
            a, p = verify_chain(P[i, : g + 1], im.draft.q, im.draft.tokens, params, self.table, self.rule,
                                im.generator)
            im.tokens += im.draft.tokens[:a]
            im.stats.accepted_per_step.append(a)
            im.stats.tree_depth.append(im.draft.max_depth)
            if len(im.tokens) == N:  # the drafts completed the image: a bonus token would lie past its end
                continue
            im.tokens.append(pick(p, params, im.generator))
            im.pend_emb = self.drafter.embed_tokens(torch.tensor(im.tokens[-a - 1 :], device=device).expand(h.shape[0], -1))
            im.pend_h = h[:, : a + 1]
            im.start, im.Q = im.Q, im.Q + a + 1


def finish(target: GPT, images: list, timer: StepTimer) -> tuple[Tensor, list[ImageStats]]:
    """The target's cache freed; (tokens [B, N], stats per image with the batch's section times / B)."""
    target.clear_cache()
    B, stats = len(images), []
    for im in images:
        s = im.stats.finish(timer)
        s.time_draft_s, s.time_verify_s, s.time_other_s = s.time_draft_s / B, s.time_verify_s / B, s.time_other_s / B
        s.batch_size = B
        stats.append(s)
    return torch.tensor([im.tokens for im in images], device=target.output.weight.device), stats
