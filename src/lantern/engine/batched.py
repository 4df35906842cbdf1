"""Batched chain speculative decoding: B images advance together, each at its own pace (ragged acceptance).
Draft trees (static, dynamic) take the same loop with tree rounds in batched_trees.py, built on this module's
pieces (prefill, catch_up, finish); the registry routes each drafting kind to its batched decoder.

Every image keeps exactly the state `speculative.speculative_decode` keeps for it alone (its tokens, the target
position Q of its newest token y, the drafter's pending catch-up inputs from drafter position `start`) and draws
from its own generator in the same order (first token, drafts, acceptance uniforms, correction or bonus token), so
its tokens never depend on the batch: batched and one-by-one decoding agree token for token (up to the rounding
of batched matmuls; exactly so in the float64 tests).

One round over the images still decoding (the active ones):
1. draft: ONE drafter forward catches every active image up (ragged lengths, padded to the longest), then drafter
   step i runs over the images that still want a draft i + 2 (an image near its end drafts fewer than gamma);
2. verify: ONE target forward over every active image's [y, drafts] (padded);
3. accept and commit: the target's distributions of every verified position at once, then per image what
   `Chain.accept` does (verify_chain with the image's generator) and the commit of speculative_decode; the image's
   next round reads from its own new Q.
Rows: image b owns cache rows b, and b + B under CFG ([cond_1..cond_B, uncond_1..uncond_B], as generate.generate).
A forward over a subset of the images passes their cache rows (GPT.forward_rows, Drafter.forward_rows), each row
with its own RoPE positions, cache slots and causal mask, laid out as [cond rows of the subset; uncond rows], so
image i of a subset of n reads its rows out[i::n]. Finished images drop out of every forward: their cache rows are
never read or written again, and the others never see them.
Padding: a padded query sits at RoPE position 0 and writes the scratch slot, one spare slot at the end of each cache
whose index lies past every real position, so no real query ever sees it: padding costs compute, never values.
Stats per image as speculative_decode's (target_forwards: 1 + the verify forwards the image took part in); times
are the batch's wall time per section / B, as generate.generate's.
compile=True (every batched decoder, `target_forward`): the verify forward runs through torch.compile with static
shapes, gpt-fast style: every image's rows (a finished image's rows all padding) at a fixed width, the drafting
kind's node budget + 1, so one graph per (model shape, cache rows, width) serves every round of every batch; the
KV cache is kept between batches (compiled.setup_static_cache) for CUDA graphs. Eager: only the active rows, padded
to the longest sequence of the round.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from lantern.engine import compiled
from lantern.engine.acceptance import AcceptRule
from lantern.engine.chain import Chain, ChainDraft, verify_chain
from lantern.engine.drafter import Drafter
from lantern.engine.model import GPT
from lantern.engine.sampling import SamplingParams, pick, row_probs
from lantern.engine.speculative import check_one_image, prefill_rows
from lantern.engine.stats import ImageStats, StepTimer, reset_peak_memory
from lantern.engine.trees import Draft

SCRATCH = 1  # spare cache slots past the real positions: where padded queries write


@dataclass
class Image:
    """One image's decoding state (speculative_decode's locals for it)."""

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


def prefill(target: GPT, drafter: Drafter, cond: Tensor, params: SamplingParams, generators: list[torch.Generator],
            timer: StepTimer, cond_mask: Tensor | None, target_extra: int = 0, drafter_extra: int = 0,
            static: bool = False) -> list[Image]:
    """speculative_prefill for the whole batch: both caches set up (`*_extra` slots for tree nodes, then the
    scratch slot; static: the kept cache of compiled.setup_static_cache), one target forward over every condition
    row, each image's first token drawn with its own generator."""
    B, N, T = cond.shape[0], target.args.image_tokens, target.args.cls_token_num
    device = target.output.weight.device
    logits, cond_emb, hidden, rows_mask = prefill_rows(target, cond, params, timer, cond_mask, target_extra + SCRATCH,
                                                       static)
    images, R = [], cond_emb.shape[0] // B
    with timer.section("other"):
        drafter.setup_cache(cond_emb.shape[0], extra=drafter_extra + SCRATCH, cond_mask=rows_mask)
        p0 = batch_probs(logits[:, -1:], params, torch.zeros(B, 1, dtype=torch.long, device=device))
        for b, g in enumerate(generators):
            mine = slice(b, None, B)  # rows b (and B + b)
            first = pick(p0[b, 0], params, g)
            first_emb = drafter.embed_tokens(torch.tensor([first] * R, device=device))[:, None]
            pend_emb = torch.cat([drafter.cond_inputs(cond_emb[mine]), first_emb], 1)
            images.append(Image(b, g, [first], T, 0, pend_emb, hidden[mine], ImageStats(n_tokens=N, target_forwards=1)))
    return images


def catch_up(drafter: Drafter, images: list[Image], B: int) -> list[Tensor]:
    """The drafter's catch-up of every active image in one forward (ragged): each image's predicted h_Q [R, 1, d]."""
    device = drafter.fc.weight.device
    n, R = len(images), images[0].pend_emb.shape[0]
    lengths = [im.pend_emb.shape[1] for im in images]
    S = max(lengths)
    pos, slots, visible = ragged([im.start for im in images], lengths, R, drafter.cache_len, device)
    out = drafter.forward_rows(pack([im.pend_emb for im in images], S), pack([im.pend_h for im in images], S),
                               pos, slots, visible, cache_rows(images, B, R, device))
    return [out[i::n, L - 1 : L] for i, L in enumerate(lengths)]


