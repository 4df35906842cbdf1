"""Deterministic kernels on CUDA, so that a rerun or a resumed job gives the same bytes on a GPU as on a CPU.

Non-deterministic on CUDA unless asked: atomics-based `cumsum` / `index_add_` / scatter (the sampling CDF, the
acceptance arithmetic, retarget.py's neighbour sums), cuBLAS's split-K workspaces, cuDNN's autotuned algorithms and
inductor's on-device autotuning (the fastest kernel can differ between runs, and with it the rounding).
`configure(device)` turns on, for a CUDA device: torch.use_deterministic_algorithms(True, warn_only=True) (an op
without a deterministic kernel warns instead of stopping a job), CUBLAS_WORKSPACE_CONFIG=:4096:8 (unless already set;
it must be set before cuBLAS starts, so call this right after choosing the device), cudnn.deterministic with
benchmarking off, and inductor's deterministic mode (no autotuning that changes numerics). A CPU needs none of them
and keeps its settings. It returns the settings in force, for the manifest.

A CPU job that compiles nothing never loads inductor: importing its config pulls in dynamo, 1.2-1.6 s of every
`lantern sample` job's start-up on this project's CPU (the default run starts about 30 of them).
"""

from __future__ import annotations

import os
import sys

import torch

CUBLAS_WORKSPACE = ":4096:8"


def configure(device: torch.device) -> dict:
    """Deterministic CUDA kernels for `device` (nothing on a CPU); returns `settings(device)`."""
    if torch.device(device).type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        import torch._inductor.config as inductor

        inductor.deterministic = True
    return settings(device)


def settings(device: torch.device) -> dict:
    """The determinism settings in force, as the manifest records them; inductor's switch is None while inductor
    is not loaded (nothing was compiled), so take them after the work when a job may compile."""
    inductor = sys.modules.get("torch._inductor.config")
    cuda = torch.device(device).type == "cuda"
    return {
        "applies": "cuda" if cuda else "not applicable on a CPU (its kernels are deterministic; nothing changed)",
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "inductor_deterministic": None if inductor is None else bool(inductor.deterministic),
    }
