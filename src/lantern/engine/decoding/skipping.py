"""VVS verification skipping (Dong et al., "VVS: Accelerating Speculative Decoding for Visual
Autoregressive Model via Partial Verification Skipping", arXiv 2511.13587; the authors' code github.com/HyattDD/VVS,
models/skip_utils_llamagen.py, a fork of the LANTERN authors'): SkippingChainRounds, chain_rounds.ChainRounds with
a round schedule (chain.Chain.skip_every = i >= 2: the authors' `uniform` policy), and SkippingTreeRounds, the same
on static and dynamic trees, with also the authors' `dynamic` policy (`Schedule`, `path_similarity`).

On a chain, every i-th round of an image (its rounds i, 2i, ..., counted from 1) skips the target: the image takes
no part in the round's verify forward, and its whole chain x_1..x_g is committed unverified, x_g becoming its newest token y
(the authors' skip_evaluate on a chain: the one path, cut to the mean path length, which on a chain is the whole
path). The round emits g tokens and no bonus token: accepted_per_step records g - 1, the last committed draft
standing where the bonus token stands in a verified round (the authors' count: accept_length, not + 1), and
stats.skipped_rounds counts it. tau = tokens / target forwards counts those tokens as the paper counts them.
- The drafter's next catch-up reads, for the unverified positions, the drafter's own predicted hidden states (those
  its drafting steps fed itself: chain_rounds.chain_drafts' states); the authors reuse the last verified target
  features instead (`reuse_prev`).
- The next round's verify re-runs the unverified positions first, [x_1..x_{g-1}, y, new drafts] with the old y
  before them, in one target forward, so the target's cache gets its entries for them (their logits are not used:
  VVS never revisits a committed token; tests/test_skipping.py holds the cache equal to a fresh prefill's); their
  true hidden states then replace the predicted ones in the drafter's cache (its catch-up re-runs them too).
- Two rounds in a row never skip, so at most one path's positions wait for a verify.
Trees (SkippingTreeRounds) do the same with one drafted path; their docstring says which path and which features.
What VVS guarantees: nothing. A skipped round emits the drafter's tokens, so the output moves toward the drafter's
distribution; tests/test_skipping.py measures the joint distance on a tiny vocabulary (docs/skipping.md).
Compiled rounds do not skip: speculative.decode runs a skipping schedule eagerly.
Under a layout with forced structural tokens (forced.py, forced_trees.py; docs/chameleon-layout.md) the unverified
inputs are the target's ids from the old y to the new one, the eol tokens between the committed codes among them,
so the next verify feeds each eol at its position before any later code; drafts and acceptance stay on codes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from lantern.engine.decoding.chain import accept_chains
from lantern.engine.decoding.chain_rounds import ChainRounds
from lantern.engine.decoding.forced import code_logits
from lantern.engine.decoding.rounds import Image, batch_probs, forward_rows_of, in_rows, target_forward, to_device
from lantern.engine.decoding.sampling import Uniforms
from lantern.engine.decoding.tree_rounds import TreeRounds
from lantern.engine.models.layout import code_steps


def skips(drafting) -> bool:
    """Whether a drafting kind's rounds follow a VVS schedule (every i-th round, or by similarity on trees)."""
    return bool(getattr(drafting, "skip_every", 0)) or getattr(drafting, "skip_similarity", None) is not None


def attach_codebook(drafting, codebook: Tensor, vocab: int, device) -> None:
    """Give a tree with a `similarity` schedule the VQ codebook [V, D] its paths are compared by."""
    from lantern.errors import UserError

    if codebook.shape[0] != vocab:
        raise UserError(f"skip: similarity: the VQ codebook has {codebook.shape[0]} codes; the target has {vocab}")
    object.__setattr__(drafting, "skip_codebook", codebook.to(device))


def path_similarity(parent: list[int], tokens: Tensor, codebook: Tensor, decay: float = 0.9) -> float:
    """The authors' draft agreement (skip_utils_llamagen.compute_similarity_pytorch_jit, mode exp_decay): the leaf
    paths in node order, every second one kept (their candidates[::2]); per depth l the cosine similarity of two
    paths' codes' embeddings (0 where either path is shorter), weighted decay^l / sum over the longest path; the mean
    over pairs of paths. Fewer than two paths: -inf (never skip)."""
    leaves = sorted(set(range(len(parent))) - set(parent))[::2]
    if len(leaves) < 2:
        return float("-inf")
    paths = []
    for leaf in leaves:
        path = [leaf]
        while parent[path[-1]] >= 0:
            path.append(parent[path[-1]])
        paths.append(path[::-1])
    L = max(map(len, paths))
    index = torch.tensor([p + [-1] * (L - len(p)) for p in paths], device=tokens.device)
    valid = index >= 0
    emb = F.normalize(codebook[tokens[index.clamp(min=0)]].double(), dim=-1) * valid[..., None]  # [P, L, D]
    sims = torch.einsum("ild,jld->lij", emb, emb)
    w = decay ** torch.arange(L, dtype=torch.float64, device=tokens.device)
    pair = torch.einsum("l,lij->ij", w / w.sum(), sims)
    i, j = torch.triu_indices(len(paths), len(paths), 1)
    return pair[i, j].mean().item()


