"""Vanilla autoregressive decoding: `prefill`, `decode_one_token`, `generate` (the upstream LlamaGen names).

`generate` feeds every decode step through `decode_step`, whose shapes never change along an image (the position is
a tensor and the causal mask is built from it), so `generate(..., compile=True)` can run that very function through
torch.compile (engine/decoding/compiled.py): one graph per model shape and batch, gpt-fast style.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lantern.engine.decoding import compiled
from lantern.engine.models.layout import Layout, forced_after, image_logits
from lantern.engine.models.model import GPT, causal_mask
from lantern.engine.decoding.sampling import SamplingParams, Uniforms, logits_to_probs, mix_cfg, next_tokens
from lantern.engine.decoding.stats import ImageStats, StepTimer, peak_memory, reset_peak_memory


def cfg_rows(model: GPT, cond: Tensor, params: SamplingParams, cond_mask: Tensor | None = None):
    """Condition rows fed to the model: [cond; null cond] under CFG (the upstream batch layout).

    A c2i target without a null class row stops here (GPT.null_cond), before its cache is even allocated.
    """
    if not params.use_cfg:
        return cond, cond_mask
    rows = torch.cat([cond, model.null_cond(cond.shape[0], cond.device).to(cond.dtype)])
    return rows, model.cfg_mask(cond_mask, cond.shape[0])


def prefill(model: GPT, rows: Tensor, cond_mask: Tensor | None = None):
    """Run the condition positions through a fresh cache; returns (logits, hidden) of the last position."""
    T = model.args.cls_token_num
    if cond_mask is not None:
        model.set_cond_mask(cond_mask)
    pos = torch.arange(T, device=rows.device)
    visible = causal_mask(T, model.cache_len, rows.device)
    logits, hidden = model.forward_cached(model.embed_cond(rows), pos, pos, visible)
    return logits[:, -1], hidden[:, -1]


def decode_one_token(model: GPT, token: Tensor, input_pos: int):
    """Feed one image token per row at sequence position input_pos; returns (logits, hidden) [rows, ...]."""
    pos = torch.tensor([input_pos], device=token.device)
    visible = causal_mask(1, model.cache_len, token.device, start=input_pos)
    logits, hidden = model.forward_cached(model.embed_tokens(token.view(-1, 1)), pos, pos, visible)
    return logits[:, -1], hidden[:, -1]


def decode_step(model: GPT, token: Tensor, input_pos: Tensor):
    """decode_one_token with static shapes, the function engine/decoding/compiled.py compiles: token [rows], input_pos a
    1-element long tensor on the model's device; the mask is built from input_pos inside, so one graph serves every
    position. Same numbers as decode_one_token(model, token, int(input_pos))."""
    pos = input_pos.view(1)
    visible = torch.arange(model.cache_len, device=pos.device)[None, :] <= pos[:, None]  # causal_mask(1, L, start=pos)
    logits, hidden = model.forward_cached(model.embed_tokens(token.view(-1, 1)), pos, pos, visible)
    return logits[:, -1], hidden[:, -1]


def duplicate_for_cfg(tokens: Tensor, params: SamplingParams) -> Tensor:
    return torch.cat([tokens, tokens]) if params.use_cfg else tokens


@torch.no_grad()
def generate(
    model: GPT,
    cond: Tensor,
    params: SamplingParams,
    generators: list[torch.Generator],
    cond_mask: Tensor | None = None,
    compile: bool = False,
    layout: Layout | None = None,
) -> tuple[Tensor, list[ImageStats]]:
    """Vanilla AR decoding of a batch; returns image tokens [B, N] and one ImageStats per image.

    layout (engine/models/layout.py): a family whose sequence carries forced structural tokens. The tokens are then
    its codes [B, layout.codes], drawn from the image head's rows (layout.image_logits: the authors' restriction)
    and fed as id code + code_offset; each forced token that follows a code is fed in a forward of its own, as the
    authors' plain AR feeds every token (docs/chameleon-layout.md), and counts in target_forwards.

    compile: run each decode step through torch.compile (engine/decoding/compiled.py; the first call per model shape and
    batch compiles, inside the timed "verify" section) on a KV cache kept for the next call; the prefill and the
    sampling (per-image generators) stay eager. Off: plain eager steps, the reference numbers."""
    B, T = cond.shape[0], model.args.cls_token_num
    N = model.args.image_tokens if layout is None else layout.codes
    if len(generators) != B:
        raise ValueError(f"need one generator per image: {len(generators)} for a batch of {B}")
    device = model.output.weight.device
    timer = StepTimer(device)
    reset_peak_memory(device)
    rows, rows_mask = cfg_rows(model, cond, params, cond_mask)
    with timer.section("other"):
        if compile:
            step = compiled.compiled_step(decode_step, device)
            compiled.setup_static_cache(model, rows.shape[0])
        else:
            step = decode_step
            model.setup_cache(rows.shape[0])
    tokens = torch.empty(B, N, dtype=torch.long, device=device)
    input_pos = torch.full((1,), T, device=device)
    with timer.section("other"):  # every image's N uniforms, one per token, in one copy: no host sync per token
        u = None if params.greedy else Uniforms(generators, N, device).u
        # host ints: the forced tokens after each code (layout), read without a sync
        follows = [[] for _ in range(N)] if layout is None else [
            [t for t in after if t >= 0] for after in forced_after(layout, torch.arange(N)).tolist()]
    with timer.section("verify"):
        logits, _ = prefill(model, rows, rows_mask)
    forwards = N
    for i in range(N):
        with timer.section("other"):
            guided = mix_cfg(logits, params, i)
            probs = logits_to_probs(guided if layout is None else image_logits(layout, guided), params)
            tokens[:, i] = next_tokens(probs, params, None if u is None else u[:, i])
        if i == N - 1:
            break
        with timer.section("verify"):
            fed = tokens[:, i] if layout is None else tokens[:, i] + layout.code_offset
            logits, _ = step(model, duplicate_for_cfg(fed, params), input_pos)
            input_pos += 1
            for forced in follows[i]:
                logits, _ = step(model, torch.full((logits.shape[0],), forced, device=device), input_pos)
                input_pos += 1
                forwards += 1
    model.clear_cache()
    peak = peak_memory(device)
    per_image = lambda s: timer.seconds.get(s, 0.0) / B  # noqa: E731 - a batch shares its wall time
    stats = [
        ImageStats(
            n_tokens=N,
            target_forwards=forwards,
            time_verify_s=per_image("verify"),
            time_other_s=per_image("other"),
            peak_mem_bytes=peak,
            batch_size=B,
        )
        for _ in range(B)
    ]
    return tokens, stats
