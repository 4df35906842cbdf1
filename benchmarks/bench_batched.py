"""Batched speculative decoding (engine/decoding/rounds.py, tree_rounds.py, jacobi.py) against batched vanilla decoding,
per image, one process.

    python benchmarks/bench_batched.py [--images 32] [--batch 1 8 32] [--target T.pt --drafter D.pt --vq VQ.pt]
        [--mode sampling] [--cfg 2.0] [--threads 1] [--methods vanilla exact ...]

Methods: vanilla (generate.generate); chains (gamma 4): exact and LANTERN (delta 0.2, k 50); static trees
twin_chain_8 and naive_extend_57 (tc8, ne57), each exact and LANTERN++ (lam 5, k 50); the exact dynamic tree
(EAGLE-2 defaults: 59 tokens, depth 4, top_k 10); SJD and GSD (Jacobi window 16; GSD k 50, group 14, gap 0.15,
built by the registry as a sweep point is); each at every batch size (--methods picks some).
Every method decodes the same --images images (class i mod num_classes, generator from (seed, i)) in
batches of B; batches are the outer loop and methods the inner one, so a change in machine load hits every method
alike; one untimed warm-up batch per method first. Per (method, batch): per-image wall time (batch time / B,
averaged), tau (tokens per target forward, prefill counted). Ratios, all from this one run: batch-B vs batch-1
per-image cost of each method, and batched LANTERN (and exact) vs batched vanilla per image at each batch size.
The toy-world checkpoints (models/toy/default, `make run` ships them) are used when present; otherwise random-weight
models of the same shape (tau then means little, the timings still do).
"""

import argparse
import time
from pathlib import Path

import pandas as pd
import torch

from lantern.engine import methods
from lantern.engine.rules.acceptance import AcceptRule
from lantern.engine.decoding.chain import Chain
from lantern.worlds.llamagen.upstream import load_gpt
from lantern.engine.models.drafter import Drafter, load_drafter
from lantern.engine.decoding.generate import generate
from lantern.engine.decoding.jacobi import Jacobi
from lantern.engine.models.model import GPT, ModelArgs
from lantern.engine.rules.neighbours import nearest_neighbours, read_codebook
from lantern.engine.decoding.sampling import SamplingParams, image_generator
from lantern.engine.decoding.speculative import decode
from lantern.engine.decoding.trees import DynamicTree, static_tree

TOY = Path("models/toy/default")
# the toy world's target (models/toy/default/target.json), for random weights when its checkpoints are absent
TOY_ARGS = ModelArgs(dim=128, n_layer=6, n_head=4, vocab_size=512, num_classes=16, image_tokens=64, multiple_of=64)


def models(a) -> tuple[GPT, Drafter, torch.Tensor, str]:
    """(target, drafter, neighbour table [V, k], where they came from)."""
    paths = [Path(p) for p in (a.target, a.drafter, a.vq)]
    if all(p.is_file() for p in paths):
        target = load_gpt(a.target)
        table = nearest_neighbours(read_codebook(a.vq), a.k).long()
        return target, load_drafter(a.drafter, target), table, f"checkpoints {a.target}, {a.drafter}"
    missing = ", ".join(str(p) for p in paths if not p.is_file())
    torch.manual_seed(0)
    target = GPT(TOY_ARGS).eval()
    table = nearest_neighbours(torch.randn(TOY_ARGS.vocab_size, 8), a.k).long()
    return target, Drafter.from_target(target).eval(), table, f"RANDOM weights of the toy shape ({missing} absent)"


