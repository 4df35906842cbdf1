"""Timing and per-image statistics, one path for every decoder, so speed-ups never come from different plumbing."""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import torch


class GpuPath:
    """How many sync counters (lantern.syncs.SyncCounter) run now: while one counts what the code would cost on a
    GPU, CPU-only shortcuts (`free_read`) stay off."""

    counting = 0


def free_read(t: torch.Tensor) -> bool:
    """Whether reading `t` into Python costs no device sync, so that a decoder may skip work it would do blindly on
    a GPU: a CPU tensor, except under a sync counter or inside a compiled graph (where a read is a graph break)."""
    return t.device.type == "cpu" and not GpuPath.counting and not torch.compiler.is_compiling()


class StepTimer:
    """Time per section. On CUDA a section records a pair of CUDA events and never synchronises the host: the
    device time between them is read once, when `seconds` is first asked for (after decoding). Elsewhere wall-clock
    time (perf_counter), the device being the host."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self._seconds: dict[str, float] = {}
        self._events: list[tuple[str, object, object]] = []

    @contextmanager
    def section(self, name: str):
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            try:
                yield
            finally:
                end.record()
                self._events.append((name, start, end))
            return
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._seconds[name] = self._seconds.get(name, 0.0) + time.perf_counter() - t0

    @property
    def seconds(self) -> dict[str, float]:
        if self._events:
            self._events[-1][2].synchronize()  # the one sync: after the last section
            for name, start, end in self._events:
                self._seconds[name] = self._seconds.get(name, 0.0) + start.elapsed_time(end) / 1e3
            self._events = []
        return self._seconds


@dataclass
class ImageStats:
    """Per-image decoding statistics. tau = tokens / target forwards: mean accepted length, bonus token counted.
    Per verification round: accepted_per_step = drafts accepted (the accepted depth of a tree), tree_depth = the
    deepest drafted node (a chain's drafted length)."""

    n_tokens: int
    target_forwards: int
    drafter_forwards: int = 0
    accepted_total: int = 0  # drafted tokens accepted over the whole image
    skipped_rounds: int = 0  # VVS: rounds that committed their drafts without a target verify (skipping.py)
    time_draft_s: float = 0.0
    time_verify_s: float = 0.0
    time_other_s: float = 0.0
    peak_mem_bytes: float = math.nan
    batch_size: int = 1
    accepted_per_step: list[int] = field(default_factory=list)
    tree_depth: list[int] = field(default_factory=list)

    @property
    def tau(self) -> float:
        return self.n_tokens / self.target_forwards

    @property
    def time_total_s(self) -> float:
        return self.time_draft_s + self.time_verify_s + self.time_other_s

    def finish(self, timer: StepTimer) -> "ImageStats":
        """The totals of a speculative decode: accepted drafts, the timer's sections, peak memory."""
        self.accepted_total = sum(self.accepted_per_step)
        self.time_draft_s = timer.seconds.get("draft", 0.0)
        self.time_verify_s = timer.seconds.get("verify", 0.0)
        self.time_other_s = timer.seconds.get("other", 0.0)
        self.peak_mem_bytes = peak_memory(timer.device)
        return self

    def row(self) -> dict:
        d = asdict(self)
        for key in ("accepted_per_step", "tree_depth"):
            d[key] = " ".join(map(str, d[key]))
        d.update(tau=self.tau, time_total_s=self.time_total_s, steps=len(self.accepted_per_step) or self.target_forwards)
        return d


def reset_peak_memory(device: torch.device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> float:
    return float(torch.cuda.max_memory_allocated(device)) if torch.device(device).type == "cuda" else math.nan
