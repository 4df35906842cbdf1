"""The one speculative image loop, shared by chain drafts (chain.py) and draft trees (trees.py).

One round, with y the newest token at target position Q (not yet fed to the target):
1. draft: the drafter catches up over the positions whose true target hidden states arrived last round (one
   forward, here), then the drafting kind drafts below y (`Drafting.draft`: more drafter forwards);
2. verify: one target forward over [y, drafts] (`Drafting.verify`) gives the target distributions;
3. accept: the drafting kind accepts a path of drafts with the acceptance rule (`Drafting.accept`) and names the
   distribution of the next token: the residual at the first rejection, or the target's below the last accepted
   draft (a bonus token; none when the drafts completed the image); greedy takes its argmax;
4. commit: the accepted drafts' cache entries move into slots Q + 1 .. Q + a where they are not already there
   (model.keep), and their true hidden states become the drafter's next catch-up inputs.
The target's cache is indexed by position: entries past the accepted prefix are overwritten next round and a query
never sees a key beyond its own position, so only the accepted prefix is ever read. Every random draw (drafts,
acceptance uniforms, corrections) comes from the image's own generator, in the order the rounds make them.
tau = tokens / target forwards (prefill included): the mean accepted length counting the bonus/correction token.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from lantern.engine import compiled
from lantern.engine.acceptance import AcceptRule
from lantern.engine.drafter import Drafter
from lantern.engine.generate import cfg_rows
from lantern.engine.model import GPT
from lantern.engine.sampling import SamplingParams, pick, row_probs
from lantern.engine.stats import ImageStats, StepTimer, reset_peak_memory
from lantern.errors import UserError


class Drafts(Protocol):
    """One round's drafts (a chain.ChainDraft, a trees.Draft): what the loop reads of them for stats and commit."""

    drafter_passes: int  # drafter forwards beyond the catch-up one, which already predicts the first drafts
    max_depth: int  # the deepest draft (a chain's length), stats.ImageStats.tree_depth

    def tokens_at(self, path: list[int]) -> list[int]:
        """The tokens of the drafts at `path` (indices into the drafts, as `Drafting.accept` returns them)."""


class Drafting(Protocol):
    """A drafting kind: how one round drafts, verifies and accepts (a chain of gamma drafts, a static or dynamic tree)."""

    nodes: int  # the node budget: drafts verified per target forward at most
    target_extra: int  # cache slots a verification writes past the committed prefix, beyond one per position
    drafter_extra: int  # cache slots the drafter's own passes write past its committed prefix

    def to(self, device) -> "Drafting":
        """The same kind with its precomputed tensors (a static tree's masks) on `device`."""

    def check(self, target: GPT) -> None:
        """One-line UserErrors before any decoding (a rank beyond the vocabulary, ...)."""

    def draft(self, drafter: Drafter, pred: Tensor, params: SamplingParams, Q: int, n_done: int, left: int,
              generator: torch.Generator) -> Drafts:
        """Drafts below y from the drafter's predicted h_Q (pred [R, 1, d]); at most `left` deep."""

    def verify(self, target: GPT, y: int, draft: Drafts, Q: int) -> tuple[Tensor, Tensor]:
        """One target forward over [y, drafts]: (logits, hidden) [R, 1 + drafts, ...]."""

    def accept(self, logits: Tensor, draft: Drafts, params: SamplingParams, n_done: int, table: Tensor | None,
               rule: AcceptRule, generator: torch.Generator) -> tuple[list[int], Tensor]:
        """(the accepted path: indices of accepted drafts, root to leaf; the next token's distribution). Draft i
        sits in row i + 1 of the verified sequence, so the rows [0] + [i + 1 for i in path] carry the true hidden
        states the drafter catches up on."""


def check_one_image(cond: Tensor, rule: AcceptRule, table: Tensor | None) -> None:
    if cond.shape[0] != 1:
        raise ValueError(f"speculative decoders take one image at a time, got a batch of {cond.shape[0]}")
    if rule.table_width and (table is None or table.shape[1] < rule.table_width):
        raise UserError(f"{rule.describe()} needs a neighbour table with >= {rule.table_width} neighbours per code")


def prefill_rows(target: GPT, cond: Tensor, params: SamplingParams, timer: StepTimer, cond_mask: Tensor | None = None,
                 target_extra: int = 0, static: bool = False):
    """The target's cache set up for the CFG rows of `cond` (cfg_rows; `target_extra` spare slots) and the target
    run over the condition positions. Returns (logits, condition embeddings, their hidden states, the rows' mask).
    Shared by the single-image and the batched speculative decoders; static: the cache kept between calls for
    compiled steps (compiled.setup_static_cache). The padded caption rows' states follow target.pad_semantics."""
    rows, rows_mask = cfg_rows(target, cond, params, cond_mask)
    with timer.section("other"):
        if static:
            compiled.setup_static_cache(target, rows.shape[0], extra=target_extra)
        else:
            target.setup_cache(rows.shape[0], extra=target_extra)
    with timer.section("verify"):
        if rows_mask is not None:
            target.set_cond_mask(rows_mask)
        cond_emb = target.embed_cond(rows)
        logits, hidden = target.prefill_cond(cond_emb, rows_mask)
    return logits, cond_emb, hidden, rows_mask


