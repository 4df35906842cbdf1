"""Vanilla decoding, eager against torch.compile'd decode steps (generate(..., compile=True)), per image, one process.

    python benchmarks/bench_compile.py [--target models/toy/default/target.pt] [--size GPT-B] [--tokens 256]
        [--batch 1 8] [--cfg 2.0] [--mode sampling] [--repeats 3] [--models toy gpt] [--device auto]
        [--toy-threads 1] [--threads N]

Models: the toy target (its checkpoint when present, else random weights of its shape) and a random-weight
GPT-B-shaped model with --tokens image tokens (a square; fewer than 256 keeps CPU runs short). Per (model, batch):
one untimed eager warm-up; the first compiled call, timed on its own since it compiles (compile_s = that call minus
the best steady compiled call); then --repeats rounds of one eager and one compiled run, alternating so that machine
load hits both alike, the best round of each kept. ms_per_image = batch wall time / B; speedup = eager / compiled per
image; *_ms_per_step = batch wall time / image tokens (one batched decode step); same_tokens: the two paths drew
the same tokens (same generators).
"""

import argparse
import time
from pathlib import Path

import pandas as pd
import torch

from lantern.engine.checkpoint import load_gpt, parse_device, parse_dtype
from lantern.engine.generate import generate
from lantern.engine.model import GPT, ModelArgs, named_args, num_params
from lantern.engine.sampling import SamplingParams, image_generator

TOY = Path("models/toy/default/target.pt")
# the toy world's target (models/toy/default/target.json), for random weights when its checkpoint is absent
TOY_ARGS = ModelArgs(dim=128, n_layer=6, n_head=4, vocab_size=512, num_classes=16, image_tokens=64, multiple_of=64)


def timed(device, fn):
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def bench(name: str, model: GPT, a, device, threads: int) -> list[dict]:
    torch.set_num_threads(threads)
    params = SamplingParams(cfg_scale=a.cfg, greedy=a.mode == "greedy", top_k=a.top_k)
    N = model.args.image_tokens
    print(f"{name}: {num_params(model) / 1e6:.1f}M params, {N} tokens/image, cfg {a.cfg}, {a.mode}, {device} "
          f"{a.dtype}, {torch.get_num_threads()} thread(s)", flush=True)
    rows = []
    for B in a.batch:
        cond = torch.arange(B, device=device) % model.args.num_classes
        gens = lambda: [image_generator(a.seed, i) for i in range(B)]  # noqa: E731
        run = lambda c: generate(model, cond, params, gens(), compile=c)[0]  # noqa: E731
        run(False)  # eager warm-up
        first_s, _ = timed(device, lambda: run(True))
        eager_s, compiled_s, same = [], [], True
        for _ in range(a.repeats):
            t, want = timed(device, lambda: run(False))
            eager_s.append(t)
            t, got = timed(device, lambda: run(True))
            compiled_s.append(t)
            same &= torch.equal(want, got)
        e, c = min(eager_s), min(compiled_s)
        rows.append({"model": name, "batch": B, "eager_ms_per_image": 1e3 * e / B,
                     "compiled_ms_per_image": 1e3 * c / B, "speedup": e / c, "compile_s": first_s - c,
                     "eager_ms_per_step": 1e3 * e / N, "compiled_ms_per_step": 1e3 * c / N, "same_tokens": same})
        print(f"  batch {B}: eager {e:.2f} s, compiled {c:.2f} s per batch, first compiled call {first_s:.1f} s",
              flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=str(TOY), help="the toy target checkpoint")
    ap.add_argument("--size", default="GPT-B")
    ap.add_argument("--tokens", type=int, default=256, help="image tokens of the GPT-B-shaped model (a square)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--cfg", type=float, default=2.0)
    ap.add_argument("--mode", default="sampling", choices=["sampling", "greedy"])
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--models", nargs="+", default=["toy", "gpt"], choices=["toy", "gpt"])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--toy-threads", type=int, default=1, help="torch threads for the toy target")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads for GPT-B")
    a = ap.parse_args()
    device, dtype = parse_device(a.device), parse_dtype(a.dtype)
    rows = []
    with torch.no_grad():
        if "toy" in a.models:
            if Path(a.target).is_file():
                toy, name = load_gpt(a.target, dtype=a.dtype, device=str(device)).eval(), "toy"
            else:
                torch.manual_seed(0)
                toy, name = GPT(TOY_ARGS).to(device=device, dtype=dtype).eval(), "toy(random)"
            rows += bench(name, toy, a, device, a.toy_threads)
            del toy
        if "gpt" in a.models:
            torch.manual_seed(0)
            gpt = GPT(named_args(a.size, image_tokens=a.tokens)).to(device=device, dtype=dtype).eval()
            rows += bench(a.size, gpt, a, device, a.threads)
    print(f"torch {torch.__version__}; ms_per_image = best batch wall time / B over {a.repeats} alternating rounds; "
          "speedup = eager / compiled; compile_s = first compiled call - a steady one (not in the timed runs)")
    print(pd.DataFrame(rows).to_string(index=False, float_format=lambda x: f"{x:.2f}"))


if __name__ == "__main__":
    main()
