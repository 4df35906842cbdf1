"""A chain round as ONE compiled function (compile=True): the drafter's catch-up and its gamma steps, the target's
verify, acceptance, the residual or bonus draw and the commit, over every image of the batch at fixed shapes, on
the device. graph.GraphLoop is its host side (one launch and one read a round, the uniforms drawn ahead): the
gpt-fast / SGLang pattern (../shared/reference/gpu-rounds.md). On a CPU inductor compiles the same function, which
is how the tests check it against the eager rounds (chain_rounds.ChainRounds), token for token.

The state lives on the device in buffers kept between batches (compiled.static_buffer), which the round updates in
place, for every image b (finished ones take part as padding and are never written where they are read):
- buf [B, N + gamma + 1]: the image's tokens (positions past N are scratch);
- n [B]: tokens decoded so far (n = N: finished);
- pend_h [R * B, gamma + 1, d]: the target's hidden states at the drafter's pending catch-up positions (forward
  layout: image b at rows b and B + b), pend_len [B] of them (a + 1 after a round that accepted a drafts), paired
  with the embeddings of the tokens buf[b, n - pend_len : n].
A caption's condition positions (t2i: 120) are caught up once, in the prefill, so that every round's catch-up fits
the fixed width gamma + 1. Every rule runs in the round: those of acceptance.py as they are, those with a
verification of their own (rule.impl) in their `graph_form` (Cool-SD and GSD batch their residuals; LANTERN-TV's
flow runs over padded edges).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from lantern.engine.decoding.chain import Chain, accept_chains
from lantern.engine.decoding.forced import code_positions, draft_slots, slot_geometry, slot_ids, verify_width
from lantern.engine.decoding.chain_rounds import chain_drafts
from lantern.engine.decoding.graph import GraphLoop, graph_rule
from lantern.engine.decoding.rounds import DrafterRounds, batch_probs, finish, in_rows, pack, ragged
from lantern.engine.decoding.sampling import SamplingParams
from lantern.engine.decoding.stats import StepTimer
from lantern.engine.models.drafter import Drafter
from lantern.engine.models.layout import Layout, code_steps, image_logits
from lantern.engine.models.model import GPT
from lantern.engine.rules.acceptance import AcceptRule


def graph_capturable(rule: AcceptRule) -> bool:
    """Whether a rule's chain (or Jacobi) round runs as one graph: its acceptance and residual are plain tensor ops,
    or it has a form that is (`graph_form`: Cool-SD and GSD as they are, LANTERN-TV's flow over padded edges)."""
    return rule.impl is None or hasattr(rule.impl, "graph_form")


def chain_round(target: GPT, drafter: Drafter, buf: Tensor, n: Tensor, pend_h: Tensor, pend_len: Tensor,
                stream: Tensor | None, taken: Tensor, params: SamplingParams, table: Tensor | None,
                rule: AcceptRule, drafting: Chain, layout: Layout | None = None,
                pend_ids: Tensor | None = None) -> Tensor:
    """One chain round for every image (the module docstring's state, updated in place). stream [B, M] each image's
    uniforms for the whole image, drawn ahead (None: greedy), of which the first taken [B] are used: the round reads
    the next 2 gamma + 1 and advances `taken` by what it used. Returns the accepted lengths a [B] (0 for finished
    images) and the drafts made, [B, 2]. layout (forced tokens, chain_rounds.ChainRounds' splice at fixed widths):
    the pending inputs are ids (pend_ids [B, W], eol tokens among them), the drafter walks gamma + ceil(gamma /
    cols) slots, the verify W = pend_h's width = forced.verify_width rows."""
    B, G = n.shape[0], drafting.gamma
    width, R, device = pend_h.shape[1], pend_h.shape[0] // B, n.device
    N, T = target.args.image_tokens if layout is None else layout.codes, target.args.cls_token_num
    live = n < N
    j = torch.arange(width, device=device)
    u = None if stream is None else stream.gather(1, taken[:, None] + torch.arange(2 * G + 1, device=device))
    # 1. draft: catch-up over the pending inputs, then the drafter's steps (chain_drafts)
    lengths = torch.where(live, pend_len, 0)
    if layout is None:
        Q, geometry, steps = T + n - 1, None, G
        tokens = buf.gather(1, ((n - pend_len)[:, None] + j).clamp(0, buf.shape[1] - 1))
    else:  # y's position and the slots after it (forced.py), the pending inputs' ids as they are
        Q, geometry, steps = code_positions(layout, T, n - 1), slot_geometry(layout, n, G), draft_slots(layout, G)
        tokens = pend_ids
    emb = in_rows(drafter.embed_tokens(tokens), R)
    pos, slots, visible = ragged(Q - pend_len, lengths, width, R, drafter.cache_len)
    gs = torch.where(live, (N - n).clamp(max=G), 0)
    X, q = chain_drafts(drafter, emb, pend_h, pos, slots, visible, None, (lengths - 1).clamp(min=0), Q, n, gs, u,
                        params, steps, layout, geometry)
    # 2. verify [y, drafts] at target positions Q = T + n - 1 .. (a layout: y and the slots after it)
    y = buf.gather(1, (n - 1)[:, None])
    if layout is None:
        seq, rows = torch.cat([y, X], 1), gs + 1
    else:
        seq = torch.cat([y + layout.code_offset, slot_ids(layout, geometry[0], geometry[1], X)], 1)[:, :width]
        last = torch.where(n + gs >= N, code_steps(layout, n + gs - 1) + 1, code_steps(layout, n + gs))
        rows = last - code_steps(layout, n - 1)
    pos, slots, visible = ragged(Q, torch.where(live, rows, 0), width, R, target.cache_len)
    logits, hidden = target.forward_rows(target.embed_tokens(in_rows(seq, R)), pos, slots, visible)
    # 3. accept, draw the next token, commit (writes past a finished image's end land in buf's scratch columns)
    if layout is not None:  # each code's predicting row (the eol's after a row end), over the image head
        at, V = geometry[1].clamp(max=width - 1), logits.shape[-1]
        logits = logits.view(R, B, width, V).gather(2, at[None, ..., None].expand(R, -1, -1, V))
        logits = image_logits(layout, logits.view(R * B, G + 1, V))
    P = batch_probs(logits, params, n[:, None] + torch.arange(G + 1, device=device))
    a, token = accept_chains(P, q, X, gs, u, params, table, rule)
    a = torch.where(live, a, 0)
    buf.scatter_(1, n[:, None] + torch.arange(G, device=device), X)
    buf.scatter_(1, (n + a)[:, None], token[:, None])
    pend_h.copy_(hidden)
    if layout is None:
        pend_len.copy_(a + 1)
    else:  # the verified rows up to the next code's predicting row, paired with the ids after them and the code
        r = geometry[1].gather(1, a[:, None]).clamp(max=width - 1)
        pend_ids.copy_(F.pad(seq[:, 1:], (0, 1)).scatter(1, r, token[:, None] + layout.code_offset))
        pend_len.copy_(r[:, 0] + 1)
    # the uniforms used: the drafts', the tried drafts', the next token's unless the drafts completed the image
    taken.add_(torch.where(live, gs + torch.minimum(a + 1, gs) + (n + a < N).long(), 0))
    n.copy_(torch.where(live, (n + a + 1).clamp(max=N), n))
    return torch.stack([a, gs], 1)


class GraphRounds(GraphLoop, DrafterRounds):
    """The rounds of a drafting kind with a drafter whose whole round is one compiled call (graph.GraphLoop;
    `round_fn`: chain_round here, tree_graph.tree_round), over the state the module docstring lists, pending
    catch-up width `width`. A subclass says what a round did to an image's stats (`tally`, from the round's
    accepted lengths and deepest drafts, round_fn's [B, 2] result)."""

    width: int  # the pending catch-up inputs kept per image (the longest accepted path + 1)

    def __init__(self, target: GPT, drafter: Drafter, drafting, params: SamplingParams, rule: AcceptRule,
                 table: Tensor | None, B: int):
        rule, table = graph_rule(rule, table)
        super().__init__(target, drafter, drafting, params, rule, table, B)

    def prefill(self, cond: Tensor, generators: list[torch.Generator], timer: StepTimer, cond_mask: Tensor | None,
                static: bool) -> list:
        images = super().prefill(cond, generators, timer, cond_mask, True)
        self.images = images
        B, N, W, device = self.B, self.N, self.width, self.device
        R, T = images[0].pend_emb.shape[0], images[0].pend_emb.shape[1]
        with timer.section("other"):
            emb = pack([im.pend_emb for im in images], T)
            hidden = pack([im.pend_h for im in images], T)
            if T > 1:  # the condition positions, caught up once (they never fit a round's width)
                zeros, full = torch.zeros(B, dtype=torch.long, device=device), torch.full((B,), T - 1, device=device)
                pos, slots, visible = ragged(zeros, full, T - 1, R, self.drafter.cache_len)
                self.drafter.forward_rows(emb[:, : T - 1], hidden[:, : T - 1], pos, slots, visible)
            self.buf = self.kept("graph_buf", (B, N + W + 1), torch.long)
            self.buf[:, 0] = self.first
            self.n = self.kept("graph_n", (B,), torch.long).fill_(1)
            self.pend_len = self.kept("graph_pend_len", (B,), torch.long).fill_(1)
            self.pend_h = self.kept("graph_pend_h", (R * B, W, hidden.shape[-1]), hidden.dtype)
            self.pend_h[:, 0] = hidden[:, T - 1]
            if self.layout is not None:  # the pending inputs' ids (eol tokens among them): the first code's
                self.pend_ids = self.kept("graph_pend_ids", (B, W), torch.long)
                self.pend_ids[:, 0] = self.first + self.layout.code_offset
            self.draw_stream(generators)
        return images

    def round_inputs(self) -> tuple:
        inputs = (self.target, self.drafter, self.buf, self.n, self.pend_h, self.pend_len, self.stream, self.taken,
                  self.params, self.table, self.rule, self.round_args())
        return inputs if self.layout is None else inputs + (self.layout, self.pend_ids)

    def round_args(self):
        """The drafting kind's constant argument of round_fn."""
        return self.drafting

    def finish(self, images: list, timer: StepTimer):
        """The last round read, the generators advanced, the tokens copied out of the kept buffer."""
        self.finish_stream()
        self.drafter.clear_cache()
        return finish(self.target, images, timer, self.buf[:, : self.N].clone())


class GraphChainRounds(GraphRounds):
    """Chain rounds (chain.py's drafts) as one compiled call each (`chain_round`)."""

    round_fn = staticmethod(chain_round)

    def __init__(self, *args):
        super().__init__(*args)
        self.width = self.drafting.gamma + 1
        self.per_round = 2 * self.drafting.gamma + 1

    def use_layout(self, layout: Layout) -> None:
        super().use_layout(layout)
        self.width = verify_width(layout, self.drafting.gamma)

    def tally(self, im, a: int, deepest: int) -> None:
        # the catch-up, then g - 1 steps for g drafts (under a layout the forced slots between them too)
        im.stats.drafter_forwards += deepest if self.layout is None else \
            code_steps(self.layout, im.n + deepest - 1) - code_steps(self.layout, im.n - 1)
        im.stats.tree_depth.append(deepest)
