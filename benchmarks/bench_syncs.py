"""Host<->device sync points per round of every decoder, counted on a CPU run (lantern.syncs.SyncCounter).

    python benchmarks/bench_syncs.py [--batch 8] [--cfg 2.0] [--verbose] [--kinds chain static dynamic jacobi ar]

Each drafting kind (chain gamma 4, static tree naive_extend_57, dynamic tree of 59 tokens, Jacobi window 16) decodes
one batch of --batch images (class i mod num_classes, generator from (seed 0, i)) under CFG, with the exact rule and
LANTERN (delta 0.2, k 50), sampling and greedy; plain AR decodes the same batch. Printed: sync points per round (a
round: one verify forward of the batch; plain AR: one token of the batch), total, and with --verbose the top call
sites. The count does not depend on the machine: it is a property of the code. The toy world's checkpoints
(models/toy/default) are used when present, else random weights of the same shape (then the rounds differ, the
per-round counts barely).
"""

import argparse
from pathlib import Path

import torch

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
from lantern.syncs import SyncCounter

TOY = Path("models/toy/default")
TOY_ARGS = ModelArgs(dim=128, n_layer=6, n_head=4, vocab_size=512, num_classes=16, image_tokens=64, multiple_of=64)
KINDS = {"chain": lambda: Chain(4), "static": lambda: static_tree("naive_extend_57"), "dynamic": lambda: DynamicTree(),
         "jacobi": lambda: Jacobi(16)}


def models(k: int):
    if all((TOY / f).is_file() for f in ("target.pt", "drafter.pt", "vq.pt")):
        target = load_gpt(str(TOY / "target.pt"))
        table = nearest_neighbours(read_codebook(str(TOY / "vq.pt")), k).long()
        return target, load_drafter(str(TOY / "drafter.pt"), target), table, f"checkpoints under {TOY}"
    torch.manual_seed(0)
    target = GPT(TOY_ARGS).eval()
    table = nearest_neighbours(torch.randn(TOY_ARGS.vocab_size, 8), k).long()
    return target, Drafter.from_target(target).eval(), table, "RANDOM weights of the toy shape"


def count(run, rounds_of) -> tuple[SyncCounter, int]:
    with SyncCounter() as c:
        out = run()
    return c, rounds_of(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--cfg", type=float, default=2.0)
    ap.add_argument("--delta", type=float, default=0.2)
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--kinds", nargs="+", default=[*KINDS, "ar"], choices=[*KINDS, "ar"])
    ap.add_argument("--verbose", action="store_true", help="the top call sites of each row")
    a = ap.parse_args()
    torch.set_num_threads(1)
    target, drafter, table, source = models(a.k)
    N, B = target.args.image_tokens, a.batch
    cond = torch.arange(B) % target.args.num_classes
    gens = lambda: [image_generator(0, i) for i in range(B)]  # noqa: E731
    print(f"# sync points per round, B = {B}, CFG {a.cfg:g}, {N} tokens per image, {source}")
    print(f"{'kind':8} {'rule':22} {'mode':8} {'rounds':>6} {'syncs':>7} {'per round':>9}")
    rules = {"exact": AcceptRule(), f"lantern(d={a.delta:g},k={a.k})": AcceptRule("lantern", delta=a.delta, k=a.k)}
    for kind in a.kinds:
        for mode in ("sampling", "greedy"):
            params = SamplingParams(cfg_scale=a.cfg, greedy=mode == "greedy")
            if kind == "ar":
                rows = [("-", lambda: generate(target, cond, params, gens()), lambda out: N)]
            else:
                drafting, d = KINDS[kind](), None if kind == "jacobi" else drafter
                rows = [(name, lambda r=r: decode(target, d, cond, params, r, drafting, gens(), table),
                         lambda out: max(len(s.accepted_per_step) for s in out[1])) for name, r in rules.items()]
            for name, run, rounds_of in rows:
                c, rounds = count(run, rounds_of)
                unit = "token" if kind == "ar" else "round"
                print(f"{kind:8} {name:22} {mode:8} {rounds:>6} {c.total:>7} {c.total / rounds:>9.1f}  per {unit}",
                      flush=True)
                if a.verbose:
                    for (site, what), n in c.sites.most_common(12):
                        print(f"{'':12}{n / rounds:8.1f}  {site}  {what}")


if __name__ == "__main__":
    main()
