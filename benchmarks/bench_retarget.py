"""LANTERN-TV's relaxed target: what limiting the flow's sources to a position's largest surpluses costs and saves.

    python benchmarks/bench_retarget.py [--world models/toy/default] [--images 8] [--delta 0.2] [--k 100]
        [--sources 16 32 64 128 0]

Decodes `--images` images at batch 8 (CFG 2, sampling) with the LANTERN-TV chain (gamma 4) on the shipped toy
models and records the (p, q) of every position it retargets. Then, for each `--sources` M (0 = every surplus code:
the full flow), in one process on one thread: the mean acceptance rate toward p~, sum_v min(p~(v), q(v)) (what the
flow maximises; the exact-SD acceptance of a draft from q), the mean mass moved (<= delta), the share of a position's
surplus that its M largest surpluses hold, and the median time of a retarget call over 32 positions (the chain's
batch-8 call), round-robin with the full flow's. Then the same for deterministic drafts (q the point mass on the
drafter's argmax x, as greedy chains and top-k trees verify): the mass moved and how often x becomes p~'s argmax.
engine/rules/retarget.py's docstring quotes its output for SOURCES.

    python benchmarks/bench_retarget.py --padded [--world models/toy/default] [--k 100] [--padded-k 100 1000]

The fixed-shape form instead (no decode): D, the padded degree of padded_neighbours, for the toy world's table at
--k, then on a random table of 16384 codes (each code's k nearest a random k others) at each --padded-k, D, the
adjacency's memory, and the median time of a call over 32 positions of retarget (eager, shapes shrinking with the
live edges) and of retarget_padded (every slot, every round), round-robin on one thread. The positions are synthetic
(p = softmax(3 z), q = softmax(3 z + 1.5 z'), z, z' standard normal), not a decode's.
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from lantern.engine import methods
from lantern.engine.rules import retarget as module
from lantern.worlds.llamagen.upstream import load_gpt
from lantern.engine.rules.neighbours import NeighbourParams, build_table, read_codebook
from lantern.engine.decoding.sampling import SamplingParams, image_generator
from lantern.io import save_torch


def record_positions(world: Path, images: int, delta: float, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    target = load_gpt(world / "target.pt")
    table = build_table(read_codebook(world / "vq.pt"), NeighbourParams(k=k))
    with tempfile.TemporaryDirectory() as tmp:
        save_torch(table, f"{tmp}/neighbours.pt")
        spec = {"name": "lanterntv", "drafting": "chain", "gamma": 4, "delta": delta, "k": k}
        decode = methods.build_decoder(spec, SamplingParams(cfg_scale=2.0), target, world / "drafter.pt",
                                       f"{tmp}/neighbours.pt", world / "vq.pt", torch.device("cpu"), False)
    pairs, full = [], module.retarget

    def recording(p, q, *args, **kwargs):
        pairs.append((p.reshape(-1, p.shape[-1]).clone(), q.reshape(-1, q.shape[-1]).clone()))
        return full(p, q, *args, **kwargs)

    module.retarget = recording
    try:
        with torch.no_grad():
            for start in range(0, images, 8):
                index = range(start, min(start + 8, images))
                decode(torch.tensor(index) % target.args.num_classes, [image_generator(0, i) for i in index])
    finally:
        module.retarget = full
    P = torch.cat([p for p, _ in pairs]).double()
    Q = torch.cat([q for _, q in pairs]).double()
    return P, Q, table["neighbours"][:, :k]


def call_ms(P, Q, table, k, delta, sources, rows=32) -> float:
    t0 = time.perf_counter()
    for i in range(0, len(P) - rows + 1, rows):
        module.retarget(P[i:i + rows], Q[i:i + rows], table, k, delta, sources=sources)
    return (time.perf_counter() - t0) / (len(P) // rows) * 1e3


def random_table(V: int, k: int, g: torch.Generator) -> torch.Tensor:
    """[V, k] int16: each code's "nearest" codes a random k others (no self, no repeats), built in blocks."""
    rows = []
    for i in range(0, V, 1024):
        r = torch.rand(min(1024, V - i), V, generator=g)
        r[torch.arange(r.shape[0]), torch.arange(i, i + r.shape[0])] = -1.0
        rows.append(r.topk(k, -1).indices.to(torch.int16 if V <= 32767 else torch.int32))
    return torch.cat(rows)


