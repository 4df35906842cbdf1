"""Step economics of a target and its drafter: what one drafter step and one multi-position verify cost against a
one-token target step, measured in one process, at a batch size, with the CFG rows a guided step carries.

Speculative decoding pays off only when drafting is cheap and verifying several positions costs about one step:
LlamaGen-XL (36 layers) with its one-layer EAGLE drafter spends a few per cent of a step on a draft. These ratios
are what makes a small world LlamaGen-like or not, independent of the speed-ups it then produces.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from lantern.engine.models.model import GPT, causal_mask


@dataclass(frozen=True)
class StepCosts:
    """Median seconds per call: a one-token target step, a `positions`-token target verify, a drafter step."""
    batch: int
    rows: int  # cache rows: 2 x batch under CFG
    positions: int
    target_step_s: float
    verify_s: float
    drafter_step_s: float


def ratios(costs: StepCosts) -> dict[str, float]:
    """drafter step / target step and verify / target step: the two numbers issue #31 asks of a toy world
    (<= 0.08 and <= 1.3 for a 5-position verify, as for LlamaGen-XL with its EAGLE drafter on a GPU)."""
    if costs.target_step_s <= 0:
        raise ValueError(f"a target step cannot take {costs.target_step_s} s")
    return {"drafter_over_step": costs.drafter_step_s / costs.target_step_s,
            "verify_over_step": costs.verify_s / costs.target_step_s}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_costs(target: GPT, drafter, batch: int, cfg: bool = True, positions: int = 5, repeats: int = 20,
               warmup: int = 3) -> StepCosts:
    """Time the three calls round-robin (so that a busy machine slows all three alike) at the middle image
    position, over a fresh cache, and return their medians. The drafter step includes its head, as in drafting."""
    device = target.output.weight.device
    rows = 2 * batch if cfg else batch
    start = target.args.cls_token_num + target.args.image_tokens // 2
    target.setup_cache(rows)
    drafter.setup_cache(rows)
    gen = torch.Generator(device="cpu").manual_seed(0)
    tokens = torch.randint(target.args.vocab_size, (rows, positions), generator=gen).to(device)
    hidden = torch.randn(rows, 1, target.args.dim, generator=gen).to(device=device, dtype=target.output.weight.dtype)
    one = torch.tensor([start], device=device)
    many = torch.arange(start, start + positions, device=device)
    mask_one = causal_mask(1, target.cache_len, device, start=start)
    mask_many = causal_mask(positions, target.cache_len, device, start=start)

    def target_step():
        target.forward_cached(target.embed_tokens(tokens[:, :1]), one, one, mask_one)

    def verify():
        target.forward_cached(target.embed_tokens(tokens), many, many, mask_many)

    def drafter_step():
        drafter.head(drafter.step(drafter.embed_tokens(tokens[:, :1]), hidden, start))

    calls = {"target_step_s": target_step, "verify_s": verify, "drafter_step_s": drafter_step}
    times: dict[str, list[float]] = {k: [] for k in calls}
    try:
        with torch.inference_mode():
            for r in range(warmup + repeats):
                for name, fn in calls.items():
                    _sync(device)
                    t0 = time.perf_counter()
                    fn()
                    _sync(device)
                    if r >= warmup:
                        times[name].append(time.perf_counter() - t0)
    finally:
        target.clear_cache()
        drafter.clear_cache()
    return StepCosts(batch=batch, rows=rows, positions=positions,
                     **{k: statistics.median(v) for k, v in times.items()})


def round_costs(spec_rows: list[dict], ar_rows: list[dict]) -> dict[str, float]:
    """What a speculative decoder's round costs in one-token steps, from decoded images' stats rows (ImageStats.row)
    of the method and of plain AR on the same images: per target forward (a round; the prefill counts as one), its
    time spent drafting, verifying and on the rest (acceptance, sampling, bookkeeping), in units of plain AR's time
    per forward; tau = tokens per forward. The round pays off when it costs fewer steps than the tokens it yields:
    speedup (plain AR's total time over the method's) is about tau / round_steps."""
    if not spec_rows or not ar_rows:
        raise ValueError("round_costs needs the stats rows of at least one image of each decoder")
    total = lambda rows, key: sum(float(r[key]) for r in rows)  # noqa: E731
    step = total(ar_rows, "time_total_s") / total(ar_rows, "target_forwards")
    if step <= 0:
        raise ValueError(f"plain AR cannot take {step} s per forward")
    forwards = total(spec_rows, "target_forwards")
    out = {f"{part}_steps": total(spec_rows, f"time_{part}_s") / forwards / step for part in ("draft", "verify", "other")}
    out["round_steps"] = total(spec_rows, "time_total_s") / forwards / step
    out["tau"] = total(spec_rows, "n_tokens") / forwards
    out["speedup"] = total(ar_rows, "time_total_s") / total(spec_rows, "time_total_s")
    return out
