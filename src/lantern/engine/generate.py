"""Vanilla AR generation plus the sampling, seeding, timing and stats plumbing every decoder shares.

Every image owns a CPU `torch.Generator` seeded from (global seed, image index) and draws one uniform per sampled
token from it, so an image never depends on its batch, its shard or the device it ran on.
"""

from __future__ import annotations

import hashlib
import math
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor

from lantern.errors import UserError
from lantern.engine.model import GPT, causal_mask


# -- seeds --------------------------------------------------------------------------------------------------------
def image_seed(global_seed: int, index: int) -> int:
    digest = hashlib.sha256(f"lantern:{global_seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def image_generator(global_seed: int, index: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(image_seed(global_seed, index))


# -- sampling -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SamplingParams:
    cfg_scale: float = 1.0
    # As upstream LlamaGen: CFG guides image tokens 0 .. cfg_interval + 1 (the prefill's token, then cfg_interval + 1
    # decode steps) and every later token samples from the cond logits alone; -1: every token.
    cfg_interval: int = -1
    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off
    greedy: bool = False

    def __post_init__(self):
        if self.cfg_scale < 1.0:
            raise UserError(f"cfg_scale={self.cfg_scale} must be >= 1 (1 disables classifier-free guidance)")
        if self.temperature <= 0:
            raise UserError(f"temperature={self.temperature} must be > 0; use greedy: true for argmax decoding")
        if self.top_k < 0 or not 0 < self.top_p <= 1:
            raise UserError(f"top_k={self.top_k} must be >= 0 and top_p={self.top_p} in (0, 1]")
        if self.cfg_interval < -1:
            raise UserError(f"cfg_interval={self.cfg_interval} must be >= -1 (-1 guides every token)")

    @property
    def use_cfg(self) -> bool:
        return self.cfg_scale > 1.0


def mix_cfg(logits: Tensor, params: SamplingParams, token_index: int | Tensor) -> Tensor:
    """The one CFG arithmetic of every decoder: rows [cond; uncond] -> l_u + (l_c - l_u) * s on the cond rows.

    token_index is the image-token index being sampled (0: the token the prefill predicts), an int for every row or
    a tensor with one index per position along dim 1 of logits [rows, S, V]. Without CFG the logits pass through.
    """
    if not params.use_cfg:
        return logits
    cond, uncond = logits.chunk(2, dim=0)
    guided = uncond + (cond - uncond) * params.cfg_scale
    if params.cfg_interval < 0:
        return guided
    # Upstream's decode loop step i samples token i + 1 and stops guiding once i > cfg_interval.
    last_guided = params.cfg_interval + 1
    if not torch.is_tensor(token_index):
        return guided if token_index <= last_guided else cond
    late = token_index.to(logits.device) > last_guided
    return torch.where(late.view(1, -1, *(1,) * (logits.ndim - 2)), cond, guided)


def logits_to_probs(logits: Tensor, params: SamplingParams) -> Tensor:
    """Temperature, then top-k, then top-p (upstream order); returns fp32 probabilities over the last dim."""
    logits = logits.float() / max(params.temperature, 1e-5)
    if params.top_k > 0:
        k = min(params.top_k, logits.shape[-1])
        kth = torch.topk(logits, k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cum > params.top_p
        drop_sorted[..., 1:] = drop_sorted[..., :-1].clone()  # keep the token that crosses the threshold
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.softmax(logits, dim=-1)


def row_probs(logits: Tensor, params: SamplingParams, index) -> Tensor:
    """The distributions a speculative decoder verifies against: logits [R, V] or [R, S, V] (rows [cond; uncond]
    under CFG) -> [V] or [S, V], CFG-mixed then filtered; `index` is the image-token index of each position (an
    int: all of them), which matters only through cfg_interval."""
    return logits_to_probs(mix_cfg(logits, params, index)[0], params)


def sample_index(probs: Tensor, generator: torch.Generator) -> int:
    """Inverse-CDF draw from a 1-D distribution with one uniform from `generator` (never a zero-mass index)."""
    u = torch.rand((), generator=generator, dtype=torch.float64).item()
    cdf = probs.detach().double().cumsum(0)
    u *= cdf[-1].item()
    idx = int(torch.searchsorted(cdf, torch.tensor([u], dtype=torch.float64, device=cdf.device), right=True).item())
    if idx >= probs.numel():  # u rounded onto the total mass
        idx = int(torch.nonzero(probs > 0)[-1].item())
    return idx


def next_tokens(probs: Tensor, params: SamplingParams, generators: list[torch.Generator]) -> Tensor:
    """One token per row: argmax under greedy, else a draw with that row's own generator."""
    if params.greedy:
        return probs.argmax(-1)
    return torch.tensor([sample_index(p, g) for p, g in zip(probs, generators)], device=probs.device)


# -- timing and stats ---------------------------------------------------------------------------------------------
class StepTimer:
    """Wall-clock per section; CUDA work is synchronised at section boundaries so time lands where it is spent."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.seconds: dict[str, float] = {}

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextmanager
    def section(self, name: str):
        self._sync()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


@dataclass
class ImageStats:
    """Per-image decoding statistics. tau = tokens / target forwards: mean accepted length, bonus token counted."""

    n_tokens: int
    target_forwards: int
    drafter_forwards: int = 0
    accepted_total: int = 0  # drafted tokens accepted over the whole image
    time_draft_s: float = 0.0
    time_verify_s: float = 0.0
    time_other_s: float = 0.0
    peak_mem_bytes: float = math.nan
    batch_size: int = 1
    accepted_per_step: list[int] = field(default_factory=list)

    @property
    def tau(self) -> float:
        return self.n_tokens / self.target_forwards

    @property
    def time_total_s(self) -> float:
        return self.time_draft_s + self.time_verify_s + self.time_other_s

    def row(self) -> dict:
        d = asdict(self)
        d["accepted_per_step"] = " ".join(map(str, self.accepted_per_step))
        d.update(tau=self.tau, time_total_s=self.time_total_s, steps=len(self.accepted_per_step) or self.target_forwards)
        return d


def reset_peak_memory(device: torch.device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> float:
    return float(torch.cuda.max_memory_allocated(device)) if torch.device(device).type == "cuda" else math.nan


# -- vanilla autoregressive decoding ------------------------------------------------------------------------------
def cfg_rows(model: GPT, cond: Tensor, params: SamplingParams, cond_mask: Tensor | None = None):
    """Condition rows fed to the model: [cond; null cond] under CFG (the upstream batch layout).

    A c2i target without a null class row stops here (GPT.null_cond), before its cache is even allocated.
    """
    if not params.use_cfg:
        return cond, cond_mask
    rows = torch.cat([cond, model.null_cond(cond.shape[0], cond.device).to(cond.dtype)])
    return rows, None if cond_mask is None else torch.cat([cond_mask, cond_mask])


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


def duplicate_for_cfg(tokens: Tensor, params: SamplingParams) -> Tensor:
    return torch.cat([tokens, tokens]) if params.use_cfg else tokens


@torch.no_grad()
def generate(
    model: GPT,
    cond: Tensor,
    params: SamplingParams,
    generators: list[torch.Generator],
    cond_mask: Tensor | None = None,
) -> tuple[Tensor, list[ImageStats]]:
    """Vanilla AR decoding of a batch; returns image tokens [B, N] and one ImageStats per image."""
    B, N, T = cond.shape[0], model.args.image_tokens, model.args.cls_token_num
    if len(generators) != B:
        raise ValueError(f"need one generator per image: {len(generators)} for a batch of {B}")
    device = model.output.weight.device
    timer = StepTimer(device)
    reset_peak_memory(device)
    rows, rows_mask = cfg_rows(model, cond, params, cond_mask)
    with timer.section("other"):
        model.setup_cache(rows.shape[0])
    tokens = torch.empty(B, N, dtype=torch.long, device=device)
    with timer.section("verify"):
        logits, _ = prefill(model, rows, rows_mask)
    for i in range(N):
        with timer.section("other"):
            tokens[:, i] = next_tokens(logits_to_probs(mix_cfg(logits, params, i), params), params, generators)
        if i == N - 1:
            break
        with timer.section("verify"):
            logits, _ = decode_one_token(model, duplicate_for_cfg(tokens[:, i], params), T + i)
    model.clear_cache()
    peak = peak_memory(device)
    per_image = lambda s: timer.seconds.get(s, 0.0) / B  # noqa: E731 - a batch shares its wall time
    stats = [
        ImageStats(
            n_tokens=N,
            target_forwards=N,
            time_verify_s=per_image("verify"),
            time_other_s=per_image("other"),
            peak_mem_bytes=peak,
            batch_size=B,
        )
        for _ in range(B)
    ]
    return tokens, stats
