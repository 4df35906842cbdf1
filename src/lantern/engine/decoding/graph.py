"""The host side of rounds that run as ONE compiled call each (chain_graph.py, tree_graph.py, jacobi_graph.py): on
CUDA one CUDA graph replay a round (torch.compile "reduce-overhead"), so a round's host work is its launch and one
read of the accepted lengths (../shared/reference/gpu-rounds.md).

- The state lives in buffers kept between batches (`kept`: compiled.static_buffer), which the round updates in
  place; finished images take part as padding and are never written where they are read.
- Every image's uniforms for the whole image are drawn from its generator at the start (`draw_stream`) and sent in
  one copy: the stream [B, M], of which the round reads from `taken` [B] on and advances `taken` by what it used
  (at most `per_round` a round, and every round makes a token). At the end each generator is advanced by exactly
  what its image used (`finish_stream`), so the images' tokens are those of the eager rounds, uniform for uniform.
- The host reads each round's result one round late: round r + 1 is queued before round r's result is read, so the
  host's launch overlaps the device's work. The price is one round of padding after the batch's last (every image
  finished, nothing written).
"""

from __future__ import annotations

import torch
from torch import Tensor

from lantern.engine.decoding import compiled
from lantern.engine.rules.acceptance import AcceptRule


def graph_rule(rule: AcceptRule, table: Tensor | None) -> tuple[AcceptRule, Tensor | None]:
    """(rule, table) in the form a compiled round reads: a rule with a verification of its own in its graph_form
    (LANTERN-TV: its flow over padded edges, that table), any other as it is."""
    if rule.impl is None:
        return rule, table
    impl, table = rule.impl.graph_form(table)
    return AcceptRule(rule.kind, k=rule.k, impl=impl), table


class GraphLoop:
    """What every one-call-a-round kind shares. A subclass sets `round_fn` (the compiled round, returning [B, 2]:
    each image's accepted length and a second number its `tally` reads) and `per_round`, and gives the round's
    arguments (`round_inputs`)."""

    round_fn = None
    per_round: int  # the most uniforms one round uses
    stream_in_greedy = False  # whether greedy decoding draws uniforms too (Jacobi's fresh tokens)

    def kept(self, name: str, shape, dtype: torch.dtype) -> Tensor:
        return compiled.static_buffer(self.target, name, shape, dtype, self.device)

    def draw_stream(self, generators: list[torch.Generator]) -> None:
        """Each image's uniforms for the whole image, in one copy, and the host buffers the rounds are read into."""
        B, N = len(generators), self.N
        self.taken = self.kept("graph_taken", (B,), torch.long)
        self.stream = None
        if self.stream_in_greedy or not self.params.greedy:
            size = (N - 1) * self.per_round
            self.states = [g.get_state() for g in generators]
            u = torch.stack([torch.rand(size, generator=g, dtype=torch.float64, device=g.device) for g in generators])
            self.stream = self.kept("graph_stream", (B, size + self.per_round), torch.float64)
            self.stream[:, :size].copy_(u)  # drawn on the generators' device, sent in one copy
        pinned = self.device.type == "cuda"
        self.reads = [torch.zeros(B, 2, dtype=torch.long, pin_memory=pinned) for _ in range(2)]
        self.queued = None  # (the host buffer a queued round's result arrives in, its event)

    def round_inputs(self) -> tuple:
        raise NotImplementedError

    def round(self, images: list) -> None:
        """Queue one round of every image (the finished ones as padding), then read the one before it."""
        step = compiled.compiled_step(type(self).round_fn, self.device)
        result = step(*self.round_inputs())
        read = self.reads[0].copy_(result, non_blocking=True)
        self.reads.reverse()
        done = torch.cuda.Event() if self.device.type == "cuda" else None
        if done is not None:
            done.record()
        if self.queued is not None:
            self.account(*self.queued)
        self.queued = (read, done)

    def account(self, read: Tensor, done) -> None:
        """A round's accepted lengths (the round's one read) into the images' stats."""
        if done is not None:
            done.synchronize()
        N = self.N
        for im, (a_i, other) in zip(self.images, read.tolist()):
            if im.n >= N:
                continue
            im.stats.target_forwards += 1
            im.stats.accepted_per_step.append(a_i)
            self.tally(im, a_i, other)
            im.n = min(im.n + a_i + 1, N)

    def tally(self, im, a: int, other: int) -> None:
        """The round's kind-specific stats of one image, from its accepted length and round_fn's second number."""
        raise NotImplementedError

    def finish_stream(self) -> None:
        """The last queued round read, and each generator advanced by the uniforms its image used (one read)."""
        if self.queued is not None:
            self.account(*self.queued)
        if self.stream is not None:
            for g, state, used in zip((im.generator for im in self.images), self.states, self.taken.tolist()):
                g.set_state(state)
                torch.rand(used, generator=g, dtype=torch.float64, device=g.device)
