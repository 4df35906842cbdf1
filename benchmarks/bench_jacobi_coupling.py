"""Tau of speculative Jacobi decoding under each coupling of its re-drafts (engine/decoding/coupling.py): SJD
(independent), SCD's maximal coupling (= SJD-PAC's adaptive continuation) and SCD's Gumbel coupling, exact
acceptance, sampling, on the same images; --proactive K:D also runs SJD-PAC's proactive tree (jacobi_tree.py: K
candidates at the first D window positions) under each coupling.

    OMP_NUM_THREADS=1 python benchmarks/bench_jacobi_coupling.py --target models/toy/default/target.pt \
        [--images 32] [--windows 16] [--batch 8] [--cfg 2.0] [--proactive 4:2] [--out tau.csv]

Image i: class i mod num_classes, generator image_generator(seed, i); a batch decodes every image as alone would
(tests/test_coupling.py), so --batch changes the wall time only. Per (window, coupling): tau = tokens per target
forward (prefill and correction tokens counted) as mean over images with its standard error, the accepted window
tokens per iteration, tau over SJD's tau at the same window (the ratio of means), the wall time per image (the
decode calls, one process, so machine load moves it) and SJD's over it (speedup_over_sjd).

--forgetting D: also how fast the target forgets a changed token, the quantity both papers' gains rest on (a
re-drafted tail keeps its tokens only where a rejection barely moved the distributions after it): for every image
(SJD's samples) and every 16th position t, token t is redrawn from the target's conditional without its old value
(as a rejection's correction is), and the mean total variation between the two contexts' next-token distributions
at positions t + 1 .. t + D is printed.
"""

import argparse
import math
import time

import pandas as pd
import torch

from lantern.engine.decoding.coupling import COUPLINGS
from lantern.engine.decoding.jacobi import Jacobi
from lantern.engine.decoding.jacobi_tree import ProactiveJacobi
from lantern.engine.decoding.sampling import SamplingParams, draw, image_generator, logits_to_probs, mix_cfg
from lantern.engine.decoding.speculative import decode
from lantern.worlds.llamagen.upstream import load_gpt
from lantern.engine.rules.acceptance import AcceptRule
from lantern.io import atomic_path


def probs_of(target, params: SamplingParams, cond, seqs):
    """The target's processed next-token distributions [M, N, V] along sequences seqs [M, N] (teacher forced)."""
    uncond = torch.full_like(cond, target.args.num_classes)
    logits, _ = target(torch.cat([cond, uncond]), torch.cat([seqs, seqs])[:, :-1])
    return torch.stack([logits_to_probs(mix_cfg(logits[:, j], params, j), params) for j in range(seqs.shape[1])], 1)


def forgetting(target, params: SamplingParams, samples, D: int, seed: int) -> list[float]:
    """Mean TV between next-token distributions at offsets 1..D after a token is redrawn (its old value excluded)."""
    g, tvs = torch.Generator().manual_seed(seed), torch.zeros(D, dtype=torch.float64)
    count = 0
    for cond, seqs in samples:
        P = probs_of(target, params, cond, seqs)
        for t in range(8, seqs.shape[1] - D, 16):
            p = P[:, t].scatter(1, seqs[:, t : t + 1], 0.0)  # the correction's law: never the old token
            changed = seqs.clone()
            changed[:, t] = draw(p, torch.rand(len(p), generator=g, dtype=torch.float64))
            Q = probs_of(target, params, cond, changed)
            tvs += 0.5 * (P[:, t + 1 : t + 1 + D] - Q[:, t + 1 : t + 1 + D]).abs().sum(-1).double().sum(0)
            count += len(p)
    return (tvs / count).tolist()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--images", type=int, default=32)
    ap.add_argument("--windows", type=int, nargs="+", default=[16])
    ap.add_argument("--couplings", nargs="+", default=list(COUPLINGS), choices=COUPLINGS)
    ap.add_argument("--proactive", nargs="*", default=[], metavar="K:D",
                    help="also SJD-PAC's proactive tree with K candidates at the first D window positions")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cfg", type=float, default=2.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--forgetting", type=int, default=0, metavar="D",
                    help="also the mean TV at offsets 1..D after a changed token")
    ap.add_argument("--out", help="also write the table as CSV")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    target = load_gpt(a.target, device=a.device)
    params = SamplingParams(cfg_scale=a.cfg, top_k=a.top_k)
    rows = []
    with torch.no_grad():
        for window in a.windows:
            for coupling, tree in [(c, t) for t in [None] + a.proactive for c in a.couplings]:
                K, D = map(int, tree.split(":")) if tree else (1, 0)
                drafting = ProactiveJacobi(window, coupling, K, D) if tree else Jacobi(window, coupling)
                taus, accepted, samples, seconds = [], [], [], 0.0
                for first in range(0, a.images, a.batch):
                    idx = range(first, min(first + a.batch, a.images))
                    cond = torch.tensor([i % target.args.num_classes for i in idx], device=a.device)
                    gens = [image_generator(a.seed, i) for i in idx]
                    start = time.perf_counter()
                    tokens, stats = decode(target, None, cond, params, AcceptRule(), drafting, gens)
                    seconds += time.perf_counter() - start
                    samples.append((cond, tokens))
                    taus += [s.n_tokens / s.target_forwards for s in stats]
                    accepted += [s.accepted_total / len(s.accepted_per_step) for s in stats]
                t = torch.tensor(taus, dtype=torch.float64)
                rows.append({"window": window, "coupling": coupling, "proactive": tree or "", "images": len(taus),
                             "tau": t.mean().item(), "tau_se": (t.std() / math.sqrt(len(taus))).item(),
                             "accepted_per_iteration": sum(accepted) / len(accepted),
                             "s_per_image": seconds / len(taus)})
                print(rows[-1], flush=True)
                if a.forgetting and coupling == "independent" and not tree and window == a.windows[0]:  # exact samples
                    tvs = forgetting(target, params, samples, a.forgetting, a.seed)
                    print("forgetting: mean TV after a changed token at offsets 1..D:",
                          " ".join(f"{tv:.3f}" for tv in tvs), flush=True)
    df = pd.DataFrame(rows)
    sjd = df[(df.coupling == "independent") & (df.proactive == "")].set_index("window")
    df["tau_over_sjd"] = [r.tau / sjd.tau[r.window] if r.window in sjd.index else float("nan") for r in df.itertuples()]
    df["speedup_over_sjd"] = [sjd.s_per_image[r.window] / r.s_per_image if r.window in sjd.index else float("nan")
                              for r in df.itertuples()]
    print(df.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    if a.out:
        with atomic_path(a.out) as tmp:
            df.to_csv(tmp, index=False)


if __name__ == "__main__":
    main()
