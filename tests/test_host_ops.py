"""A round's host work with compile on (benchmarks/bench_host_ops.py's count, on a CPU): within 2 B + 10 ATen
operators outside compiled regions per round, the bound of a round that runs as one graph (on CUDA: one CUDA graph
replay, the uniforms already on the device, one read), for chains, trees and Jacobi iterations. The eager rounds of the same decoder
are far over it, so the count would catch a round that fell back to host-side bookkeeping."""
import tempfile
from pathlib import Path

import pytest
import torch

from conftest import benchmark_script

bench = benchmark_script("bench_host_ops")
gpu_check = benchmark_script("gpu_check")


@pytest.fixture(scope="module")
def world():
    from lantern.engine.models.model import ModelArgs

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    with torch.no_grad(), tempfile.TemporaryDirectory() as folder:
        yield gpu_check.World(ModelArgs(**gpu_check.SMOKE_ARGS), torch.device("cpu"), torch.float32, Path(folder))
    torch.set_num_threads(n)


@pytest.mark.slow
@pytest.mark.parametrize("spec, greedy", [("chain-lantern", False), ("chain-lantern", True),
                                          ("static-lanternpp", False), ("dynamic-exact", False),
                                          ("jacobi-gsd", False), ("jacobi-sjd", True), ("chain-coolsd", False),
                                          ("chain-lanterntv", False)])
def test_a_compiled_round_stays_within_the_bound(world, spec, greedy):
    """Chains, LANTERN++'s static tree (the authors' 57 nodes), EAGLE-2's dynamic tree, Jacobi iterations (SJD, and
    GSD's grouped acceptance on them), Cool-SD's annealed chain and LANTERN-TV's."""
    from lantern.engine.decoding.sampling import SamplingParams

    params = SamplingParams(cfg_scale=2.0, greedy=greedy)
    with torch.no_grad():
        ops = bench.per_round(world, gpu_check.SPECS[spec], 3, params)
        eager = bench.per_round(world, gpu_check.SPECS[spec], 3, params, compile=False)
    assert ops <= bench.bound(3)
    assert eager > 5 * bench.bound(3)  # the count sees host-side rounds
