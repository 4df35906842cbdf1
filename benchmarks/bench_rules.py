"""Acceptance rules side by side on trained checkpoints: mean accepted length, and the per-step TV of sampled drafts.

    python benchmarks/bench_rules.py --target T.pt --drafter D.pt --neighbours NB.pt --vq VQ.pt
        [--images 30] [--gamma 4] [--tv-positions 40] [--families exact lantern ...] [--out rules.csv]

1. tau: every method decodes the same images (class i mod num_classes, generator from (seed, i)), sampling, chain
   drafting; tau = mean over verification rounds of (accepted drafts + 1), the bonus/correction token counted;
   also tokens per target forward (prefill included) and seconds per image.
2. per-step TV with sampled drafts: while `exact` decodes, every round's first verified position records its
   (p, q); for each recorded pair and each relaxed rule the emitted distribution of that step is computed exactly
   by enumerating the draft x over q's support (E = sum_x q(x) [a_x 1{y = x} + (1 - a_x) r_x]), and TV(E, p) is
   reported (mean and max over positions) beside the rule's delta.
"""

import argparse
import time

import pandas as pd
import torch

from lantern.engine.decoding import chain as chain_module
from lantern.engine import methods as registry
from lantern.engine.rules.acceptance import accept_probability, residual
from lantern.worlds.llamagen.upstream import load_gpt
from lantern.engine.models.drafter import load_drafter
from lantern.engine.rules.neighbours import load_neighbours, read_codebook
from lantern.engine.decoding.sampling import SamplingParams, image_generator
from lantern.engine.decoding.speculative import decode

DELTAS = (0.1, 0.2, 0.4)
COOL = ({"scale": 2.0, "nu": 0.0, "mu": 0.0}, {"scale": 4.0, "nu": 0.5, "mu": 0.0})
BETAS = (1.0, 3.0)  # the entropy-aware rule's weight exp(beta H(p) / log V)


def specs(gamma: int, k: int, families=None) -> list[dict]:
    out = [{"name": "exact"}]
    for d in DELTAS:
        out += [{"name": "lantern", "delta": d, "k": k}, {"name": "lanterntv", "delta": d, "k": k}]
    out += [{"name": "coolsd", **c} for c in COOL]
    out += [{"name": "gsd", "group": 14, "k": k, "gap": 0.15}]
    out += [{"name": "entropy", "beta": b} for b in BETAS]
    out = [s for s in out if families is None or s["name"] in families or s["name"] == "exact"]  # exact records
    return [registry.normalize({**s, "drafting": "chain", "gamma": gamma}) for s in out]


def emitted(p, q, table, rule):
    E = torch.zeros_like(p)
    for x in torch.nonzero(q > 0).flatten().tolist():
        a, _, m = accept_probability(p, q, torch.tensor(x), table, rule)
        E[x] += q[x] * a
        if a < 1:
            E += q[x] * (1 - a) * residual(p, q, x, int(m), table, rule)
    return E


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for key in ("target", "drafter", "neighbours", "vq"):
        ap.add_argument(f"--{key}", required=True)
    ap.add_argument("--images", type=int, default=30)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--cfg", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tv-positions", type=int, default=40)
    ap.add_argument("--families", nargs="+", help="only these rule families (exact always runs first)")
    ap.add_argument("--out")
    a = ap.parse_args()
    torch.set_num_threads(1)
    target = load_gpt(a.target)
    drafter = load_drafter(a.drafter, target)
    table = load_neighbours(a.neighbours, read_codebook(a.vq), a.k)
    params = SamplingParams(cfg_scale=a.cfg)
    classes = target.args.num_classes

    pairs = []
    record = chain_module.accept_probability

    def recording(P, Q, X, tbl, rule, *rest):
        if len(pairs) < a.tv_positions:
            first = lambda t: t.reshape(-1, t.shape[-1])[0].double().clone()  # noqa: E731 - image 0, draft 1
            pairs.append((first(P), first(Q)))
        return record(P, Q, X, tbl, rule, *rest)

    rows = []
    for spec in specs(a.gamma, a.k, a.families):
        rule, drafting = registry.rule(spec), registry.drafting(spec)
        chain_module.accept_probability = recording if spec["name"] == "exact" else record
        steps, tokens, forwards, t0 = [], 0, 0, time.perf_counter()
        for i in range(a.images):
            g = image_generator(a.seed, i)
            _, (st,) = decode(target, drafter, torch.tensor([i % classes]), params, rule, drafting, [g],
                              table if rule.relaxed else None)
            steps += st.accepted_per_step
            tokens, forwards = tokens + st.n_tokens, forwards + st.target_forwards
        chain_module.accept_probability = record
        rows.append({"point": registry.point_name(spec), "tau": sum(steps) / len(steps) + 1,
                     "tokens_per_forward": tokens / forwards, "s_per_image": (time.perf_counter() - t0) / a.images})
        print(rows[-1], flush=True)

    tv_rows = []
    for spec in specs(a.gamma, a.k, a.families)[1:]:
        rule = registry.rule(spec)
        tvs = [0.5 * (emitted(p, q, table, rule) - p).abs().sum().item() for p, q in pairs]
        tv_rows.append({"point": registry.point_name(spec), "delta": spec.get("delta"),
                        "tv_mean": sum(tvs) / len(tvs), "tv_max": max(tvs), "positions": len(tvs)})
        print(tv_rows[-1], flush=True)
    out = pd.DataFrame(rows).merge(pd.DataFrame(tv_rows), on="point", how="left")
    print(out.to_string(index=False))
    if a.out:
        out.to_csv(a.out, index=False)


if __name__ == "__main__":
    main()
