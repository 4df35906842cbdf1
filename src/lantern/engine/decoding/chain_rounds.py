"""The rounds of chain drafts (ChainRounds: chain.py's drafts for every image at once) in speculative.decode's loop,
on rounds.py's batch machinery.

Chain round over the active images:
1. draft (`chain_drafts`): ONE drafter forward catches every active image up (ragged lengths, padded to the
   longest), then drafter step i runs over the images that still want a draft i + 2 (an image near its end drafts
   fewer than gamma);
2. verify: ONE target forward over every active image's [y, drafts] (padded);
3. accept and commit: the target's distributions of every verified position at once, then every image's chain
   accepted at once with its own uniforms (chain.accept_chains); the image's next round reads from its own new Q.
compile=True: a chain's drafting (`chain_drafts`: catch-up, drafter steps, draws) compiles as rounds.py's verify
forward does, at the catch-up width gamma + 1.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lantern.engine.decoding import compiled
from lantern.engine.decoding.chain import accept_chains
from lantern.engine.decoding.rounds import (DrafterRounds, Image, batch_probs, finish, forward_rows_of, in_rows, pack,
                                            ragged, target_forward, to_device)
from lantern.engine.decoding.sampling import SamplingParams, Uniforms, next_tokens
from lantern.engine.decoding.stats import ImageStats, StepTimer
from lantern.engine.decoding.forced import code_logits, code_positions, slot_geometry, slot_ids, verify_rows
from lantern.engine.models.drafter import Drafter
from lantern.engine.models.layout import Layout, code_steps, image_logits


def chain_drafts(drafter: Drafter, emb: Tensor, hidden: Tensor, pos: Tensor, slots: Tensor, visible: Tensor,
                 rows: Tensor | None, last: Tensor, Q: Tensor, done: Tensor, gs: Tensor, u: Tensor | None,
                 params: SamplingParams, G: int, layout: Layout | None = None,
                 geometry: tuple[Tensor, Tensor, Tensor] | None = None, states: bool = False) -> tuple[Tensor, ...]:
    """G chain drafts for n images, the drafting of a chain round in one function, eager or compiled with static
    shapes (gpt-fast style, as verify_step): the drafter's catch-up over each image's pending inputs (emb, hidden,
    pos, slots [R * n, S, ...], visible [R * n, S, L] in forward layout over the cache rows `rows`, None: all),
    whose predicted state at each image's last input (`last` [n]) gives q_1 and x_1; then drafter step i feeds x_i
    at target position Q + i (Q [n]: each image's newest token) for the images that want a draft i + 2 (gs [n]:
    drafts wanted; the others' queries are padding). q_i are CFG-mixed and filtered at image-token index done + i;
    x_i drawn with the image's uniform u[:, i] (None: greedy argmax). Returns (X [n, G], q [n, G, V]).
    layout (forced structural tokens, eager rounds): the steps walk the slots after y (forced.slot_geometry's
    `geometry`) and G counts them: a forced slot feeds its id without a draw, a code's slot draws draft t over the
    image head with u[:, t] and feeds it as id code + offset; X and q are gathered at the codes' slots.
    With `states`, also the drafter's predicted hidden states the drafts were drawn from, [R, n, G, d] (column i:
    position Q + i; chains without a layout: skipping.py's)."""
    n, L, device = last.shape[0], drafter.cache_len, emb.device
    R = emb.shape[0] // n
    out = drafter.forward_rows(emb, hidden, pos, slots, visible, rows)
    pred = out.view(R, n, out.shape[1], -1)[:, torch.arange(n, device=device), last]  # [R, n, d]
    xs, qs, preds = [], [], []
    steps, feed_below = G, gs - 1
    if geometry is not None:
        forced, code_slot, slot_code = geometry
        feed_below = torch.where(gs > 0, code_slot.gather(1, (gs - 1).clamp(min=0)[:, None])[:, 0], 0)
    for i in range(steps):
        preds.append(pred)
        t = i if geometry is None else slot_code[:, i].clamp(min=0)  # the draft a slot holds
        head = drafter.head(pred.reshape(R * n, 1, -1))
        q = batch_probs(head if layout is None else image_logits(layout, head), params, (done + t)[:, None])[:, 0]
        ut = None if u is None else u[:, i] if geometry is None else u.gather(1, t[:, None])[:, 0]
        xs.append(next_tokens(q, params, ut))
        qs.append(q)
        if i == steps - 1:
            break
        fed = xs[-1] if geometry is None else torch.where(forced[:, i] >= 0, forced[:, i], xs[-1] + layout.code_offset)
        real = (i < feed_below)[:, None]
        at = (Q + i)[:, None]
        step_pos, step_slots = torch.where(real, at, 0), torch.where(real, at, L - 1)
        step_visible = (torch.arange(L, device=device) <= at[..., None]) & real[..., None]
        pred = drafter.forward_rows(in_rows(drafter.embed_tokens(fed), R)[:, None], pred.reshape(R * n, 1, -1),
                                    in_rows(step_pos, R), in_rows(step_slots, R), in_rows(step_visible, R),
                                    rows).view(R, n, -1)
    X, q = torch.stack(xs, 1), torch.stack(qs, 1)
    if geometry is not None:
        at = code_slot[:, :-1].clamp(max=steps - 1)  # a draft beyond the image's drafts: any slot, never read
        X, q = X.gather(1, at), q.gather(1, at[..., None].expand(-1, -1, q.shape[-1]))
    if states:
        return X, q, torch.stack(preds, 2)
    return X, q


class ChainRounds(DrafterRounds):
    """Rounds of gamma chain drafts (chain.py) for a batch, three host syncs per round: the round's host integers
    go to the device in one copy, the images' uniforms (2 gamma + 1 each, drawn ahead: drafts, tried drafts, the
    next token; each generator then advances by what it used) in another; drafts, acceptance and next tokens are
    drawn on the device (chain.accept_chains) into a token buffer (self.buf), and one read per round, the accepted
    lengths, tells the host where every image stands."""

    drafter_states = False  # whether `draft` keeps the drafter's predicted states (self.states; skipping.py's)

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
        layout, geometry, steps = self.layout, None, [min(gamma, self.N - im.n) for im in images]
        if layout is None:
            self.Q = T + done - 1
        else:  # eager rounds (kinds.rounds_for): the slots after y, forced tokens spliced in (forced.py)
            self.Q, geometry = code_positions(layout, T, done - 1), slot_geometry(layout, done, gamma)
            steps = [code_steps(layout, im.n + g - 1) - code_steps(layout, im.n - 1) for im, g in zip(images, self.g)]
            self.rows_verified = [verify_rows(layout, im.n, g) for im, g in zip(images, self.g)]
        self.geometry, self.steps = geometry, steps  # steps: the slots after y each image's drafts span
        out = step(self.drafter, emb, hidden, pos, slots, visible, None if self.static else self.rows,
                   (pending - 1).clamp(min=0), self.Q, done, gs, u, params, gamma if self.static else max(steps),
                   layout, geometry, **({"states": True} if self.drafter_states else {}))
        (X, q), self.states = out[:2], out[2] if self.drafter_states else None
        if self.static:
            X, q = X[self.index], q[self.index]
        for im, k in zip(images, steps):
            im.stats.drafter_forwards += k  # the catch-up, then k - 1 steps (forced slots included)
        self.X, self.q = X, q

    def verify(self, images: list[Image], width: int | None) -> tuple[Tensor, Tensor]:
        """One target forward over every active image's [y, drafts]: (logits, hidden) [R * n, 1 + G, ...] (width:
        target_forward's static shape)."""
        R = images[0].pend_emb.shape[0]
        seq, lengths = self.verify_ids()
        self.seq = seq
        pos, slots, visible = ragged(self.Q, lengths, seq.shape[1], R, self.target.cache_len)
        for im in images:
            im.stats.target_forwards += 1
        return target_forward(self.target, self.rows, in_rows(seq, R), pos, slots, visible, width)

    def verify_ids(self) -> tuple[Tensor, Tensor]:
        """Every active image's verify inputs, as the target's ids [n, S]: y, then its drafts (under a layout: the
        slots after y, drafts and the forced tokens between them, up to the bonus code's row), and their lengths
        [n] on the device."""
        layout = self.layout
        y = self.buf[self.index, self.done - 1]
        if layout is None:
            return torch.cat([y[:, None], self.X], 1), self.gs + 1
        forced, code_slot, _ = self.geometry
        ids = slot_ids(layout, forced, code_slot, self.X)
        (lengths,) = to_device(self.device, self.rows_verified)
        return torch.cat([(y + layout.code_offset)[:, None], ids], 1)[:, : max(self.rows_verified)], lengths

    def commit(self, images: list[Image], logits: Tensor, hidden: Tensor) -> None:
        """Acceptance and the next token of every active image on the device, then the one read of the round."""
        n, R, T, N = len(images), images[0].pend_emb.shape[0], self.target.args.cls_token_num, self.N
        layout = self.layout
        if layout is not None:  # each code's predicting row (the eol's after a row end), over the image head
            logits = code_logits(layout, logits, self.geometry[1])
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
            if layout is not None:  # the verified rows up to the next code's predicting row, eol tokens included
                base, r = code_steps(layout, im.n - 1), code_steps(layout, im.n + a_i) - code_steps(layout, im.n - 1) - 1
                fed = torch.cat([self.seq[i, 1 : r + 1], self.buf[im.index, im.n + a_i : im.n + a_i + 1]
                                 + layout.code_offset])
                im.pend_emb = self.drafter.embed_tokens(fed).expand(R, -1, -1)
                im.pend_h = hidden[i::n, : r + 1]
                im.start = T + base
                im.n += a_i + 1
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
