"""Deterministic CUDA kernels (pipeline/determinism.py): switched on for a CUDA device, left alone on a CPU, and
recorded in `lantern sample`'s manifest either way."""
import json
import os
import subprocess
import sys

import pytest
import torch
import torch._inductor.config as inductor

from lantern.pipeline.determinism import configure, settings
from tiny import save_world, tiny_target


@pytest.fixture
def restored(monkeypatch):
    """configure() changes process-wide switches: put them back for the rest of the session."""
    state = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark, inductor.deterministic)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    yield
    torch.use_deterministic_algorithms(state[0], warn_only=state[1])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark, inductor.deterministic = state[2:]


def test_cuda_turns_on_every_switch(restored):
    got = configure(torch.device("cuda", 0))  # sets switches only: runs on a machine without CUDA
    assert got == {"applies": "cuda", "deterministic_algorithms": True, "deterministic_warn_only": True,
                   "cublas_workspace_config": ":4096:8", "cudnn_deterministic": True, "cudnn_benchmark": False,
                   "inductor_deterministic": True}
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8" and torch.are_deterministic_algorithms_enabled()


def test_a_users_cublas_setting_stands(restored, monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    assert configure(torch.device("cuda"))["cublas_workspace_config"] == ":16:8"


def test_cpu_changes_nothing_and_says_so(restored):
    before = settings(torch.device("cpu"))
    got = configure(torch.device("cpu"))
    assert got == before and got["applies"].startswith("not applicable")
    assert got["cublas_workspace_config"] is None and "CUBLAS_WORKSPACE_CONFIG" not in os.environ


def test_sample_manifest_records_the_settings(tmp_path, restored):
    from lantern.pipeline.sample import main as sample

    world = save_world(tmp_path, tiny_target())
    sample(["--target", str(world / "target.pt"), "--vq", str(world / "vq.pt"), "--method", '{"name": "vanilla"}',
            "--start", "0", "--end", "1", "--out", str(tmp_path / "out"), "--device", "cpu", "--threads", "1",
            "--no-warmup"])
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["determinism"] == settings(torch.device("cpu"))
    assert manifest["determinism"]["applies"].startswith("not applicable")


def test_an_eager_cpu_job_never_loads_inductor(tmp_path):
    """Inductor's config pulls in dynamo (over a second of every job's start-up); an eager CPU job needs neither, and
    its manifest then says null for inductor's switch. In a fresh process: this one has inductor loaded."""
    world = save_world(tmp_path, tiny_target())
    args = ["--target", str(world / "target.pt"), "--vq", str(world / "vq.pt"), "--method", '{"name": "vanilla"}',
            "--start", "0", "--end", "1", "--out", str(tmp_path / "out"), "--device", "cpu", "--threads", "1",
            "--no-warmup"]
    code = ("import json, sys; from lantern.pipeline.sample import main; main(json.loads(sys.argv[1])); "
            "print(sorted(m for m in ('torch._inductor', 'torch._dynamo') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(args)], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["determinism"]["inductor_deterministic"] is None
