"""What a chain round's acceptance costs at the paper's operating point (LANTERN, k = 1000 of 16384 codes, the
authors' reference residual) against k = 50 and the exact rule: the rule alone, timed in one process.

    python benchmarks/bench_rule_cost.py [--vocab 16384] [--ks 50 1000] [--gamma 4] [--batch 1 8] [--repeats 30]
        [--threads 1] [--device cpu]

For each batch size: random target distributions P [B, gamma + 1, V] and drafter distributions q [B, gamma, V],
drafts drawn from q, a random neighbour table of max(ks) + 1 columns; then chain.accept_chains (acceptance, the
residual at the first rejection, the next token's draw: everything a round does between the verify forward and
the commit) under exact, LANTERN (delta 0.2) and LANTERN++ (lambda 5) at each k with the reference residual,
round-robin, the median of --repeats calls. Prints ms per call and the difference to the exact rule. The models'
forwards are not in it: on a GPU, divide the difference by plain AR's ms per token (gpu_rounds.py) to read it in
AR tokens.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from lantern.engine.decoding.chain import accept_chains
from lantern.engine.decoding.sampling import SamplingParams
from lantern.engine.rules.acceptance import AcceptRule


def rules(ks: list[int]) -> dict[str, AcceptRule]:
    out = {"exact": AcceptRule()}
    for k in ks:
        out[f"lantern k{k}"] = AcceptRule("lantern", delta=0.2, k=k, residual="reference")
        out[f"lanternpp k{k}"] = AcceptRule("lanternpp", lam=5.0, k=k, residual="reference")
    return out


def measure(vocab: int, ks: list[int], gamma: int, B: int, repeats: int, device) -> dict[str, float]:
    """Median seconds of one accept_chains call per rule."""
    g = torch.Generator().manual_seed(0)
    table = torch.stack([torch.randperm(vocab, generator=g)[: max(ks) + 1] for _ in range(vocab)]).int().to(device)
    P = torch.softmax(2 * torch.randn(B, gamma + 1, vocab, generator=g), -1).to(device)
    q = torch.softmax(2 * torch.randn(B, gamma, vocab, generator=g), -1).to(device)
    X = torch.multinomial(q.view(-1, vocab).cpu(), 1, generator=g).view(B, gamma).to(device)
    gs = torch.full((B,), gamma, device=device)
    u = torch.rand(B, 2 * gamma + 1, generator=g, dtype=torch.float64).to(device)
    params, chosen = SamplingParams(cfg_scale=2.0), rules(ks)
    times = {name: [] for name in chosen}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(repeats):
        for name, rule in chosen.items():
            sync()
            t0 = time.perf_counter()
            accept_chains(P, q, X, gs, u, params, table, rule)
            sync()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=16384)
    ap.add_argument("--ks", type=int, nargs="+", default=[50, 1000])
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args(argv)
    if max(a.ks) + 1 >= a.vocab:
        ap.error(f"--ks must stay below --vocab - 1 ({a.vocab - 1}): a code has {a.vocab - 1} other codes")
    torch.set_num_threads(a.threads)
    print(f"{'rule':24} {'batch':>5} {'ms / round':>10} {'- exact':>8}")
    with torch.no_grad():
        for B in a.batch:
            t = measure(a.vocab, a.ks, a.gamma, B, a.repeats, torch.device(a.device))
            for name, s in t.items():
                print(f"{name:24} {B:5d} {1e3 * s:10.3f} {1e3 * (s - t['exact']):8.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