class Schedule:
    """The round schedule both kinds share: which active images skip this round (self.skip: every skip_every-th
    round, set before drafting; or, on trees with skip_similarity, after drafting, when the round's draft paths
    agree: never in an image's first 6 tokens (the authors' new_token <= 5) nor right after a skipped round), rounds
    taken, and per image index the inputs a skipped round left unverified: the target's ids from the last verified
    y up to the newest y (self.waiting; under a layout the forced tokens between the codes too, so that the next
    verify feeds every eol before the codes after it) and their count (self.unverified)."""

    def prefill(self, cond, generators, timer, cond_mask, static) -> list[Image]:
        images = super().prefill(cond, generators, timer, cond_mask, static)
        self.rounds_done = [0] * self.B  # per image index
        self.unverified = [0] * self.B  # inputs whose target cache entries are still missing
        self.waiting: dict[int, Tensor] = {}  # their ids
        return images

    def draft(self, images: list[Image]) -> None:
        every, threshold = self.drafting.skip_every, getattr(self.drafting, "skip_similarity", None)
        if every:
            self.skip = [(self.rounds_done[im.index] + 1) % every == 0 for im in images]
        super().draft(images)
        if not every:
            codebook = self.drafting.skip_codebook
            self.skip = [im.n > 6 and not self.unverified[im.index]
                         and path_similarity(im.draft.parent.tolist(), im.draft.tokens, codebook) >= threshold
                         for im in images]

    def before(self, indices: list[int], smax: int) -> Tensor:
        """The unverified ids of the images `indices`, right-aligned in [n, smax] (id 0 in front: padding)."""
        none = torch.zeros(0, dtype=torch.long, device=self.device)
        return torch.stack([F.pad(self.waiting[i] if self.unverified[i] else none, (smax - self.unverified[i], 0))
                            for i in indices])