def target_prefill(target: GPT, cond: Tensor, params: SamplingParams, generator: torch.Generator, timer: StepTimer,
                   cond_mask: Tensor | None = None, target_extra: int = 0):
    """`prefill_rows` and the first image token drawn. Returns (first token, condition embeddings, their hidden
    states, the rows' mask). Shared by every single-image speculative decoder (drafter-based ones and Jacobi)."""
    logits, cond_emb, hidden, rows_mask = prefill_rows(target, cond, params, timer, cond_mask, target_extra)
    with timer.section("other"):
        first = pick(row_probs(logits[:, -1], params, 0), params, generator)
    return first, cond_emb, hidden, rows_mask


def speculative_prefill(target: GPT, drafter: Drafter, cond: Tensor, params: SamplingParams,
                        generator: torch.Generator, timer: StepTimer, cond_mask: Tensor | None = None,
                        target_extra: int = 0, drafter_extra: int = 0) -> tuple[int, int, Tensor, Tensor]:
    """`target_prefill`, and the drafter's cache (`drafter_extra` slots) set up. Returns the number of rows R, the
    first token, and the drafter's pending catch-up inputs: embeddings of positions t + 1 and the target's hidden h_t."""
    first, cond_emb, hidden, rows_mask = target_prefill(target, cond, params, generator, timer, cond_mask, target_extra)
    R = cond_emb.shape[0]
    with timer.section("other"):
        drafter.setup_cache(R, extra=drafter_extra, cond_mask=rows_mask)
    # The drafter reads its own embedding (a converted authors' drafter carries one) and its own condition inputs.
    first_emb = drafter.embed_tokens(torch.tensor([first] * R, device=cond_emb.device))[:, None]
    return R, first, torch.cat([drafter.cond_inputs(cond_emb), first_emb], 1), hidden


@torch.no_grad()
def speculative_decode(
    target: GPT,
    drafter: Drafter,
    cond: Tensor,
    params: SamplingParams,
    rule: AcceptRule,
    drafting: Drafting,
    generator: torch.Generator,
    table: Tensor | None = None,
    cond_mask: Tensor | None = None,
) -> tuple[Tensor, ImageStats]:
    """Decode one image (cond [1] or [1, T, C]); returns its tokens [N] and stats."""
    check_one_image(cond, rule, table)
    drafting.check(target)
    N, T = target.args.image_tokens, target.args.cls_token_num
    device = target.output.weight.device
    timer = StepTimer(device)
    reset_peak_memory(device)
    with timer.section("other"):
        drafting = drafting.to(device)
    R, first, pend_emb, pend_h = speculative_prefill(target, drafter, cond, params, generator, timer, cond_mask,
                                                     drafting.target_extra, drafting.drafter_extra)
    tokens = [first]
    start, Q = 0, T
    stats = ImageStats(n_tokens=N, target_forwards=1)

    while len(tokens) < N:
        n_done = len(tokens)
        with timer.section("draft"):
            pred = drafter.step(pend_emb, pend_h, start)[:, -1:]  # predicted h_Q
            draft = drafting.draft(drafter, pred, params, Q, n_done, N - n_done, generator)
            stats.drafter_forwards += 1 + draft.drafter_passes
        with timer.section("verify"):
            logits, hidden = drafting.verify(target, tokens[-1], draft, Q)
            stats.target_forwards += 1
        with timer.section("other"):
            path, p = drafting.accept(logits, draft, params, n_done, table, rule, generator)
            a = len(path)
            if path != list(range(a)):  # a tree's accepted nodes are not yet in consecutive slots
                target.keep(Q + 1 + torch.tensor(path, device=device), Q + 1)
            tokens += draft.tokens_at(path)
            stats.accepted_per_step.append(a)
            stats.tree_depth.append(draft.max_depth)
            if len(tokens) == N:  # the drafts completed the image: a bonus token would lie past its end
                break
            tokens.append(pick(p, params, generator))
            # next catch-up: drafter positions Q..Q+a read the accepted drafts and the new token, with the
            # target's true hidden states at y and the accepted drafts
            pend_emb = drafter.embed_tokens(torch.tensor(tokens[-a - 1 :], device=device).expand(R, -1))
            pend_h = hidden[:, [0] + [i + 1 for i in path]]
            start, Q = Q, Q + a + 1

    target.clear_cache()
    drafter.clear_cache()
    return torch.tensor(tokens, device=device), stats.finish(timer)


def decode_each(decode_image, cond: Tensor, generators: list[torch.Generator], cond_mask: Tensor | None = None):
    """Run a batch-1 decoder (cond, generator, cond_mask) -> (tokens, stats) over a batch, image by image."""
    if len(generators) != cond.shape[0]:
        raise ValueError(f"need one generator per image: {len(generators)} for a batch of {cond.shape[0]}")
    out, stats = [], []
    for i, g in enumerate(generators):
        m = None if cond_mask is None else cond_mask[i : i + 1]
        tokens, s = decode_image(cond[i : i + 1], g, m)
        out.append(tokens)
        stats.append(s)
    return torch.stack(out), stats


def generate(
    target: GPT,
    drafter: Drafter,
    cond: Tensor,
    params: SamplingParams,
    rule: AcceptRule,
    drafting: Drafting,
    generators: list[torch.Generator],
    table: Tensor | None = None,
    cond_mask: Tensor | None = None,
) -> tuple[Tensor, list[ImageStats]]:
    """Speculative decoding of a batch, one image at a time; same contract as generate.generate."""
    return decode_each(
        lambda c, g, m: speculative_decode(target, drafter, c, params, rule, drafting, g, table, m), cond, generators, cond_mask
    )
