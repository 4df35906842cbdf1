"""A Jacobi iteration (jacobi.py) as ONE compiled function (compile=True): the window's refinement and refill,
the target's verify, acceptance under any rule with a device form (exact, LANTERN, LANTERN++, GSD, Cool-SD,
LANTERN-TV: chain_graph.graph_capturable), the correction or bonus draw and the commit, over every image of the
batch at the fixed width window + 1. The host side is graph.GraphLoop's: one launch and one read a round.

State kept between batches, for every image b (finished ones take part as padding):
- buf [B, N + W + 1]: its tokens (positions past N are scratch); n [B]: tokens decoded so far;
- P [B, W + 1, V]: the last iteration's target distributions, which the next one refines from;
- L, a, prev [B]: the last iteration's window length, accepted prefix (-1: none yet) and n before it;
- coupled re-drafts (coupling.py): under `maximal` the last window [B, W] and its q [B, W, V], under `gumbel`
  (sampling) each image's noise [B, N, V], drawn after its first token and before its uniforms, as the eager rounds.
Uniforms: an iteration reads the L uniforms of its guesses and fresh tokens from `taken` on, then (sampling) the
acceptance block after them, and advances `taken` by what the eager rounds would have drawn (jacobi.JacobiRounds:
L, then the tries and the correction).
Forced structural tokens (`layout`, docs/chameleon-layout.md): buf, the window, P and their q hold codes over the
image head; the verify feeds the forced tokens between the window's codes (forced.py) at the static width
forced.verify_width(layout, W) (W + 1 and the end-of-line tokens W + 1 codes can cross), P is read at the codes'
rows; layout None leaves every shape and number as they are.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lantern.engine.decoding.chain import accept_chains
from lantern.engine.decoding.coupling import gumbel_noise
from lantern.engine.decoding.forced import (code_logits, code_positions, slot_geometry, slot_ids, verify_rows,
                                            verify_width)
from lantern.engine.decoding.graph import GraphLoop, graph_rule
from lantern.engine.decoding.jacobi import Image, Jacobi, refill
from lantern.engine.decoding.rounds import batch_probs, finish, first_tokens, in_rows, prefill_rows, ragged
from lantern.engine.decoding.sampling import SamplingParams
from lantern.engine.decoding.stats import ImageStats, StepTimer
from lantern.engine.models.layout import Layout
from lantern.engine.models.model import GPT
from lantern.engine.rules.acceptance import AcceptRule


def jacobi_round(target: GPT, buf: Tensor, n: Tensor, P: Tensor, L: Tensor, a: Tensor, prev: Tensor,
                 stream: Tensor, taken: Tensor, params: SamplingParams, table: Tensor | None, rule: AcceptRule,
                 jacobi: Jacobi, last: tuple[Tensor, Tensor] | None = None, noise: Tensor | None = None,
                 layout: Layout | None = None) -> Tensor:
    """One Jacobi iteration of every image (the module docstring's state, updated in place). Returns [B, 2]: the
    accepted prefixes (0 for finished images) and the windows verified."""
    B, W = n.shape[0], jacobi.window
    R, device = target.cache_key_valid.shape[0] // B, n.device
    N, T = target.args.image_tokens if layout is None else layout.codes, target.args.cls_token_num
    live = n < N
    j = torch.arange(W + 1, device=device)
    # 4 and 1: refine after the last accepted prefix, top up with fresh tokens (jacobi.JacobiRounds.draft)
    r = torch.minimum(torch.minimum(L + 1, N - prev), a + 1 + (N - n).clamp(max=W)) - a - 1
    r = torch.where(a < 0, 0, r.clamp(min=0))
    Ls = torch.where(live, (N - n).clamp(max=W), 0)
    u = stream.gather(1, taken[:, None] + torch.arange(2 * W + 1, device=device))
    prior = None if last is None else (*last, L)  # the last window, its q and length (coupling: maximal)
    if noise is not None:  # coupling: gumbel, the noise of each window slot's position
        at = (n[:, None] + j[:W]).clamp(max=N - 1)
        noise = noise.gather(1, at[..., None].expand(B, W, noise.shape[-1]))
    window, q = refill(P, u[:, :W], r, Ls, a.clamp(min=0) + 1, params.greedy, jacobi.coupling, prior, noise)
    if last is not None:
        last[0].copy_(window)
        last[1].copy_(q)
    # 2. verify [y, window] at target positions T + n - 1 .. (with a layout: y and the slots after it, the forced
    # tokens between the window's codes, from y's position)
    y = buf.gather(1, (n - 1)[:, None])
    if layout is None:
        seq, Q, lengths = torch.cat([y, window], 1), T + n - 1, Ls + 1
    else:
        forced, code_slot, _ = slot_geometry(layout, n, W)
        seq = torch.cat([y + layout.code_offset, slot_ids(layout, forced, code_slot, window)], 1)
        seq, Q = seq[:, : verify_width(layout, W)], code_positions(layout, T, n - 1)
        lengths = verify_rows(layout, n, Ls)
    pos, slots, visible = ragged(Q, torch.where(live, lengths, 0), seq.shape[1], R, target.cache_len)
    logits, _ = target.forward_rows(target.embed_tokens(in_rows(seq, R)), pos, slots, visible)
    if layout is not None:  # each code's predicting row over the image head
        logits = code_logits(layout, logits, code_slot)
    Pn = batch_probs(logits, params, n[:, None] + j)
    # 3. accept (the acceptance block follows the window's L uniforms), commit
    a_new, token = accept_chains(Pn, q, window, Ls, None if params.greedy else u.gather(1, Ls[:, None] + j), params,
                                 table, rule, tried_from=torch.zeros_like(Ls))
    a_new = torch.where(live, a_new, 0)
    buf.scatter_(1, n[:, None] + j[:W], window)
    buf.scatter_(1, (n + a_new)[:, None], token[:, None])
    P.copy_(Pn)
    used = Ls if params.greedy else Ls + torch.minimum(a_new + 1, Ls) + (n + a_new < N).long()
    taken.add_(torch.where(live, used, 0))
    prev.copy_(torch.where(live, n, prev))
    a.copy_(torch.where(live, a_new, a))
    L.copy_(torch.where(live, Ls, L))
    n.copy_(torch.where(live, (n + a_new + 1).clamp(max=N), n))
    return torch.stack([a_new, Ls], 1)


class GraphJacobiRounds(GraphLoop):
    """Jacobi iterations (jacobi.py's, uniform for uniform) as one compiled call each (`jacobi_round`)."""

    round_fn = staticmethod(jacobi_round)
    stream_in_greedy = True  # the fresh tokens' uniforms

    def __init__(self, target: GPT, jacobi: Jacobi, params: SamplingParams, rule: AcceptRule, table: Tensor | None,
                 B: int, layout: Layout | None = None):
        rule, table = graph_rule(rule, table)
        self.target, self.jacobi, self.params, self.rule, self.table, self.B = target, jacobi, params, rule, table, B
        self.layout, self.device = layout, target.output.weight.device
        self.N = target.args.image_tokens if layout is None else layout.codes
        self.per_round = 2 * jacobi.window + 1
        self.target_extra = jacobi.target_extra  # spare cache slots (jacobi_tree_graph: the tree's, its eols)

    def prefill(self, cond: Tensor, generators: list[torch.Generator], timer: StepTimer, cond_mask: Tensor | None,
                static: bool) -> list[Image]:
        p0, _, _, _ = prefill_rows(self.target, cond, self.params, timer, cond_mask, self.target_extra, True,
                                   self.layout)
        B, N, W, V = self.B, self.N, self.jacobi.window, p0.shape[-1]
        with timer.section("other"):
            self.buf = self.kept("jacobi_buf", (B, N + W + 1), torch.long)
            self.buf[:, 0] = first_tokens(p0, self.params, generators)
            self.n = self.kept("jacobi_n", (B,), torch.long).fill_(1)
            self.P = self.kept("jacobi_P", (B, W + 1, V), p0.dtype)
            self.L = self.kept("jacobi_L", (B,), torch.long)
            self.a = self.kept("jacobi_a", (B,), torch.long).fill_(-1)
            self.prev = self.kept("jacobi_prev", (B,), torch.long)
            self.last = self.noise = None
            if self.jacobi.coupling == "maximal":
                self.last = (self.kept("jacobi_window", (B, W), torch.long).zero_(),
                             self.kept("jacobi_q", (B, W, V), p0.dtype).fill_(1.0 / V))
            if self.jacobi.coupling == "gumbel" and not self.params.greedy:
                self.noise = self.kept("jacobi_noise", (B, N, V), torch.float32)
                self.noise.copy_(torch.stack([gumbel_noise(g, N, V, self.device) for g in generators]))
            self.draw_stream(generators)
        self.images = [Image(b, g, ImageStats(n_tokens=N, target_forwards=1)) for b, g in enumerate(generators)]
        return self.images

    def round_inputs(self) -> tuple:
        return (self.target, self.buf, self.n, self.P, self.L, self.a, self.prev, self.stream, self.taken,
                self.params, self.table, self.rule, self.jacobi, self.last, self.noise, self.layout)

    def tally(self, im: Image, a: int, L: int) -> None:
        im.stats.tree_depth.append(L)

    def finish(self, images: list[Image], timer: StepTimer) -> tuple[Tensor, list[ImageStats]]:
        self.finish_stream()
        return finish(self.target, images, timer, self.buf[:, : self.N].clone())
