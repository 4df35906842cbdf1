"""The rounds of draft trees (static trees, EAGLE-2 dynamic trees) in speculative.decode's loop: rounds.py's ragged
rows with the shapes of trees.py.

Per image the tree is trees.py's own: it grows in the image's `growth` (a generator that asks for the drafter
passes it needs, trees.TreePass, and draws from the image's uniforms: a static tree's children, cut to the tokens
the image has left, drawn ahead from its generator for all images in one copy). Batched, over the images still
decoding, are the forwards and the acceptance:
1. draft: ONE drafter catch-up forward (DrafterRounds.catch_up), the root distributions of every image at once, then
   each round of growth steps: ONE drafter forward over the passes every still-growing image asks for (a static
   tree's level, a dynamic tree's expansion), each row at its own positions Q_b + pos, slots Q_b + node slots and
   tree mask over the slots from Q_b on, padded to the widest;
2. verify: ONE target forward over every image's [y, nodes] (RoPE positions Q_b + depth, slots Q_b, Q_b + 1, ..,
   the tree mask over [y, nodes]), padded to the largest tree (cut trees near an image's end are smaller);
3. accept every image's tree at once on the device (greedy: `greedy_paths`; sampling: `walk`, from each image's
   uniforms), one read per round; the accepted paths' target cache entries move into consecutive slots in one per-row move
   (GPT.keep_rows), and the true hidden states of y and the accepted nodes become the image's next catch-up
   inputs.
Padding queries sit at position 0 and write the scratch slot (rounds.SCRATCH) past the tree slots.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from lantern.engine.rules.acceptance import AcceptRule, accept_probability, greedy_accept, residual_rows, sibling_budget
from lantern.engine.decoding.rounds import (DrafterRounds, Image, batch_probs, cache_rows, in_rows, pack,
                                             target_forward, to_device)
from lantern.engine.decoding.sampling import Uniforms, draw
from lantern.engine.decoding.stats import free_read
from lantern.engine.decoding.trees import Draft, TreePass, _visible
from lantern.engine.decoding.forced_trees import (depth_widths, drafter_pass, layout_extras, spliced_path,
                                                  spliced_tree, tree_depth, tree_plan)
from lantern.engine.models.layout import image_logits


def per_row(pos: list[Tensor], slots: list[Tensor], visible: list[Tensor], R: int, cache_len: int):
    """(pos, slots, visible) [R * n, S, ...] in forward layout from each image's [S_i] positions and slots and
    [S_i, cache_len] visibility, padded to the longest: padding at position 0 writes the scratch slot, sees nothing
    but it."""
    S = max(len(p) for p in pos)
    pos = torch.stack([F.pad(p, (0, S - len(p))) for p in pos])
    slots = torch.stack([F.pad(s, (0, S - len(s)), value=cache_len - 1) for s in slots])
    visible = torch.stack([F.pad(v, (0, 0, 0, S - len(v))) for v in visible])
    return in_rows(pos, R), in_rows(slots, R), in_rows(visible, R)


class TreeRounds(DrafterRounds):
    """Rounds of a static or dynamic draft tree (trees.TreeShape) for a batch."""

    def cache_extras(self) -> tuple[int, int]:
        if self.layout is None:
            return self.drafting.target_extra, self.drafting.drafter_extra
        return layout_extras(self.drafting, self.layout)

    def forward_nodes(self, images: list[Image], tokens: list[Tensor], hidden: list[Tensor], pos: list[Tensor],
                      slots: list[Tensor], visible: list[Tensor], rows: Tensor | None) -> Tensor:
        """One drafter forward over some nodes of each of `images` (ids tokens [S_i], parents' predicted states
        hidden [R, S_i, d], positions and slots [S_i], visibility [S_i, cache_len]; rows: their cache rows, None:
        all): the predicted states [R * n, S, d] in forward layout."""
        drafter, R, L = self.drafter, images[0].pend_emb.shape[0], self.drafter.cache_len
        sizes = [len(t) for t in tokens]
        S = max(sizes)
        emb = drafter.embed_tokens(torch.cat(tokens))
        emb = pack([e[None].expand(R, -1, -1) for e in emb.split(sizes)], S)
        pos, slots, visible = per_row(pos, slots, visible, R, L)
        return drafter.forward_rows(emb, pack(hidden, S), pos, slots, visible, rows)

    def eol_passes(self, images: list[Image], out: Tensor, at: list[int], offsets: list[int],
                   slots: list[Tensor], visible: list[Tensor], rows: Tensor | None) -> Tensor:
        """Under a layout, the drafter fed the eol after the nodes of images `at` (their states in `out` [R * n, S,
        d]; offsets: positions from Q, one less than the eol's; slots: tree slots, the eol's m more; visible: the
        nodes'): `out` with those images' rows replaced by the eol's predicted states. The forward runs over every
        image's rows (the same cache rows, no copy to the device); the others' answers, written to their own unread
        eol slots, are dropped."""
        layout, device, n, m = self.layout, self.device, len(images), self.drafting.drafter_extra
        R, S = images[0].pend_emb.shape[0], out.shape[1]
        out = out.view(R, n, S, -1)
        sizes = [len(s) for s in slots]
        pos = [torch.full((s,), im.Q + o + 1, device=device) for im, o, s in zip(images, offsets, sizes)]
        eol = self.forward_nodes(images, [torch.full((s,), layout.eol, device=device) for s in sizes],
                                 [out[:, i, :s] for i, s in enumerate(sizes)], pos,
                                 [im.Q + m + s for im, s in zip(images, slots)], visible, rows)
        eol = eol.view(R, n, eol.shape[1], -1)
        out = out.clone()
        for i in at:
            out[:, i, : sizes[i]] = eol[:, i, : sizes[i]]
            images[i].stats.drafter_forwards += 1
        return out.view(R * n, S, -1)

    def tree_passes(self, images: list[Image], asks: list[TreePass], rows: Tensor | None,
                    done: Tensor | None) -> list[tuple[Tensor, Tensor]]:
        """The drafter passes `asks` of `images` (one each) in one forward: each image's answer (hidden
        [R, S_i, d], distributions [S_i, V]); rows, done [n]: the images' cache rows and tokens done on the device,
        when they are all the round's images at one depth (None: sent). Under a layout (forced_trees.py) the passes
        sit at their spliced positions, see their ancestors' eol slots, and the passes at a row end are followed by
        the eol's (one forward more), whose states answer them."""
        drafter, device, layout = self.drafter, self.device, self.layout
        n, L = len(images), drafter.cache_len
        sizes = [len(a.tokens) for a in asks]
        S = max(sizes)
        if layout is None:
            offsets, anc, at = [a.pos for a in asks], [a.anc for a in asks], []
        else:
            m = self.drafting.drafter_extra
            geo = [drafter_pass(self.plans[im.index], a.pos, a.anc, a.slots, m) for im, a in zip(images, asks)]
            offsets, anc, at = [g[0] for g in geo], [g[1] for g in geo], [i for i, g in enumerate(geo) if g[2]]
        visible = [_visible(s, L, im.Q, v) for im, s, v in zip(images, sizes, anc)]
        slots = [a.slots for a in asks]
        if done is None:
            rows = cache_rows(images, self.B, images[0].pend_emb.shape[0], device)
            (index,) = to_device(device, [im.n + a.pos + 1 for im, a in zip(images, asks)])
        else:  # every ask at the same depth
            index = done + asks[0].pos + 1
        ids = [a.tokens if layout is None else a.tokens + layout.code_offset for a in asks]
        pos = [torch.full((s,), im.Q + o, device=device) for im, o, s in zip(images, offsets, sizes)]
        out = self.forward_nodes(images, ids, [a.hidden for a in asks], pos, [im.Q + s for im, s in zip(images, slots)],
                                 visible, rows)
        if at:
            out = self.eol_passes(images, out, at, offsets, slots, visible, rows)
        head = drafter.head(out)
        q = batch_probs(head if layout is None else image_logits(layout, head), self.params,
                        index[:, None].expand(-1, S))
        return [(out[i::n, :s], q[i, :s]) for i, s in enumerate(sizes)]

    def prefill(self, cond, generators, timer, cond_mask, static) -> list[Image]:
        images = super().prefill(cond, generators, timer, cond_mask, static)
        for im, first in zip(images, self.first.tolist()):
            im.tokens = [first]
        return images

    def draft(self, images: list[Image]) -> None:
        """Every active image's tree grown in its `growth`, the drafter forwards batched. Sets each image's
        `draft`."""
        n, R, layout = len(images), images[0].pend_emb.shape[0], self.layout
        rows = cache_rows(images, self.B, R, self.device)
        pred = self.catch_up(images, rows)
        (done,) = to_device(self.device, [im.n for im in images])
        if layout is not None:  # where this round's eols fall; y's own, fed before the root's children are drawn
            m = self.drafting.drafter_extra
            self.plans = {im.index: tree_plan(layout, im.n - 1, min(tree_depth(self.drafting), self.N - im.n),
                                              m, self.device) for im in images}
            at = [i for i, im in enumerate(images) if 0 in self.plans[im.index].ends]
            if at:
                none = torch.zeros(1, 2 * m + 1, dtype=torch.bool, device=self.device)
                pred = self.eol_passes(images, pred.reshape(R * n, 1, -1), at, [-1] * n,
                                       [torch.full((1,), m, device=self.device)] * n,
                                       [_visible(1, self.drafter.cache_len, im.Q, none) for im in images], rows)
                pred = pred.view(R, n, -1)
        head = self.drafter.head(pred.reshape(R * n, 1, -1))
        q_root = batch_probs(head if layout is None else image_logits(layout, head), self.params, done[:, None])[:, 0]
        growing, asks = {}, {}

        def advance(i: int, answer) -> None:
            try:
                asks[i] = growing[i].send(answer)
            except StopIteration as done:
                images[i].draft = done.value
                images[i].stats.drafter_forwards += done.value.drafter_passes
                del growing[i], asks[i]

        # a sampled static tree's uniforms, drawn ahead from each image's generator, in one copy
        need = [self.drafting.uniforms(self.N - im.n) for im in images]
        ahead = Uniforms([im.generator for im in images], max(need), self.device) if max(need) else None
        for i, im in enumerate(images):
            growing[i] = self.drafting.growth(pred[:, i : i + 1], q_root[i], self.params, self.N - im.n,
                                              None if ahead is None else ahead.u[i])
            asks[i] = None
            advance(i, None)
        if ahead is not None:
            ahead.used(need)
        while asks:
            order = list(asks)
            # all the round's images still grow, at one depth: their rows and counts are on the device already
            every = len(order) == n and len({asks[i].pos for i in order}) == 1
            answers = self.tree_passes([images[i] for i in order], [asks[i] for i in order], rows if every else None,
                                       done if every else None)
            for i, answer in zip(order, answers):
                advance(i, answer)

    def verify(self, images: list[Image], width: int | None) -> tuple[Tensor, Tensor]:
        """One target forward over every image's [y, nodes] (RoPE positions Q + depth, slots Q, Q + 1, .., the tree
        mask): (logits, hidden) [R * n, 1 + most nodes, ...]; image i's rows i::n, its first 1 + nodes positions."""
        R, L = images[0].pend_emb.shape[0], self.target.cache_len
        seqs, pos, slots, visible = self.verify_inputs(images)
        S = max(len(s) for s in seqs)
        tokens = pack([s.expand(R, -1)[..., None] for s in seqs], S)[..., 0]
        pos, slots, visible = per_row(pos, slots, visible, R, L)
        for im in images:
            im.stats.target_forwards += 1
        return target_forward(self.target, cache_rows(images, self.B, R, self.device), tokens, pos, slots, visible,
                              width)

    def verify_inputs(self, images: list[Image]) -> tuple[list[Tensor], list[Tensor], list[Tensor], list[Tensor]]:
        """Each image's verify tree as the target's ids [S_i] (under a layout [y, nodes, eol nodes], whose code rows
        commit reads from self.spliced), RoPE positions and cache slots [S_i] (rows that are not real: position 0,
        the scratch slot) and visibility [S_i, cache_len]."""
        device, L = self.device, self.target.cache_len
        zero = torch.zeros(1, dtype=torch.long, device=device)
        drafts: list[Draft] = [im.draft for im in images]
        last, c0 = to_device(device, [im.tokens[-1] for im in images], [im.n - 1 for im in images])
        if self.layout is None:
            seqs = [torch.cat([last[i : i + 1], d.tokens]) for i, d in enumerate(drafts)]
            offsets, blocks = [torch.cat([zero, d.depth]) for d in drafts], [d.block for d in drafts]
            real = [torch.ones(len(s), dtype=torch.bool, device=device) for s in seqs]
        else:  # [y, nodes, eol nodes] (forced_trees.spliced_tree); commit reads self.spliced
            widths = depth_widths(self.drafting)
            self.spliced = [spliced_tree(self.layout, d, self.plans[im.index], widths, last[i : i + 1],
                                         c0[i : i + 1], self.N) for i, (im, d) in enumerate(zip(images, drafts))]
            seqs, offsets, blocks, real = ([t[j] for t in self.spliced] for j in range(4))
        pos = [torch.where(r, im.Q + o, 0) for im, o, r in zip(images, offsets, real)]
        slots = [torch.where(r, im.Q + torch.arange(len(s), device=device), L - 1)
                 for im, s, r in zip(images, seqs, real)]
        return seqs, pos, slots, [_visible(len(s), L, im.Q, b) & r[:, None]
                                  for im, b, s, r in zip(images, blocks, seqs, real)]

    def commit(self, images: list[Image], logits: Tensor, hidden: Tensor) -> None:
        """The trees' acceptance and the commit for every active image; the cache moves of all of them at once.
        Every image's acceptance on the device at once, one read per round: greedy (`greedy_paths`) and sampling
        (`walk`), under every rule."""
        greedy = self.params.greedy
        walking = not greedy
        device, N, n, R = self.device, self.N, len(images), images[0].pend_emb.shape[0]
        used = torch.zeros(n, dtype=torch.long, device=device)  # each image's acceptance uniforms
        drafts = [im.draft for im in images]
        M = max(len(d.tokens) for d in drafts)
        D = max(d.drafter_passes for d in drafts) + 1 if walking else M  # the longest path
        pad = lambda t, value=0: F.pad(t, (0, M - len(t)), value=value)  # noqa: E731 - nodes [m] -> [M]
        X = torch.stack([pad(d.tokens) for d in drafts])
        depth = torch.stack([pad(d.depth) for d in drafts])
        static = drafts[0].children is not None  # a static shape's children are host lists, a dynamic tree's not
        C = max(d.kids.shape[1] if d.children is None else max(map(len, d.children)) for d in drafts)
        kids = [c + [-1] * (C - len(c)) for d in drafts for c in d.children + [[]] * (M + 1 - len(d.children))] \
            if static and walking else []
        q_row = [r for d in drafts for r in (d.q_row or []) + [0] * (M + 1 - len(d.q_row or []))] if walking else []
        done, kids, q_row = to_device(device, [im.n for im in images], [k for c in kids for k in c], q_row)
        layout = self.layout
        if layout is None:
            logits = logits[:, : 1 + M]
        else:  # each node's children read its eol's row where it has one, over the image head
            code_rows = torch.stack([F.pad(t[4], (0, M + 1 - len(t[4]))) for t in self.spliced])  # [n, 1 + M]
            V = logits.shape[-1]
            logits = logits.view(R, n, -1, V).gather(2, code_rows[None, ..., None].expand(R, -1, -1, V))
            logits = image_logits(layout, logits.view(R * n, M + 1, V))
        P = batch_probs(logits, self.params, done[:, None] + F.pad(depth, (1, 0)))
        if greedy:
            path, p = greedy_paths(P, drafts, self.table, self.rule)
            token = p.argmax(-1)
        else:
            ok = torch.stack([pad(torch.ones_like(d.tokens, dtype=torch.bool) if d.ok is None else d.ok, False)
                              for d in drafts])
            q = None  # deterministic drafts (a dynamic tree)
            if drafts[0].q is not None:
                rows_q = max(d.q.shape[0] for d in drafts)
                q = torch.stack([F.pad(d.q, (0, 0, 0, rows_q - d.q.shape[0])) for d in drafts])
            kids = kids.view(n, M + 1, C) if static else torch.stack(
                [F.pad(d.kids, (0, C - d.kids.shape[1], 0, M + 1 - d.kids.shape[0]), value=-1) for d in drafts])
            ahead = Uniforms([im.generator for im in images], D * C + 1, device)
            fanout = getattr(self.drafting, "fanout", None)  # a static shape's; a cut tree's nodes have no more
            path, p, used = walk(P, q, X, ok, kids, q_row.view(n, M + 1), ahead.u, self.table, self.rule, D,
                                 fanout)
            token = draw(p, ahead.u.gather(1, used[:, None])[:, 0])
        a = (path >= 0).sum(-1)
        seq = F.pad(X.gather(1, path.clamp(min=0)), (0, 1)).scatter(1, a[:, None], token[:, None])  # drafts, next
        parts = [torch.stack([a, used, depth.max(-1).values], 1), path, seq]
        if layout is not None:  # the rows predicting the children of y and of each path node (an eol's, or its own)
            parts.append(code_rows.gather(1, F.pad(path + 1, (1, 0)).clamp(min=0)))
        read = torch.cat(parts, 1).tolist()  # the one read
        emb, at = self.drafter.embed_tokens(seq), F.pad(path + 1, (1, 0))
        hidden = hidden.view(R, n, hidden.shape[1], -1)
        moves, counts, kept, fed = [], [], {}, []
        for i, (im, r) in enumerate(zip(images, read)):
            a_i, used_i, deepest = r[:3]
            nodes, toks = r[3 : 3 + a_i], r[3 + D : 3 + D + a_i + 1]
            if layout is None:
                moves += [(im.index + k * self.B, im.Q + 1 + s, im.Q + 1 + j) for k in range(R)
                          for j, s in enumerate(nodes) if s != j]
            else:  # the verify rows kept, eol nodes included, in sequence order from y's
                kept[i] = spliced_path([0] + [s + 1 for s in nodes], r[4 + 2 * D : 5 + 2 * D + a_i])
                moves += [(im.index + k * self.B, im.Q + s, im.Q + 1 + j) for k in range(R)
                          for j, s in enumerate(kept[i][1:]) if s != j + 1]
            im.stats.accepted_per_step.append(a_i)
            im.stats.tree_depth.append(deepest)
            finished = im.n + a_i == N  # the drafts completed the image: a bonus token would lie past its end
            counts.append(used_i + (not finished))
            im.tokens += toks[: a_i + (not finished)]
            im.n = len(im.tokens)
            if not finished and layout is None:
                im.pend_emb = emb[i, : a_i + 1].expand(R, -1, -1)
                im.pend_h = hidden[:, i, at[i, : a_i + 1]]
                im.start, im.Q = im.Q, im.Q + a_i + 1
            elif not finished:  # the kept rows' states, paired with the ids after them and the next code
                fed.append((i, toks[a_i] + layout.code_offset))
        if fed:
            self.spliced_inputs(images, [kept[i] for i, _ in fed], fed, hidden)
        if not greedy:
            ahead.used(counts)
        if moves:
            self.target.keep_rows(*to_device(device, *zip(*moves)))

    def spliced_inputs(self, images: list[Image], kept: list[list[int]], fed: list[tuple[int, int]],
                       hidden: Tensor) -> None:
        """Under a layout, the drafter's next catch-up inputs of the images `fed` ((their index in `images`, the id of
        their next code)): the target's states at their kept verify rows, paired with the ids after them (eol
        tokens included) and the next code; the next y sits after the kept rows."""
        R, sizes = hidden.shape[0], [len(k) for k in kept]
        (flat,) = to_device(self.device, [r for k in kept for r in k[1:]] + [t for _, t in fed])
        rows, nxt = flat[: sum(sizes) - len(kept)].split([s - 1 for s in sizes]), flat[sum(sizes) - len(kept) :]
        for (i, _), at, size, t in zip(fed, rows, sizes, nxt):
            im = images[i]
            ids = torch.cat([self.spliced[i][0][at], t[None]])
            im.pend_emb = self.drafter.embed_tokens(ids).expand(R, -1, -1)
            im.pend_h = hidden[:, i, F.pad(at, (1, 0))]  # y's row, then the kept ones
            im.start, im.Q = im.Q, im.Q + size