def draft(drafter: Drafter, images: list[Image], chain: Chain, params: SamplingParams, B: int, N: int) -> None:
    """Chain.draft for every active image: one batched catch-up, then batched drafter steps over the images that
    still draft. Sets each image's `draft`."""
    device = drafter.fc.weight.device
    n, R = len(images), images[0].pend_emb.shape[0]
    preds = catch_up(drafter, images, B)
    gammas = [min(chain.gamma, N - len(im.tokens)) for im in images]
    for im in images:
        im.draft = ChainDraft([], [], R)
        im.stats.drafter_forwards += 1
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
        out = drafter.forward_rows(drafter.embed_tokens(x)[:, None], pack([preds[i] for i in going], 1), pos, slots,
                                   visible, cache_rows(sub, B, R, device))
        for j, i in enumerate(going):
            preds[i] = out[j :: len(going)]
            images[i].stats.drafter_forwards += 1


def verify(target: GPT, images: list[Image], B: int, width: int | None = None) -> tuple[Tensor, Tensor]:
    """Chain.verify for every active image in one forward: (logits, hidden) [R * n, 1 + longest draft, ...]
    (width: target_forward's static shape)."""
    device = target.output.weight.device
    R = images[0].pend_emb.shape[0]
    seqs = [[im.tokens[-1]] + im.draft.tokens for im in images]
    lengths = [len(s) for s in seqs]
    tokens = pack([torch.tensor(s, device=device).expand(R, -1)[..., None] for s in seqs], max(lengths))[..., 0]
    pos, slots, visible = ragged([im.Q for im in images], lengths, R, target.cache_len, device)
    for im in images:
        im.stats.target_forwards += 1
    return target_forward(target, images, B, tokens, pos, slots, visible, width)


def commit(im: Image, P: Tensor, hidden: Tensor, drafter: Drafter, params: SamplingParams, table: Tensor | None,
           rule: AcceptRule, N: int) -> None:
    """speculative_decode's accept (Chain.accept) and commit for one image, from the target's distributions P [S, V]
    at its verified positions and its rows of the verify forward's hidden states."""
    g = len(im.draft.tokens)
    a, p = verify_chain(P[: g + 1], im.draft.q, im.draft.tokens, params, table, rule, im.generator)
    im.tokens += im.draft.tokens[:a]
    im.stats.accepted_per_step.append(a)
    im.stats.tree_depth.append(im.draft.max_depth)
    if len(im.tokens) == N:  # the drafts completed the image: a bonus token would lie past its end
        return
    im.tokens.append(pick(p, params, im.generator))
    R = hidden.shape[0]
    im.pend_emb = drafter.embed_tokens(torch.tensor(im.tokens[-a - 1 :], device=P.device).expand(R, -1))
    im.pend_h = hidden[:, : a + 1]
    im.start, im.Q = im.Q, im.Q + a + 1


@torch.no_grad()
def batched_speculative_generate(
    target: GPT,
    drafter: Drafter,
    cond: Tensor,
    params: SamplingParams,
    rule: AcceptRule,
    chain: Chain,
    generators: list[torch.Generator],
    table: Tensor | None = None,
    cond_mask: Tensor | None = None,
    compile: bool = False,
) -> tuple[Tensor, list[ImageStats]]:
    """Chain speculative decoding of a batch, all images at once; same contract (and tokens) as speculative.generate.
    Static and dynamic draft trees: batched_trees.batched_tree_generate (the registry routes each drafting kind).
    compile: the verify forward through torch.compile at the static width gamma + 1 (see the module's doc)."""
    B, N = cond.shape[0], target.args.image_tokens
    if len(generators) != B:
        raise ValueError(f"need one generator per image: {len(generators)} for a batch of {B}")
    if not isinstance(chain, Chain):
        raise ValueError(f"batched_speculative_generate drafts chains, got {type(chain).__name__}; draft trees go "
                         "through batched_trees.batched_tree_generate")
    check_one_image(cond[:1], rule, table)  # the rule's neighbour-table check (batches are ours to take)
    chain.check(target)
    device = target.output.weight.device
    timer = StepTimer(device)
    reset_peak_memory(device)
    images = prefill(target, drafter, cond, params, generators, timer, cond_mask, static=compile)
    width = chain.nodes + 1 if compile else None
    while active := [im for im in images if len(im.tokens) < N]:
        with timer.section("draft"):
            draft(drafter, active, chain, params, B, N)
        with timer.section("verify"):
            logits, hidden = verify(target, active, B, width)
        with timer.section("other"):
            index = torch.tensor([len(im.tokens) for im in active], device=device)[:, None] + torch.arange(
                logits.shape[1], device=device)
            P = batch_probs(logits, params, index)
            for i, im in enumerate(active):
                commit(im, P[i], hidden[i :: len(active)], drafter, params, table, rule, N)
    return finish(target, drafter, images, timer)


def finish(target: GPT, drafter: Drafter, images: list[Image], timer: StepTimer) -> tuple[Tensor, list[ImageStats]]:
    """Caches freed; (tokens [B, N], stats per image with the batch's section times / B)."""
    target.clear_cache()
    drafter.clear_cache()
    B, stats = len(images), []
    for im in images:
        s = im.stats.finish(timer)
        s.time_draft_s, s.time_verify_s, s.time_other_s = s.time_draft_s / B, s.time_verify_s / B, s.time_other_s / B
        s.batch_size = B
        stats.append(s)
    return torch.tensor([im.tokens for im in images], device=target.output.weight.device), stats