class SkippingChainRounds(Schedule, ChainRounds):
    """Chain rounds where every skip_every-th round of an image commits its drafts without a verify. Under a layout
    (forced.py) a skipped round commits the slots through x_g: its codes and the forced tokens between them wait
    together for the next verify."""

    drafter_states = True

    def verify(self, images: list[Image], width: int | None) -> tuple[Tensor | None, Tensor | None]:
        """One target forward over the verifying images' [unverified inputs, y, drafts] (under a layout, as ids,
        the forced tokens among them at their slots), the unverified ones (s_b of them) right-aligned before y at
        column smax = max s_b, padding in front: (logits, hidden) [R * n_v, smax + the widest [y, drafts], ...], or
        (None, None) when every active image skips."""
        self.seq, lengths = self.verify_ids()  # every image's: a skipped round commits from it
        self.verifying = [i for i, skip in enumerate(self.skip) if not skip]
        if not self.verifying:
            return None, None
        R, L = images[0].pend_emb.shape[0], self.target.cache_len
        waiting = [self.unverified[images[i].index] for i in self.verifying]
        self.smax = smax = max(waiting)
        self.vsel, s = to_device(self.device, self.verifying, waiting)
        self.vseq = seq = torch.cat([self.before([images[i].index for i in self.verifying], smax),
                                     self.seq[self.vsel]], 1)
        j = torch.arange(seq.shape[1], device=self.device)
        at = (self.Q[self.vsel] - smax)[:, None] + j  # column smax holds y at its position Q
        real = (j >= smax - s[:, None]) & (j < smax + lengths[self.vsel, None])
        pos, slots = torch.where(real, at, 0), torch.where(real, at, L - 1)
        visible = (torch.arange(L, device=self.device) <= at[..., None]) & real[..., None]
        for i in self.verifying:
            images[i].stats.target_forwards += 1
        return target_forward(self.target, forward_rows_of(self.index[self.vsel], self.B, R), in_rows(seq, R),
                              in_rows(pos, R), in_rows(slots, R), in_rows(visible, R), None)

    def commit(self, images: list[Image], logits: Tensor | None, hidden: Tensor | None) -> None:
        """The verifying images' acceptance on the device (chain.accept_chains over y and the drafts' columns, under
        a layout each code's predicting row), every image's drafts into the token buffer, then the round's one read
        and each image's next catch-up inputs."""
        R, N, G, layout = images[0].pend_emb.shape[0], self.N, self.X.shape[1], self.layout
        self.buf[self.index[:, None], self.done[:, None] + torch.arange(G, device=self.device)] = self.X
        accepted = []
        if self.verifying:
            done, index, smax = self.done[self.vsel], self.index[self.vsel], self.smax
            logits = logits[:, smax:]
            if layout is not None:  # each code's predicting row (the eol's after a row end), over the image head
                logits = code_logits(layout, logits, self.geometry[1][self.vsel])
            P = batch_probs(logits, self.params, done[:, None] + torch.arange(logits.shape[1], device=self.device))
            u = None if self.uniforms is None else self.uniforms.u[self.vsel]
            a, token = accept_chains(P, self.q[self.vsel], self.X[self.vsel], self.gs[self.vsel], u, self.params,
                                     self.table, self.rule)
            self.buf[index, done + a] = token
            accepted = a.tolist()  # the round's one read
        offset = 0 if layout is None else layout.code_offset
        n_v, used, k = len(self.verifying), [], 0
        for i, (im, g) in enumerate(zip(images, self.g)):
            self.rounds_done[im.index] += 1
            im.stats.tree_depth.append(g)
            if self.skip[i]:  # x_1..x_g committed, x_g the new y; the inputs before it wait for the next verify
                im.stats.accepted_per_step.append(g - 1)
                im.stats.skipped_rounds += 1
                used.append(g)
                s = self.steps[i]  # y and the slots before x_g's (g without a layout)
                self.waiting[im.index], self.unverified[im.index] = self.seq[i, :s], s
                im.pend_emb = self.drafter.embed_tokens(self.seq[i, 1 : s + 1]).expand(R, -1, -1)
                im.pend_h = self.states[:, i, :s]
                im.start = self.position(im.n - 1)
                im.n = min(im.n + g, N)
                continue
            a_i, s = accepted[k], self.unverified[im.index]
            im.stats.accepted_per_step.append(a_i)
            done = im.n + a_i == N  # the drafts completed the image: no bonus token past its end
            used.append(g + min(a_i + 1, g) + (not done))
            self.unverified[im.index] = 0
            if done:
                im.n = N
            else:  # the rows through the next code's predicting one (r: its column after y, the eol's after a row
                # end); the unverified inputs' true hidden states replace the drafter's predicted ones
                r = a_i if layout is None else int(code_steps(layout, im.n + a_i) - code_steps(layout, im.n - 1)) - 1
                nxt = self.buf[im.index, im.n + a_i : im.n + a_i + 1] + offset
                im.pend_emb = self.drafter.embed_tokens(torch.cat([self.vseq[k, smax - s + 1 : smax + r + 1], nxt]))
                im.pend_emb = im.pend_emb.expand(R, -1, -1)
                im.pend_h = hidden[k::n_v, smax - s : smax + r + 1]
                im.start = self.position(im.n - 1) - s
                im.n += a_i + 1
            k += 1
        if self.uniforms is not None:
            self.uniforms.used(used)

    def position(self, code: int) -> int:
        """The target position of code index `code`: the prompt, then its step (forced tokens before it counted)."""
        return self.target.args.cls_token_num + (code if self.layout is None else int(code_steps(self.layout, code)))


