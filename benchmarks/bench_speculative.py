"""Speculative decoding on trained checkpoints: vanilla, chain SD, LANTERN, static and dynamic trees, SJD (Jacobi
windows 4/8/16, no drafter), one process.

    python benchmarks/bench_speculative.py --target T.pt --drafter D.pt --neighbours NB.pt [--vq VQ.pt]
        [--images 16] [--quick | --vvs] [--modes greedy sampling] [--out bench.csv]

--vvs: only VVS (verification skipping every 5th and every 2nd round) on LANTERN's default point of
config/config.yaml (chain gamma 4, delta 0.1, k 3), beside that point, the exact chain and vanilla.

Batch 1, one image at a time. Every method decodes the same images (class i mod num_classes, generator from
(seed, i)); images are the outer loop and methods the inner one, so a change in machine load hits every method
alike. One untimed warm-up image per decoder family comes first. Per (mode, method): tau = tokens per target
forward, the bonus/correction token and the prefill forward counted; the mean accepted drafts per verification
step (= the accepted depth for trees); the mean drafted tree depth; target and drafter forwards per image; mean
wall-clock latency per image; speed-up = vanilla latency / latency in the same mode.
"""

import argparse
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from lantern.engine.models.checkpoint import parse_device

from lantern.worlds.llamagen.upstream import load_gpt
from lantern.engine.models.drafter import load_drafter
from lantern.errors import UserError
from lantern.engine.decoding.generate import generate
from lantern.engine.decoding.sampling import SamplingParams, image_generator
from lantern.io import atomic_path
from lantern.engine import methods as registry
from lantern.engine.decoding.speculative import decode

DELTAS, KS, LAMS = (0.01, 0.05, 0.1, 0.2, 0.4), (1, 5, 10, 50), (2, 5, 10)
# naive_extend_57: the LANTERN++ default; twin_chain_8: a CPU-sized shape (see lantern.engine.decoding.trees)
STATIC_TREES = ("naive_extend_57", "twin_chain_8")
DYNAMIC_TREES = {"59/4/10": {"total_tokens": 59, "depth": 4, "top_k": 10}}


def methods(quick: bool, tree_k: int, vvs: bool = False) -> list[dict]:
    """The grid as sweep method specs (the keys `lantern sample` takes)."""
    if vvs:
        default = {"name": "lantern", "drafting": "chain", "gamma": 4, "delta": 0.1, "k": 3}
        out = [{"name": "vanilla"}, {"name": "exact", "drafting": "chain", "gamma": 4}, default]
        out += [{**default, "skip": "every", "skip_every": i} for i in (5, 2)]
        return [registry.normalize(m) for m in out]
    deltas, ks, lams = ((0.1, 0.2), (10, 50), (5,)) if quick else (DELTAS, KS, LAMS)
    out = [{"name": "vanilla"}]
    out += [{"name": "exact", "drafting": "chain", "gamma": g} for g in (4, 8)]
    out += [{"name": "lantern", "drafting": "chain", "gamma": 4, "delta": d, "k": k} for d in deltas for k in ks]
    out += [{"name": "lantern", "drafting": "chain", "gamma": 8, "delta": d, "k": max(ks)} for d in deltas]
    out += [{"name": "exact", "drafting": "jacobi", "window": w} for w in (4, 8, 16)]  # SJD
    trees = [{"drafting": "static", "tree": name} for name in STATIC_TREES]
    trees += [{"drafting": "dynamic", **spec} for spec in DYNAMIC_TREES.values()]
    for t in trees:
        out.append({"name": "exact", **t})
        out += [{"name": "lantern", **t, "delta": d, "k": tree_k} for d in (0.1, 0.2) if d in deltas]
        out += [{"name": "lanternpp", **t, "lam": lam, "k": tree_k} for lam in lams]
    return [registry.normalize(m) for m in out]


def setting(m: dict) -> str:
    return registry.setting(m) or "-"


def decoder(m: dict, params: SamplingParams, target, drafter, table):
    """(label, generator) -> (tokens [N], stats) for one method."""
    device = target.output.weight.device
    if m["name"] == "vanilla":
        def vanilla(label, g):
            tokens, stats = generate(target, torch.tensor([label], device=device), params, [g])
            return tokens[0], stats[0]
        return vanilla
    rule, drafting = registry.rule(m), registry.drafting(m)
    t = table if rule.relaxed else None
    d = drafter if registry.needs_drafter(m) else None  # Jacobi (SJD): the target drafts for itself

    def speculative(label, g):  # one image: a batch of one
        tokens, stats = decode(target, d, torch.tensor([label], device=device), params, rule, drafting, [g], t)
        return tokens[0], stats[0]
    return speculative


