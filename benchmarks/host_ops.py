"""Host-side ATen operators of a decoder: the CPU-checkable proxy for a round's host cost on a GPU.

On a GPU at batch 1-8 a round's time is its host work unless the round runs as CUDA graph replays: every ATen
operator dispatched from Python outside a compiled region is a kernel launch (or a host computation, or a copy) the
host pays for, round after round. `count(run)` runs `run()` under torch.profiler and counts the top-level `aten::`
operators (not those called by another operator) that run outside every "Torch-Compiled Region" (what dynamo
marks around a compiled frame) and outside a speculative decode's prefill and finish (speculative.PREFILL, FINISH:
once per batch, not per round). The count does not depend on the machine's speed or thread count.
"""

from __future__ import annotations

import torch

from lantern.engine.decoding.speculative import FINISH, PREFILL

COMPILED = "Torch-Compiled Region"
SKIPPED = (COMPILED, PREFILL, FINISH)  # inside a compiled frame, or a speculative decode's prefill and finish


def _outside(event) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::") or any(mark in parent.name for mark in SKIPPED):
            return False
        parent = parent.cpu_parent
    return True


def count(run) -> tuple[int, object]:
    """(the top-level ATen operators `run()` dispatches outside compiled regions, what run() returned)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = run()
    return sum(e.name.startswith("aten::") and _outside(e) for e in prof.events()), out
