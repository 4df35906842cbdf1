"""Vanilla decode throughput of a GPT-B-shaped LlamaGen model with random weights (the speed-work reference).

    python benchmarks/bench_vanilla.py [--size GPT-B] [--tokens 256] [--batch 1 8] [--cfg 2.0] [--device auto]
        [--dtype fp32] [--compile] [--repeats 1]

Prints image tokens per second per batch size, measured after one untimed warm-up run, all in one process; on
CUDA also the peak memory allocated during the batch (weights included). --compile runs the decode step through
CUDA graphs as `lantern sample` does on CUDA (compile: auto); without it, the eager reference.
"""

import argparse
import math
import time

import torch

from lantern.engine.models.checkpoint import parse_device, parse_dtype
from lantern.engine.decoding.generate import generate
from lantern.engine.decoding.sampling import SamplingParams, image_generator
from lantern.engine.models.model import GPT, named_args, num_params


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="GPT-B")
    ap.add_argument("--tokens", type=int, default=256, help="image tokens (a square: 256 = 16 x 16)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--cfg", type=float, default=2.0)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--compile", action="store_true", help="compiled decode step (CUDA graphs), as sample does on CUDA")
    a = ap.parse_args()
    device = parse_device(a.device)
    torch.manual_seed(0)
    model = GPT(named_args(a.size, image_tokens=a.tokens)).to(device=device, dtype=parse_dtype(a.dtype)).eval()
    params = SamplingParams(cfg_scale=a.cfg, top_k=1000)
    print(f"{a.size}: {num_params(model) / 1e6:.1f}M params, {a.tokens} tokens/image, cfg {a.cfg}, "
          f"{device} {a.dtype}, {'compiled' if a.compile else 'eager'}, torch threads {torch.get_num_threads()}")
    for B in a.batch:
        cond = torch.arange(B, device=device) % model.args.num_classes
        gens = lambda: [image_generator(0, i) for i in range(B)]  # noqa: E731
        run = lambda: generate(model, cond, params, gens(), compile=a.compile)  # noqa: E731
        run()  # warm-up (and compilation)
        times = []
        for _ in range(a.repeats):
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            _, stats = run()
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        best = min(times)
        print(f"batch {B:3d}: {B * a.tokens / best:9.1f} tokens/s  ({best:.2f} s per batch, "
              f"{best / a.tokens * 1e3:.2f} ms per decode step{peak_text(stats)})")


def peak_text(stats) -> str:
    peak = max(s.peak_mem_bytes for s in stats)
    return "" if math.isnan(peak) else f", peak memory {peak / 2**20:.0f} MiB"


if __name__ == "__main__":
    main()