def decoders(target: GPT, drafter: Drafter, table: torch.Tensor, params: SamplingParams, a) -> dict:
    """name -> (cond [B], generators) -> stats."""
    exact, lantern = AcceptRule(), AcceptRule("lantern", delta=a.delta, k=a.k)
    lanternpp = AcceptRule("lanternpp", lam=a.lam, k=a.k)
    tc8, ne57 = static_tree("twin_chain_8"), static_tree("naive_extend_57")
    jacobi = Jacobi(a.window)
    gsd = methods.rule(methods.normalize({"name": "gsd", "drafting": "jacobi", "window": a.window, "k": a.k,
                                          "group": a.group, "gap": a.gap}))

    def spec(rule, drafting):
        return lambda cond, g: decode(target, drafter, cond, params, rule, drafting, g, table)[1]

    runs = {
        "vanilla": lambda cond, g: generate(target, cond, params, g)[1],
        "exact": spec(exact, Chain(a.gamma)),
        f"lantern(d={a.delta:g},k={a.k})": spec(lantern, Chain(a.gamma)),
        "exact tc8": spec(exact, tc8),
        f"lantern++(l={a.lam:g},k={a.k}) tc8": spec(lanternpp, tc8),
        "exact ne57": spec(exact, ne57),
        f"lantern++(l={a.lam:g},k={a.k}) ne57": spec(lanternpp, ne57),
        "exact dynamic": spec(exact, DynamicTree()),
        f"sjd(w={a.window})": lambda cond, g: decode(target, None, cond, params, exact, jacobi, g)[1],
        f"gsd(w={a.window},k={a.k},g={a.group},gap={a.gap:g})": lambda cond, g: decode(
            target, None, cond, params, gsd, jacobi, g, table)[1],
    }
    if a.methods:
        unknown = [m for m in a.methods if m not in runs]
        if unknown:
            raise SystemExit(f"unknown method(s) {unknown}; choose from {list(runs)}")
        runs = {m: runs[m] for m in runs if m == "vanilla" or m in a.methods}  # vanilla: the ratios' baseline
    return runs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=str(TOY / "target.pt"))
    ap.add_argument("--drafter", default=str(TOY / "drafter.pt"))
    ap.add_argument("--vq", default=str(TOY / "vq.pt"), help="VQ checkpoint: its codebook gives the neighbour table")
    ap.add_argument("--images", type=int, default=32, help="images per (method, batch size); >= the largest batch")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--mode", default="sampling", choices=["sampling", "greedy"])
    ap.add_argument("--cfg", type=float, default=2.0)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--delta", type=float, default=0.2)
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--lam", type=float, default=5.0, help="LANTERN++ lambda of the static-tree methods")
    ap.add_argument("--window", type=int, default=16, help="Jacobi window of SJD and GSD")
    ap.add_argument("--group", type=int, default=14, help="GSD group")
    ap.add_argument("--gap", type=float, default=0.15, help="GSD probability gap")
    ap.add_argument("--methods", nargs="+", help="only these methods (names as in the table; vanilla always runs)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    if a.images < max(a.batch):
        ap.error(f"--images {a.images} is below the largest batch {max(a.batch)}")
    torch.set_num_threads(a.threads)
    target, drafter, table, source = models(a)
    params = SamplingParams(cfg_scale=a.cfg, greedy=a.mode == "greedy")
    runs = decoders(target, drafter, table, params, a)
    classes, n = target.args.num_classes, a.images
    print(f"{source}; {target.args.image_tokens} tokens/image, {a.mode}, cfg {a.cfg}, gamma {a.gamma}, "
          f"{n} images per point, {torch.get_num_threads()} thread(s), cpu; tc8 = static tree twin_chain_8, "
          f"ne57 = naive_extend_57, dynamic = EAGLE-2 tree (59 tokens, depth 4, top_k 10)")
    rows = []
    for B in a.batch:
        cond = lambda first: torch.arange(first, first + B) % classes  # noqa: E731
        gens = lambda first: [image_generator(a.seed, i) for i in range(first, first + B)]  # noqa: E731
        for run in runs.values():  # warm-up
            run(cond(0), [image_generator(a.seed + 1, i) for i in range(B)])
        seconds, stats = dict.fromkeys(runs, 0.0), {m: [] for m in runs}
        t_batch = time.perf_counter()
        for first in range(0, n - n % B, B):
            for m, run in runs.items():
                t0 = time.perf_counter()
                stats[m] += run(cond(first), gens(first))
                seconds[m] += time.perf_counter() - t0
        for m in runs:
            s = stats[m]
            rows.append({"method": m, "batch": B, "ms_per_image": 1e3 * seconds[m] / len(s),
                         "tau": sum(x.n_tokens for x in s) / sum(x.target_forwards for x in s)})
        print(f"batch {B}: {time.perf_counter() - t_batch:.0f} s")
    df = pd.DataFrame(rows)
    ms = df.set_index(["method", "batch"])["ms_per_image"]
    B1 = min(a.batch)
    df[f"cost_vs_batch{B1}"] = [ms[(m, b)] / ms[(m, B1)] for m, b in zip(df["method"], df["batch"])]
    df["speedup_vs_vanilla"] = [ms[("vanilla", b)] / ms[(m, b)] for m, b in zip(df["method"], df["batch"])]
    print(f"ms_per_image = batch wall time / B (mean); tau = tokens per target forward; cost_vs_batch{B1} = per-image "
          f"time / the same method's at batch {B1}; speedup_vs_vanilla = batched vanilla / method per image, same batch")
    print(df.to_string(index=False, float_format=lambda x: f"{x:.2f}"))


if __name__ == "__main__":
    main()