def settled(live: Tensor) -> bool:
    """On a CPU: whether no tree of the walk has a candidate left in `live`, so that the rest of a loop would change
    nothing (every update in it is masked by `live`) and may be skipped; a CPU answers without a device sync. A GPU
    would sync once per child: there the walk runs every step (always False). On the toy world's LANTERN++ trees
    this cuts a round's bookkeeping by more than half (docs/decoders.md)."""
    return free_read(live) and not bool(live.any())


def walk(P: Tensor, q: Tensor, X: Tensor, ok: Tensor, kids: Tensor, q_row: Tensor, u: Tensor, table: Tensor | None,
         rule: AcceptRule, D: int, fanout: list[int] | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """The sampled acceptance of n trees at once, on the device: P [n, 1 + M, V] the target over [y, nodes], q
    [n, rows, V] the drafter rows the children were drawn from (q_row [n, 1 + M] a node's row), X [n, M] tokens, ok
    [n, M] the children offered, kids [n, 1 + M, C] each node's children in order (-1: none), u [n, >= D C + 1]
    each image's uniforms (a visited node takes one per offered child, in order), D the deepest node; fanout (a
    static shape's, host ints) bounds the children tried at each depth, which spares a GPU the steps no tree can
    take. From y, each visited node's children are tried in order, as acceptance.verify_candidates tries them one
    tree at a time (tests/test_tree_walk.py holds the two equal for every rule): accept while u < min(1, p~(x) /
    q'(x)), residualising p and q after each rejection, siblings sharing a TV budget where the rule says so, a
    rule's own test and residual (Cool-SD's at the children's depth, GSD's) or, for LANTERN-TV, exact verification
    toward the node's relaxed target. Returns (the accepted nodes [n, D], -1 past the path; the next token's distribution [n, V]; the
    uniforms used [n], the next token's column)."""
    n, C = X.shape[0], kids.shape[2]  # q None: deterministic drafts
    rows = torch.arange(n, device=X.device)
    node = torch.full((n,), -1, dtype=torch.long, device=X.device)
    alive = torch.ones(n, dtype=torch.bool, device=X.device)
    used = torch.zeros(n, dtype=torch.long, device=X.device)
    path = torch.full((n, D), -1, dtype=torch.long, device=X.device)
    p = P[:, 0]
    shared = sibling_budget(None if q is None else q[0, 0], rule) is not None  # bounded LANTERN, q = 1 drafts
    retargets = hasattr(rule.impl, "target")
    tried = AcceptRule("exact") if retargets else rule
    for step in range(D + 1):
        if settled(alive):
            break
        cands = kids[rows, node + 1]  # [n, C]
        offered = (cands >= 0) & ok.gather(1, cands.clamp(min=0)) & alive[:, None]
        p = torch.where(alive[:, None], P[rows, node + 1], p)
        qq = None if q is None else q[rows, q_row[rows, node + 1]]
        if retargets:  # LANTERN-TV: one relaxed target per node, toward which its children are verified exactly
            toward = qq if qq is not None else p.new_zeros(p.shape).scatter_add(
                1, X.gather(1, cands.clamp(min=0)), offered.to(p.dtype)).clamp(max=1.0)  # the candidates' indicator
            p = torch.where(offered.any(-1, keepdim=True), rule.impl.target(p, toward, table), p)
        budget = torch.full((n,), rule.delta, dtype=p.dtype, device=p.device) if shared else None
        rank = offered.long().cumsum(-1) - 1
        chosen = torch.full((n,), -1, dtype=torch.long, device=X.device)
        for j in range(C if fanout is None else min(C, fanout[step] if step < len(fanout) else 0)):
            if settled(offered[:, j:] & (chosen < 0)[:, None]):
                break
            live = offered[:, j] & (chosen < 0)
            x = X.gather(1, cands[:, j : j + 1].clamp(min=0))[:, 0]
            A, c, m = accept_probability(p, qq, x, table, tried, None if budget is None else budget[:, None], step)
            take = live & (u.gather(1, (used + rank[:, j].clamp(min=0))[:, None])[:, 0] < A)
            chosen = torch.where(take, cands[:, j], chosen)
            rejected = live & ~take
            if budget is not None:
                left = p.sum(-1) - p.gather(1, x[:, None])[:, 0] - c
                budget = torch.where(rejected, torch.where(left > 0, (budget - c).clamp(min=0) / left, 0.0), budget)
            p = torch.where(rejected[:, None], residual_rows(p, qq, x, m, table, tried), p)
            if qq is not None:
                gone = qq.scatter(1, x[:, None], 0.0)
                total = gone.sum(-1, keepdim=True)
                qq = torch.where(rejected[:, None], torch.where(total > 0, gone / total, gone), qq)
        used = used + offered.sum(-1)
        alive = alive & (chosen >= 0)
        if step < D:
            path[:, step] = torch.where(alive, chosen, -1)
        node = torch.where(alive, chosen, node)
    return path, p, used


def greedy_paths(P: Tensor, drafts: list[Draft], table: Tensor | None, rule: AcceptRule) -> tuple[Tensor, Tensor]:
    """Greedy acceptance of n trees at once, on the device: P [n, 1 + M, V] the target over each image's [y, nodes]
    (M the most nodes). Every node of every tree is tested in one call (acceptance.greedy_accept); a node reaches
    its depth when its whole path passes. The accepted path ends on the deepest node that does. Relaxed rules can
    pass several siblings, so equally deep paths tie. Ours: the first such node in node order (the higher-ranked
    branch). Under rule.authors_ties on a leaf-ordered (dynamic) tree, the authors': the first leaf, in node order,
    whose deepest accepted ancestor is that deep, cut at that depth (evaluate_posterior's argmax over retrieve
    rows); the accepted length is the same, the emitted tokens can differ. Returns (the accepted nodes [n, M] from y
    down, -1 past the path; the target distribution after them [n, V])."""
    M = P.shape[1] - 1
    fill = lambda t: F.pad(t, (0, M - len(t)), value=-1)  # noqa: E731 - nodes [m] -> [M]
    X, parent = (torch.stack([fill(t) for t in ts]) for ts in zip(*((d.tokens, d.parent) for d in drafts)))
    depth = torch.stack([F.pad(d.depth, (0, M - len(d.tokens))) for d in drafts])
    anc = torch.stack([F.pad(d.block[1:, 1:], (0, M - len(d.tokens)) * 2) for d in drafts])  # [n, M, M]: i's path
    return tree_greedy_paths(P, X, parent, depth, anc, table, rule, drafts[0].leaf_order)


def tree_greedy_paths(P: Tensor, X: Tensor, parent: Tensor, depth: Tensor, anc: Tensor, table: Tensor | None,
                      rule: AcceptRule, leaf_order: bool = False) -> tuple[Tensor, Tensor]:
    """greedy_paths over trees given as tensors: X, parent, depth [n, M] (a node that is not drafted: depth 0) and
    anc [n, M, M] (each node's ancestors and itself)."""
    n, M = P.shape[0], P.shape[1] - 1
    rows = torch.arange(n, device=P.device)[:, None]
    ok = greedy_accept(P[rows, parent + 1], X.clamp(min=0), table, rule)
    reach = torch.where((anc & ~ok[:, None, :]).any(-1), 0, depth)  # padding: depth 0, on no path
    best = reach.argmax(-1)  # the first deepest: ties go to the higher-ranked branch
    top = reach.gather(1, best[:, None])  # [n, 1]
    if rule.authors_ties and leaf_order:
        leaf = anc.sum(1) == 1  # a node on no other node's path (its own row holds it once)
        row_reach = torch.where(anc, reach[:, None, :], 0).amax(-1)  # a leaf's row: its deepest accepted ancestor
        first = (leaf & (row_reach == top)).int().argmax(-1)
        best = (anc[rows[:, 0], first] & (reach == top)).int().argmax(-1)
    on = anc[rows[:, 0], best] & (top > 0)  # the path's nodes; parents precede children
    node = torch.arange(M, device=P.device)
    path = torch.where(on, node, M).sort(-1).values
    return torch.where(path < M, path, -1), P[rows[:, 0], torch.where(top[:, 0] > 0, best + 1, 0)]