def read_table(path: str, vq: str | None, vocab: int, k: int) -> torch.Tensor:
    from lantern.engine.rules.neighbours import load_neighbours, read_codebook

    if vq:
        return load_neighbours(path, read_codebook(vq), k)
    if not Path(path).is_file():
        raise UserError(f"--neighbours {path} does not exist; build it with `lantern neighbours`")
    obj = torch.load(path, map_location="cpu", weights_only=True)
    table = obj["neighbours"]
    if table.shape[0] != vocab or table.shape[1] < k:
        raise UserError(f"--neighbours {path} is [{table.shape[0]}, {table.shape[1]}]; need [{vocab}, >= {k}]")
    return table[:, :k].long()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--neighbours", required=True, help="neighbour table (`lantern neighbours`)")
    ap.add_argument("--vq", help="VQ checkpoint: checks the table against its codebook (optional)")
    ap.add_argument("--images", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--modes", nargs="+", default=["greedy", "sampling"], choices=["greedy", "sampling"])
    ap.add_argument("--cfg", type=float, default=2.0)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--tree-k", type=int, default=50, help="neighbours k of the tree LANTERN / LANTERN++ rows")
    ap.add_argument("--quick", action="store_true", help="a small grid (a few minutes)")
    ap.add_argument("--vvs", action="store_true", help="VVS on LANTERN's default point only (see above)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (tiny models decode fastest on one)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", help="also write the table as CSV")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    device = parse_device(a.device)
    target = load_gpt(a.target, device=str(device))
    drafter = load_drafter(a.drafter, target)
    grid = methods(a.quick, a.tree_k, a.vvs)
    k_max = max(m.get("k", 0) + 1 for m in grid)
    table = read_table(a.neighbours, a.vq, target.args.vocab_size, min(k_max, target.args.vocab_size - 1)).to(device)
    classes = target.args.num_classes
    print(f"target {a.target}: {sum(p.numel() for p in target.parameters()) / 1e6:.2f}M params, "
          f"{target.args.image_tokens} tokens/image; {a.images} images, batch 1, cfg {a.cfg}, "
          f"{torch.get_num_threads()} thread(s), {device}")
    rows = []
    with torch.no_grad():
        for mode in a.modes:
            params = SamplingParams(cfg_scale=a.cfg, temperature=a.temperature, top_k=a.top_k, greedy=mode == "greedy")
            runs = [(m, decoder(m, params, target, drafter, table)) for m in grid]
            for family in {m.get("drafting", "none"): run for m, run in runs}.values():  # warm-up
                family(0, image_generator(a.seed + 1, 0))
            results = {id(m): [] for m, _ in runs}
            t_mode = time.perf_counter()
            for i in range(a.images):
                for m, run in runs:
                    t0 = time.perf_counter()
                    _, stats = run(i % classes, image_generator(a.seed, i))
                    results[id(m)].append((time.perf_counter() - t0, stats))
            for m, _ in runs:
                lat = [t for t, _ in results[id(m)]]
                stats = [s for _, s in results[id(m)]]
                steps = [a for s in stats for a in s.accepted_per_step]
                depth = [d for s in stats for d in getattr(s, "tree_depth", [])]
                rows.append({
                    "mode": mode, "method": m["name"], "setting": setting(m),
                    "tau_incl_bonus": sum(s.n_tokens for s in stats) / sum(s.target_forwards for s in stats),
                    "accepted_depth": sum(steps) / len(steps) if steps else float("nan"),
                    "tree_depth": sum(depth) / len(depth) if depth else float("nan"),
                    "target_fwd": sum(s.target_forwards for s in stats) / len(stats),
                    "drafter_fwd": sum(s.drafter_forwards for s in stats) / len(stats),
                    "latency_ms": 1e3 * sum(lat) / len(lat),
                })
            print(f"{mode}: {time.perf_counter() - t_mode:.0f} s")
    df = pd.DataFrame(rows)
    vanilla = df[df["method"] == "vanilla"].set_index("mode")["latency_ms"]
    df["speedup"] = vanilla.reindex(df["mode"]).to_numpy() / df["latency_ms"]
    print("tau_incl_bonus = tokens per target forward (bonus/correction token and prefill counted); accepted_depth = drafts "
          "accepted per verification step; speedup = vanilla latency / latency (same mode, wall clock)")
    print(df.to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    if a.out:
        with atomic_path(a.out) as tmp:
            df.to_csv(tmp, index=False)


if __name__ == "__main__":
    try:
        main()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
