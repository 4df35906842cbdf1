"""The one speculative decoding loop, for every drafting kind: a batch of B images advances together, each at its
own pace (ragged acceptance); one image is a batch of one.

One round, with y an image's newest token at target position Q (not yet fed to the target), over the images still
decoding (the active ones):
1. draft: the drafter catches every active image up over the positions whose true target hidden states arrived
   last round (ONE forward, ragged), then the drafting kind drafts below y (more drafter forwards, batched over the
   images that still draft); Jacobi refills its windows instead (the target drafts for itself);
2. verify: ONE target forward over every active image's [y, drafts] (padded);
3. accept and commit: the drafting kind accepts a path of drafts per image with the acceptance rule and draws the
   next token from the residual at the first rejection, or from the target's distribution below the last accepted
   draft (a bonus token; none when the drafts completed the image); greedy takes the argmax. The accepted drafts'
   cache entries move into slots Q + 1 .. Q + a where they are not already there, and their true hidden states
   become the drafter's next catch-up inputs.
The rounds of each kind: chain_rounds.ChainRounds (chain.py's drafts), tree_rounds.TreeRounds (trees.py's static and
dynamic trees), jacobi.JacobiRounds. Every image draws from its own generator, so its tokens never depend on its
batch: a batch of B gives each image the tokens it gets in a batch of 1 (exactly so in the float64 tests).
The target's cache is indexed by position: entries past the accepted prefix are overwritten next round, never read.
tau = tokens / target forwards (prefill included); times: the batch's wall time per section / B. compile=True: the
verify forward through torch.compile with static shapes at the width nodes + 1, and a chain's drafting with it
(rounds.py).
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from lantern.engine.rules.acceptance import AcceptRule
from lantern.engine.decoding.kinds import rounds_for
from lantern.engine.decoding.skipping import skips
from lantern.engine.models.layout import Layout
from lantern.engine.models.model import GPT
from lantern.engine.decoding.sampling import SamplingParams
from lantern.engine.decoding.stats import ImageStats, StepTimer, reset_peak_memory
from lantern.errors import UserError

PREFILL, FINISH = "lantern.prefill", "lantern.finish"  # profiler marks around what is not a round


class Rounds(Protocol):
    """A drafting kind's rounds over a batch (chain_rounds.ChainRounds, tree_rounds.TreeRounds, jacobi.JacobiRounds):
    prefill (caches set up, the condition run, each image's first token drawn: the images), then per round draft,
    verify ((logits, hidden) [R * n, S, ...] in forward layout, rounds.pack) and commit (steps 1-3 for the active
    images), and finish (caches freed; tokens [B, N] and stats per image)."""

    def prefill(self, cond: Tensor, generators: list[torch.Generator], timer: StepTimer, cond_mask: Tensor | None,
                static: bool) -> list: ...
    def draft(self, active: list) -> None: ...
    def verify(self, active: list, width: int | None) -> tuple[Tensor, Tensor]: ...
    def commit(self, active: list, logits: Tensor, hidden: Tensor) -> None: ...
    def finish(self, images: list, timer: StepTimer) -> tuple[Tensor, list[ImageStats]]: ...


@torch.no_grad()
def decode(
    target: GPT,
    drafter,
    cond: Tensor,
    params: SamplingParams,
    rule: AcceptRule,
    drafting,
    generators: list[torch.Generator],
    table: Tensor | None = None,
    cond_mask: Tensor | None = None,
    compile: bool = False,
    layout: Layout | None = None,
) -> tuple[Tensor, list[ImageStats]]:
    """Speculative decoding of a batch (cond [B] or [B, T, C], one generator per image; drafter None for Jacobi):
    image tokens [B, N] and one ImageStats per image, as generate.generate. layout: a family whose sequence carries
    forced structural tokens; the tokens are then its codes [B, layout.codes] (docs/chameleon-layout.md)."""
    B, N = cond.shape[0], target.args.image_tokens if layout is None else layout.codes
    if len(generators) != B:
        raise ValueError(f"need one generator per image: {len(generators)} for a batch of {B}")
    if rule.table_width and (table is None or table.shape[1] < rule.table_width):
        raise UserError(f"{rule.describe()} needs a neighbour table with >= {rule.table_width} neighbours per code")
    if hasattr(drafting, "check"):
        drafting.check(target)
    device = target.output.weight.device
    timer = StepTimer(device)
    reset_peak_memory(device)
    with timer.section("other"):
        drafting = drafting.to(device) if hasattr(drafting, "to") else drafting
    # VVS (a chain's skip_every) changes a round's verify width and which images verify: the eager rounds carry it
    compile = compile and not skips(drafting)
    rounds = rounds_for(drafting, target, drafter, params, rule, table, B, compile, layout)
    with torch.profiler.record_function(PREFILL):  # a mark for benchmarks/host_ops.py, which counts the rounds
        images = rounds.prefill(cond, generators, timer, cond_mask, compile)
    width = drafting.nodes + 1 if compile else None
    while active := [im for im in images if im.n < N]:
        if hasattr(rounds, "round"):  # the whole round as one graph: its time counts as the verify's
            with timer.section("verify"):
                rounds.round(active)
            continue
        with timer.section("draft"):
            rounds.draft(active)
        with timer.section("verify"):
            logits, hidden = rounds.verify(active, width)
        with timer.section("other"):
            rounds.commit(active, logits, hidden)
    with torch.profiler.record_function(FINISH):
        return rounds.finish(images, timer)
