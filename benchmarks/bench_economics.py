"""Drafter step / target step and verify / target step, at batch 1 and 8 under CFG, all in one process.

    python benchmarks/bench_economics.py [--world models/toy/default] [--sizes GPT-B GPT-XL] [--shape 16x96 ...]

Rows: the shipped toy target and drafter; then LlamaGen shapes (random weights, 16 x 16 tokens, 16384 codes) and any
candidate toy shapes (--shape LAYERSxWIDTH, random weights, the toy world's tokens and codebook). Issue #31 asks
the toy world for drafter / step <= 0.08 and a 5-position verify <= 1.3 x a step, as LlamaGen-XL's on a GPU.
"""

import argparse
from pathlib import Path

import torch

from lantern.engine.checkpoint import load_gpt, parse_device, parse_dtype
from lantern.engine.drafter import Drafter, load_drafter
from lantern.engine.model import GPT, ModelArgs, named_args, num_params
from lantern.metrics.economics import ratios, step_costs


def report(name: str, target: GPT, drafter, batches, positions, repeats) -> None:
    a = target.args
    for B in batches:
        c = step_costs(target, drafter, B, positions=positions, repeats=repeats)
        r = ratios(c)
        print(f"{name:<22} {a.n_layer:>3}x{a.dim:<5} {num_params(target) / 1e6:8.1f}M  batch {B}  "
              f"step {c.target_step_s * 1e3:8.2f} ms  drafter/step {r['drafter_over_step']:.3f}  "
              f"verify{positions}/step {r['verify_over_step']:.2f}", flush=True)


def random_pair(args: ModelArgs, device, dtype) -> tuple[GPT, Drafter]:
    torch.manual_seed(0)
    target = GPT(args).to(device=device, dtype=dtype).eval()
    return target, Drafter.from_target(target).to(dtype=dtype).eval()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", default="models/toy/default", help="folder with target.pt and drafter.pt ('' to skip)")
    ap.add_argument("--sizes", nargs="*", default=["GPT-B", "GPT-XL"], help="LlamaGen shapes, random weights")
    ap.add_argument("--shape", nargs="*", default=[], help="candidate toy shapes LAYERSxWIDTH, random weights")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--positions", type=int, default=5, help="verify length: gamma + 1")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    ap.add_argument("--dtype", default="fp32", help="fp32, bf16 or fp16")
    a = ap.parse_args()
    device, dtype = parse_device(a.device), parse_dtype(a.dtype)
    if a.threads:
        torch.set_num_threads(a.threads)
    print(f"{device} {a.dtype}, torch threads {torch.get_num_threads()}; medians of {a.repeats} round-robin calls; CFG rows included")
    toy_args = None
    if a.world:
        world = Path(a.world)
        target = load_gpt(world / "target.pt", dtype=a.dtype, device=str(device))
        drafter = load_drafter(world / "drafter.pt", target).eval()  # on the target's device and dtype
        report(f"toy {world.name}", target, drafter, a.batch,
               a.positions, a.repeats)
        toy_args = target.args
    for size in a.sizes:
        report(f"{size} (random)", *random_pair(named_args(size, image_tokens=256, vocab_size=16384), device, dtype),
               a.batch,
               a.positions, max(3, a.repeats // 6))
    base = toy_args.to_dict() if toy_args else dict(vocab_size=512, num_classes=16, image_tokens=64)
    for shape in a.shape:
        layers, width = (int(x) for x in shape.lower().split("x"))
        kw = {k: base[k] for k in ("vocab_size", "num_classes", "image_tokens") if k in base}
        args = ModelArgs(n_layer=layers, dim=width, n_head=max(1, width // 32), **kw)
        report(f"candidate {shape}", *random_pair(args, device, dtype), a.batch, a.positions, a.repeats)


if __name__ == "__main__":
    main()