class SkippingTreeRounds(Schedule, TreeRounds):
    """Static or dynamic tree rounds where every skip_every-th round of an image commits one drafted path without a
    verify: a leaf drawn uniformly with one uniform from the image's generator (greedy decoding too: the authors'
    random.randint over candidate paths), its path cut to the trees' mean path length (the authors' skip_evaluate:
    min(the leaf's depth, floor(mean over leaves of 1 + depth) - 1)). The drafter's inputs at the unverified
    positions reuse the image's latest target hidden states (the authors' `reuse_prev`: the last ones, the last
    repeated when too few). A skipped round reads its tree on the host (one read per skipping image). Under a layout
    (forced_trees.py) the committed codes that end a row are followed by their eol among the unverified inputs."""

    def verify(self, images: list[Image], width: int | None) -> tuple[Tensor | None, Tensor | None]:
        """One target forward over the verifying images' [unverified inputs, y, nodes] (verify_inputs), or (None,
        None) when every active image skips."""
        self.verifying = [i for i, skip in enumerate(self.skip) if not skip]
        if not self.verifying:
            return None, None
        sub = [images[i] for i in self.verifying]
        self.smax = max(self.unverified[im.index] for im in sub)
        return super().verify(sub, None)

    def verify_inputs(self, images: list[Image]) -> tuple[list[Tensor], list[Tensor], list[Tensor], list[Tensor]]:
        """TreeRounds' verify trees, each image's unverified inputs (s of them, at positions and slots Q - s .. Q - 1,
        causal) right-aligned before y at column smax, padding in front."""
        seqs, pos, slots, visible = super().verify_inputs(images)
        smax, device, L = self.smax, self.device, self.target.cache_len
        if smax == 0:
            return seqs, pos, slots, visible
        before = self.before([im.index for im in images], smax)
        for k, im in enumerate(images):
            s = self.unverified[im.index]
            at = torch.arange(im.Q - s, im.Q, device=device)
            causal = torch.arange(L, device=device) <= at[:, None]
            seqs[k] = torch.cat([before[k], seqs[k]])
            pos[k] = torch.cat([at.new_zeros(smax - s), at, pos[k]])
            slots[k] = torch.cat([at.new_full((smax - s,), L - 1), at, slots[k]])
            visible[k] = torch.cat([causal.new_zeros(smax - s, L), causal, visible[k]])
        return seqs, pos, slots, visible

    def commit(self, images: list[Image], logits: Tensor | None, hidden: Tensor | None) -> None:
        sub = [images[i] for i in self.verifying] if logits is not None else []
        waiting = {im.index: self.unverified[im.index] for im in sub}
        before = {im.index: (len(im.tokens), im.Q) for im in sub}
        offset = 0 if self.layout is None else self.layout.code_offset
        if sub:  # the trees' own acceptance over the columns from y on
            smax = self.smax
            super().commit(sub, logits[:, smax:], hidden[:, smax:])
            R, n_v = images[0].pend_emb.shape[0], len(sub)
            full = hidden.view(R, n_v, hidden.shape[1], -1)
            for k, im in enumerate(sub):  # the unverified positions' true states refresh the drafter's cache
                s, (n, Q) = waiting[im.index], before[im.index]
                self.unverified[im.index] = 0
                if s and im.n < self.N:  # their ids shifted by one: the inputs after the first, then y
                    ids = self.waiting[im.index]
                    emb = self.drafter.embed_tokens(torch.cat([ids[1:], ids.new_tensor([im.tokens[n - 1] + offset])]))
                    im.pend_emb = torch.cat([emb.expand(R, -1, -1), im.pend_emb], 1)
                    im.pend_h = torch.cat([full[:, k, smax - s : smax], im.pend_h], 1)
                    im.start = Q - s
        skipping = [im for im, skip in zip(images, self.skip) if skip]
        if skipping:
            ahead = Uniforms([im.generator for im in skipping], 1, self.device)
            for im, u in zip(skipping, ahead.u[:, 0].tolist()):
                self.skip_path(im, u)
            ahead.used([1] * len(skipping))
        for im in images:
            self.rounds_done[im.index] += 1

    def skip_path(self, im: Image, u: float) -> None:
        """Commit a leaf's path (chosen by u), cut to the mean path length, unverified; the last token the new y.
        Its unverified inputs: the old y and the path's codes before the last, each followed by its eol where its
        code ends a row (the round's plan, forced_trees.TreePlan)."""
        d, R, layout = im.draft, im.pend_emb.shape[0], self.layout
        parent, depth, tokens = d.parent.tolist(), d.depth.tolist(), d.tokens.tolist()
        leaves = sorted(set(range(len(tokens))) - set(parent))
        leaf = leaves[min(int(u * len(leaves)), len(leaves) - 1)]
        a = min(depth[leaf], sum(1 + depth[x] for x in leaves) // len(leaves) - 1)
        path = [leaf]
        while parent[path[-1]] >= 0:
            path.append(parent[path[-1]])
        codes = [tokens[x] for x in path[::-1][:a]]
        im.stats.accepted_per_step.append(a - 1)  # the last committed node stands where a bonus token does
        im.stats.tree_depth.append(max(depth))
        im.stats.skipped_rounds += 1
        offset = 0 if layout is None else layout.code_offset
        ends = [] if layout is None else self.plans[im.index].ends
        ids = []
        for k, code in enumerate([im.tokens[-1]] + codes[:-1]):  # the code at depth k of the round
            ids += [code + offset] + ([layout.eol] if k in ends else [])
        s = len(ids)
        im.tokens += codes
        cols = im.pend_h.shape[1]  # the authors' reuse_prev: the latest target states, the last repeated
        im.pend_h = im.pend_h[:, max(cols - s, 0):]
        im.pend_h = torch.cat([im.pend_h, im.pend_h[:, -1:].expand(-1, s - im.pend_h.shape[1], -1)], 1)
        ids = torch.tensor(ids + [codes[-1] + offset], device=self.device)
        im.pend_emb = self.drafter.embed_tokens(ids[1:]).expand(R, -1, -1)
        self.waiting[im.index], self.unverified[im.index] = ids[:s], s
        im.start, im.Q = im.Q, im.Q + s
        im.n = len(im.tokens)
