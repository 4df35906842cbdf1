"""Chain speculative decoding with an EAGLE drafter: exact, LANTERN and LANTERN++ acceptance.

One round, with y the newest token at target position Q (not yet fed to the target):
1. draft: the drafter catches up over the positions whose true target hidden states arrived last round (one
   forward), then drafts gamma tokens x_1..x_g from its CFG-mixed, temperature/top-k/top-p processed logits,
   feeding its own predicted hidden states forward (gamma drafter forwards in all);
2. verify: one target forward over [y, x_1..x_g] at positions Q..Q+g gives the target distributions p_0..p_g;
3. accept the longest prefix the rule allows, then emit a correction from the residual (or argmax, greedy) at the
   first rejection, or a bonus token from p_g when all g pass.
The target's static cache is indexed by position: entries past the accepted prefix are overwritten next round
and a query never sees a key beyond its own position, so only the accepted prefix is ever read.
Every random draw (drafts, acceptance uniforms, corrections) comes from the image's own generator.
tau = tokens / target forwards (prefill included): the mean accepted length counting the bonus/correction token.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lantern.engine.acceptance import AcceptRule, accept_probability, greedy_accept, residual
from lantern.engine.drafter import Drafter, load_drafter
from lantern.errors import UserError
from lantern.engine.generate import (
    ImageStats, SamplingParams, StepTimer, cfg_rows, peak_memory, reset_peak_memory, row_probs,
    sample_index,
)
from lantern.engine.model import GPT, causal_mask


def rule_from_method(method: dict) -> AcceptRule:
    """The acceptance rule of a sweep method spec (name exact | lantern | lanternpp, delta, lam, k, residual)."""
    name = method.get("name")
    residual_mode = method.get("residual", "bounded")
    if name == "exact":
        return AcceptRule()
    if name == "lantern":
        return AcceptRule("lantern", delta=float(method.get("delta", 0.0)), k=int(method.get("k", 0)), residual=residual_mode)
    if name == "lanternpp":
        return AcceptRule("lanternpp", lam=float(method.get("lam", 1.0)), k=int(method.get("k", 0)), residual=residual_mode)
    raise UserError(f"method name {name!r} is not a speculative method; use exact, lantern or lanternpp")


def _uniform(generator: torch.Generator) -> float:
    return torch.rand((), generator=generator, dtype=torch.float64).item()


def _pick(p: Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    return int(p.argmax()) if params.greedy else sample_index(p, generator)


def speculative_prefill(target: GPT, drafter: Drafter, cond: Tensor, params: SamplingParams,
                        generator: torch.Generator, timer: StepTimer, cond_mask: Tensor | None = None,
                        target_extra: int = 0, drafter_extra: int = 0) -> tuple[int, int, Tensor, Tensor]:
    """The start of every speculative decoder (chain and tree): both caches set up (`*_extra` slots for tree
    nodes), the target run over the condition, the first image token drawn. Returns the number of rows R, that
    token, and the drafter's pending catch-up inputs: embeddings of positions t + 1 and the target's hidden h_t."""
    device = target.output.weight.device
    T = target.args.cls_token_num
    rows, rows_mask = cfg_rows(target, cond, params, cond_mask)
    R = rows.shape[0]
    with timer.section("other"):
        target.setup_cache(R, extra=target_extra)
        drafter.setup_cache(R, extra=drafter_extra, cond_mask=rows_mask)
    with timer.section("verify"):
        if rows_mask is not None:
            target.set_cond_mask(rows_mask)
        pos = torch.arange(T, device=device)
        cond_emb = target.embed_cond(rows)
        logits, hidden = target.forward_cached(cond_emb, pos, pos, causal_mask(T, target.cache_len, device))
    with timer.section("other"):
        first = _pick(row_probs(logits[:, -1], params, 0), params, generator)
    # The drafter reads its own embedding (a converted authors' drafter carries one) and its own condition inputs.
    first_emb = drafter.embed_tokens(torch.tensor([first] * R, device=device))[:, None]
    return R, first, torch.cat([drafter.cond_inputs(cond_emb), first_emb], 1), hidden


@torch.no_grad()
def speculative_decode(
    target: GPT,
    drafter: Drafter,
    cond: Tensor,
    params: SamplingParams,
    rule: AcceptRule,
    gamma: int,
    generator: torch.Generator,
    table: Tensor | None = None,
    cond_mask: Tensor | None = None,
) -> tuple[Tensor, ImageStats]:
    """Decode one image (cond [1] or [1, T, C]); returns its tokens [N] and stats."""
    if cond.shape[0] != 1:
        raise ValueError(f"speculative_decode takes one image at a time, got a batch of {cond.shape[0]}")
    if gamma < 1:
        raise UserError(f"gamma={gamma} must be >= 1 (drafted tokens per round)")
    if rule.relaxed and (table is None or table.shape[1] < rule.table_width):
        raise UserError(f"{rule.describe()} needs a neighbour table with >= {rule.table_width} neighbours per code")
    N, T = target.args.image_tokens, target.args.cls_token_num
    device = target.output.weight.device
    timer = StepTimer(device)
    reset_peak_memory(device)
    R, first, pend_emb, hidden = speculative_prefill(target, drafter, cond, params, generator, timer, cond_mask)
    tokens = [first]
    pend_h, start, Q = hidden, 0, T
    target_forwards, drafter_forwards, accepted = 1, 0, []

    while len(tokens) < N:
        g = min(gamma, N - len(tokens))
        with timer.section("draft"):
            pred = drafter.step(pend_emb, pend_h, start)[:, -1:]  # predicted h_Q
            drafts, qs = [], []
            for i in range(g):
                q = row_probs(drafter.head(pred[:, -1]), params, len(tokens) + i)
                drafts.append(_pick(q, params, generator))
                qs.append(q)
                if i < g - 1:
                    x = drafter.embed_tokens(torch.tensor([drafts[-1]] * R, device=device))[:, None]
                    pred = drafter.step(x, pred, Q + i)
            drafter_forwards += g
        with timer.section("verify"):
            seq = torch.tensor([tokens[-1]] + drafts, device=device)
            pos = torch.arange(Q, Q + g + 1, device=device)
            emb = target.embed_tokens(seq.expand(R, -1))
            logits, hidden = target.forward_cached(emb, pos, pos, causal_mask(g + 1, target.cache_len, device, start=Q))
            target_forwards += 1
        with timer.section("other"):
            P = torch.stack([row_probs(logits[:, j], params, len(tokens) + j) for j in range(g + 1)])
            X = seq[1:]
            if params.greedy:
                ok = greedy_accept(P[:g], X, table, rule).tolist()
                a = ok.index(False) if False in ok else g
                new = int(P[a].argmax())
            else:
                A, _, M = accept_probability(P[:g], torch.stack(qs), X, table, rule)
                a = 0
                while a < g and _uniform(generator) < A[a].item():
                    a += 1
                if a < g:
                    new = sample_index(residual(P[a], qs[a], drafts[a], int(M[a]), table, rule), generator)
                elif len(tokens) + g < N:
                    new = sample_index(P[g], generator)
            tokens += drafts[:a]
            accepted.append(a)
            if len(tokens) == N:  # the drafts completed the image: a bonus token would lie past its end
                break
            tokens.append(new)
            # next catch-up: drafter positions Q..Q+a read x_1..x_a, new with the target's true h_Q..h_{Q+a}
            pend_emb = drafter.embed_tokens(torch.tensor(drafts[:a] + [new], device=device).expand(R, -1))
            pend_h, start, Q = hidden[:, : a + 1], Q, Q + a + 1

    target.clear_cache()
    drafter.clear_cache()
    stats = ImageStats(
        n_tokens=N, target_forwards=target_forwards, drafter_forwards=drafter_forwards, accepted_total=sum(accepted),
        time_draft_s=timer.seconds.get("draft", 0.0), time_verify_s=timer.seconds.get("verify", 0.0),
        time_other_s=timer.seconds.get("other", 0.0), peak_mem_bytes=peak_memory(device), batch_size=1,
        accepted_per_step=accepted,
    )
    return torch.tensor(tokens, device=device), stats


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
    gamma: int,
    generators: list[torch.Generator],
    table: Tensor | None = None,
    cond_mask: Tensor | None = None,
) -> tuple[Tensor, list[ImageStats]]:
    """Speculative decoding of a batch, one image at a time; same contract as generate.generate."""
    return decode_each(
        lambda c, g, m: speculative_decode(target, drafter, c, params, rule, gamma, g, table, m), cond, generators, cond_mask
    )


def make_decoder(method: dict, params: SamplingParams, target: GPT, drafter_path: str | None,
                 neighbours_path: str | None, vq_path: str | None, dtype: str, device: torch.device):
    """(cond, generator, cond_mask) -> (tokens [N], ImageStats) for a speculative sweep method (`lantern sample`)."""
    from lantern.engine.neighbours import load_neighbours, read_codebook

    rule = rule_from_method(method)
    drafting = method.get("drafting", "chain")
    tree = None
    if drafting in ("static", "dynamic"):
        from lantern.engine.trees import tree_decode, tree_from_method

        tree = tree_from_method(method)
    elif drafting != "chain":
        raise UserError(f"drafting {drafting!r} is unknown; use chain, static or dynamic")
    gamma = method.get("gamma", 4)
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise UserError(f"method gamma={gamma!r} must be a positive integer")
    if not drafter_path:
        raise UserError(f"method {method['name']} needs a drafter checkpoint (--drafter)")
    drafter = load_drafter(drafter_path, target)
    table = None
    if rule.relaxed:
        if not neighbours_path or not vq_path:
            raise UserError(f"{rule.describe()} needs a neighbour table (--neighbours) and its VQ checkpoint (--vq)")
        table = load_neighbours(neighbours_path, read_codebook(vq_path), rule.table_width)
        if table.shape[0] != target.args.vocab_size:
            raise UserError(f"neighbour table {neighbours_path} covers {table.shape[0]} codes; the target has {target.args.vocab_size}")
        table = table.to(device)

    def run(cond: int | Tensor, generator: torch.Generator, cond_mask: Tensor | None = None):
        """cond: a class id, or caption features [1, T, C] with their mask [1, T]."""
        if isinstance(cond, int):
            cond = torch.tensor([cond], device=device)
        if tree is not None:
            return tree_decode(target, drafter, cond, params, rule, tree, generator, table, cond_mask)
        return speculative_decode(target, drafter, cond, params, rule, gamma, generator, table, cond_mask)

    return run
