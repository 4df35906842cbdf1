"""ATen operators dispatched outside compiled regions per round, every decoder, with compile on, on this CPU: the
proxy for what a round costs the host on a GPU (benchmarks/host_ops.py), checkable without one.

    python benchmarks/bench_host_ops.py [--specs NAME ...] [--batch 1 8] [--check]

The decoders of benchmarks/gpu_check.py's SPECS on its toy-shaped random target (6 layers, 128 wide, 8 x 8 tokens,
CFG 2, sampling), compiled as `lantern sample` compiles them (inductor on a CPU), one batch each after a warm-up.
Prints a table of operators per round against the bound 2 B + 10 (the per-image uniforms drawn and their
generators advanced, plus a constant); --check exits 1 when a decoder exceeds it. The counts depend on the code
alone, not on the machine.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import host_ops  # noqa: E402
from gpu_check import SPECS, World, batch  # noqa: E402

from lantern.engine.models.model import ModelArgs  # noqa: E402
from lantern.engine.decoding.sampling import SamplingParams  # noqa: E402

TOY = dict(dim=128, n_layer=6, n_head=4, vocab_size=512, num_classes=16, image_tokens=64, multiple_of=64)


def bound(B: int) -> int:
    return 2 * B + 10


def per_round(world: World, spec: dict, B: int, params: SamplingParams, compile: bool = True) -> float:
    run = world.decoder(spec, params, compile)
    run(*batch(world, B))  # compilation
    ops, (_, stats) = host_ops.count(lambda: run(*batch(world, B)))
    return ops / max(max(s.target_forwards for s in stats) - 1, 1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--specs", nargs="+", default=[k for k in SPECS if k != "vanilla"],
                    choices=[k for k in SPECS if k != "vanilla"])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--greedy", action="store_true", help="greedy decoding instead of sampling")
    ap.add_argument("--check", action="store_true", help="exit 1 when a decoder exceeds 2 B + 10 per round")
    a = ap.parse_args(argv)
    params = SamplingParams(cfg_scale=2.0, greedy=a.greedy)
    over = []
    with torch.no_grad(), tempfile.TemporaryDirectory() as folder:
        world = World(ModelArgs(**TOY), torch.device("cpu"), torch.float32, Path(folder))
        print(f"{'decoder':<20} {'batch':>5} {'ops/round':>10} {'bound':>6}")
        for name in a.specs:
            for B in a.batch:
                n = per_round(world, SPECS[name], B, params)
                flag = "" if n <= bound(B) else "  over"
                over += [name] if flag else []
                print(f"{name:<20} {B:>5} {n:>10.1f} {bound(B):>6}{flag}", flush=True)
    if a.check and over:
        print(f"bench_host_ops: over the bound: {', '.join(sorted(set(over)))}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