def padded_main(a) -> None:
    torch.set_num_threads(1)
    table = build_table(read_codebook(a.world / "vq.pt"), NeighbourParams(k=a.k))["neighbours"]
    adj = module.padded_neighbours(table, a.k)
    print(f"toy table ({table.shape[0]} codes), k {a.k}: D {adj.shape[1]} (mean degree {2 * a.k}), "
          f"{adj.numel() * 4 / 2**20:.1f} MiB int32")
    V, rows, g = 16384, 32, torch.Generator().manual_seed(0)
    z = torch.randn(rows, V, generator=g, dtype=torch.float64) * 3
    P, Q = torch.softmax(z, -1), torch.softmax(z + torch.randn(rows, V, generator=g, dtype=torch.float64) * 1.5, -1)
    print(f"random tables of {V} codes, {rows} synthetic positions, delta {a.delta:g}, sources {module.SOURCES}; "
          f"one thread, medians of {a.repeats} round-robin calls")
    print(f"{'k':>6} {'D':>6} {'adj MiB':>8} {'retarget ms':>12} {'padded ms':>10} {'ratio':>6} {'max |diff|':>11}")
    for k in a.padded_k:
        table = random_table(V, k, g)
        adj = module.padded_neighbours(table, k)
        want = module.retarget(P, Q, table, k, a.delta)  # also builds the CSR, once, outside the timing
        diff = (module.retarget_padded(P, Q, adj, a.delta) - want).abs().max().item()
        times = {"eager": [], "padded": []}
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            module.retarget(P, Q, table, k, a.delta)
            times["eager"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            module.retarget_padded(P, Q, adj, a.delta)
            times["padded"].append(time.perf_counter() - t0)
        eager, padded = (statistics.median(times[m]) * 1e3 for m in ("eager", "padded"))
        print(f"{k:>6} {adj.shape[1]:>6} {adj.numel() * 4 / 2**20:8.1f} {eager:12.1f} {padded:10.1f} "
              f"{padded / eager:5.1f}x {diff:11.1e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=Path, default=Path("models/toy/default"))
    ap.add_argument("--images", type=int, default=8)
    ap.add_argument("--delta", type=float, default=0.2)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--sources", type=int, nargs="+", default=[16, 32, 64, 128, 0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--padded", action="store_true", help="time the fixed-shape form instead (the second usage)")
    ap.add_argument("--padded-k", type=int, nargs="+", default=[100, 1000])
    a = ap.parse_args()
    if a.padded:
        if a.k < 1 or any(k < 1 for k in a.padded_k) or not 0 < a.delta <= 1 or a.repeats < 1:
            ap.error("--k and --padded-k must be >= 1, --delta in (0, 1], --repeats >= 1")
        return padded_main(a)
    if a.images < 1 or a.k < 1 or not 0 < a.delta <= 1 or any(m < 0 for m in a.sources):
        ap.error("--images and --k must be >= 1, --delta in (0, 1], --sources >= 0 (0 = all)")
    torch.set_num_threads(1)
    P, Q, table = record_positions(a.world, a.images, a.delta, a.k)
    V = P.shape[-1]
    give = (P - Q).clamp(min=0)
    print(f"{len(P)} positions of a LANTERN-TV decode (delta {a.delta:g}, k {a.k}, {a.images} images at batch 8), "
          f"{int((give > 0).sum(-1).float().mean())} surplus codes a position on average; one thread, medians of "
          f"{a.repeats} round-robin passes")
    sizes = [m if m else V for m in a.sources]
    times = {m: [] for m in sizes}
    for _ in range(a.repeats):
        for m in sizes:
            times[m].append(call_ms(P, Q, table, a.k, a.delta, m))
    print(f"{'sources':>8} {'surplus share':>14} {'acceptance':>11} {'moved':>8} {'ms / call':>10} {'vs full':>8}")
    full_ms = statistics.median(times[V])
    for m in sizes:
        pt = module.retarget(P, Q, table, a.k, a.delta, sources=m)
        share = (give.topk(min(m, V), -1).values.sum(-1) / give.sum(-1)).mean().item()
        ms = statistics.median(times[m])
        print(f"{m if m < V else 'all':>8} {share:14.3f} {torch.minimum(pt, Q).sum(-1).mean().item():11.4f} "
              f"{(0.5 * (pt - P).abs().sum(-1)).mean().item():8.4f} {ms:10.1f} {full_ms / ms:7.1f}x")
    x = Q.argmax(-1)
    point = torch.zeros_like(P).scatter_(1, x[:, None], 1.0)
    print(f"deterministic drafts (q = the point mass on q's argmax x; x is p's argmax at {(P.argmax(-1) == x).float().mean().item():.3f})")
    print(f"{'sources':>8} {'moved':>8} {'x = argmax p~':>14}")
    for m in sizes:
        pt = module.retarget(P, point, table, a.k, a.delta, sources=m)
        print(f"{m if m < V else 'all':>8} {(0.5 * (pt - P).abs().sum(-1)).mean().item():8.4f} "
              f"{(pt.argmax(-1) == x).float().mean().item():14.3f}")


if __name__ == "__main__":
    main()
