"""Sampling arithmetic every decoder shares: per-image seeds, CFG mixing, temperature / top-k / top-p, draws.

Every image owns a CPU `torch.Generator` seeded from (global seed, image index) and draws one uniform per sampled
token from it, so an image never depends on its batch, its shard or the device it ran on. The decoders draw an
image's uniforms ahead (`Uniforms`), send them to the device in one copy, and draw tokens there (`draw`), so a
token costs no host sync.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
from torch import Tensor

from lantern.errors import UserError


# -- seeds --------------------------------------------------------------------------------------------------------
def image_seed(global_seed: int, index: int) -> int:
    digest = hashlib.sha256(f"lantern:{global_seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def image_generator(global_seed: int, index: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(image_seed(global_seed, index))


# -- sampling -----------------------------------------------------------------------------------------------------
@torch.library.custom_op("lantern::cumsum_last", mutates_args=())
def _aten_cumsum_last(x: Tensor) -> Tensor:
    return x.cumsum(-1)


@_aten_cumsum_last.register_fake
def _(x: Tensor) -> Tensor:
    return torch.empty_like(x)


def cumsum_last(x: Tensor) -> Tensor:
    """x.cumsum(-1); inside a compiled graph through an opaque op, so ATen's kernel runs there too: inductor's own
    split scan failed to generate code for the float64 CDF of 8 rows x 16384 codes on CUDA (torch 2.11, H200), and
    one kernel on both paths keeps compiled draws equal to eager ones."""
    return _aten_cumsum_last(x) if torch.compiler.is_compiling() else x.cumsum(-1)


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
        cum = cumsum_last(sorted_logits.softmax(-1))
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


def draw(probs: Tensor, u: Tensor) -> Tensor:
    """Inverse-CDF draws for many rows at once, on the device and without a host sync: probs [..., V], u [...]
    uniforms in [0, 1) (float64, drawn from each row's generator) -> indices [...]; never a zero-mass index (the
    one-uniform-at-a-time reference is tests/tiny.sample_index)."""
    cdf = cumsum_last(probs.detach().double())
    idx = torch.searchsorted(cdf, (u * cdf[..., -1]).unsqueeze(-1), right=True).squeeze(-1)
    V = probs.shape[-1]
    last = V - 1 - (probs > 0).flip(-1).int().argmax(-1)  # u rounded onto the total mass: the last positive index
    return torch.where(idx >= V, last, idx)


class Uniforms:
    """Each image's uniforms for a stretch of decoding (a round), drawn ahead from its own generator and sent to
    the device in one copy. `used` then advances every generator by exactly the uniforms its image consumed, so an
    image's stream is the one drawing them one at a time would give (torch draws a generator's uniforms serially)."""

    def __init__(self, generators: list[torch.Generator], k: int, device, rows: list[int] | None = None):
        self.generators = generators if rows is None else [generators[b] for b in rows]
        self.states = [g.get_state() for g in self.generators]
        u = [torch.rand(k, generator=g, dtype=torch.float64, device=g.device) for g in self.generators]
        self.u = torch.stack(u).to(device)  # [images, k]

    def used(self, counts: list[int]) -> None:
        for g, state, n in zip(self.generators, self.states, counts):
            g.set_state(state)
            torch.rand(n, generator=g, dtype=torch.float64, device=g.device)


def next_tokens(probs: Tensor, params: SamplingParams, u: Tensor | None) -> Tensor:
    """One token per row: argmax under greedy, else a draw with that row's uniform u [rows] (`draw`)."""
    if params.greedy:
        return probs.argmax(-1)
    return draw(probs, u)

