"""Eager against torch.compile'd steps (compile=True: vanilla's decode step, the speculative decoders' static-shape
verify step), per image, one process.

    python benchmarks/bench_compile.py [--target models/toy/default/target.pt] [--size GPT-B] [--tokens 256]
        [--batch 1 8] [--gpt-batch 1 8] [--cfg 2.0] [--mode sampling] [--repeats 3] [--models toy gpt] [--device auto]
        [--methods vanilla exact lantern exact-tree lanternpp-tree] [--tree twin_chain_8] [--toy-threads 1]
        [--threads N]

Models: the toy target with its drafter and VQ (checkpoints when present, else random weights of its shape) and a
random-weight GPT-B-shaped model with --tokens image tokens (a square; fewer than 256 keeps CPU runs short) and a
random drafter of its width (random weights make both models' distributions nearly flat, so tau here says nothing
about trained models: these rows time what a round costs). Methods: vanilla (generate.generate); the batched chain
decoders (gamma 4), exact and LANTERN (delta 0.2, k 50); the batched static tree --tree, exact and LANTERN++ (lam 5,
k 50); every speculative method runs through its batched decoder at every batch size, eager and compiled alike. Per (model, batch, method): one untimed
eager warm-up; the first compiled call, timed on its own since it compiles (compile_s = that call minus the best
steady compiled call); then --repeats rounds of one eager and one compiled run, alternating so that machine load
hits both alike, the best round of each kept. ms_per_image = batch wall time / B; speedup = eager / compiled per
image; vs_vanilla = the model's vanilla per image (same batch, same path) / the method's; tau = tokens per target
forward (prefill counted); same_tokens: the two paths drew the same tokens (same generators).
"""

import argparse
import time
from pathlib import Path

import pandas as pd
import torch

from lantern.engine.rules.acceptance import AcceptRule
from lantern.engine.decoding.chain import Chain
from lantern.engine.decoding.speculative import decode
from lantern.engine.models.checkpoint import parse_device, parse_dtype
from lantern.worlds.llamagen.upstream import load_gpt
from lantern.engine.models.drafter import Drafter, load_drafter
from lantern.engine.decoding.generate import generate
from lantern.engine.models.model import GPT, ModelArgs, named_args, num_params
from lantern.engine.rules.neighbours import nearest_neighbours, read_codebook
from lantern.engine.decoding.sampling import SamplingParams, image_generator
from lantern.engine.decoding.trees import static_tree

TOY = Path("models/toy/default/target.pt")
METHODS = ["vanilla", "exact", "lantern", "exact-tree", "lanternpp-tree"]
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


def decoders(model: GPT, drafter: Drafter, table: torch.Tensor, params: SamplingParams, a) -> dict:
    """method -> (cond, generators, compile) -> (tokens [B, N], stats per image)."""
    chain, tree = Chain(4), static_tree(a.tree)
    rules = {"exact": AcceptRule(), "lantern": AcceptRule("lantern", delta=0.2, k=50),
             "lanternpp": AcceptRule("lanternpp", lam=5.0, k=50)}

    def spec(rule, drafting):
        return lambda cond, g, c: decode(model, drafter, cond, params, rules[rule], drafting, g, table, compile=c)

    runs = {"vanilla": lambda cond, g, c: generate(model, cond, params, g, compile=c),
            "exact": spec("exact", chain), "lantern": spec("lantern", chain),
            "exact-tree": spec("exact", tree), "lanternpp-tree": spec("lanternpp", tree)}
    return {m: runs[m] for m in runs if m in a.methods}


def bench(name: str, model: GPT, drafter: Drafter, table: torch.Tensor, a, device, threads: int,
          batches: list[int]) -> list[dict]:
    torch.set_num_threads(threads)
    params = SamplingParams(cfg_scale=a.cfg, greedy=a.mode == "greedy", top_k=a.top_k)
    N = model.args.image_tokens
    print(f"{name}: {num_params(model) / 1e6:.1f}M params, {N} tokens/image, cfg {a.cfg}, {a.mode}, {device} "
          f"{a.dtype}, {torch.get_num_threads()} thread(s)", flush=True)
    rows = []
    for B in batches:
        cond = torch.arange(B, device=device) % model.args.num_classes
        gens = lambda: [image_generator(a.seed, i) for i in range(B)]  # noqa: E731
        for method, decode in decoders(model, drafter, table, params, a).items():
            run = lambda c: decode(cond, gens(), c)  # noqa: E731
            run(False)  # eager warm-up
            first_s, _ = timed(device, lambda: run(True))
            eager_s, compiled_s, same = [], [], True
            for _ in range(a.repeats):
                t, (want, stats) = timed(device, lambda: run(False))
                eager_s.append(t)
                t, (got, _) = timed(device, lambda: run(True))
                compiled_s.append(t)
                same &= torch.equal(want, got)
            tau = sum(x.n_tokens for x in stats) / sum(x.target_forwards for x in stats)
            e, c = min(eager_s), min(compiled_s)
            rows.append({"model": name, "batch": B, "method": method, "tau": tau, "eager_ms_per_image": 1e3 * e / B,
                         "compiled_ms_per_image": 1e3 * c / B, "speedup": e / c, "compile_s": first_s - c,
                         "same_tokens": same})
            print(f"  batch {B} {method}: eager {e:.2f} s, compiled {c:.2f} s per batch, first compiled call "
                  f"{first_s:.1f} s", flush=True)
    return rows


def toy_models(a, device, dtype) -> tuple[GPT, Drafter, torch.Tensor, str]:
    drafter_path, vq_path = Path(a.target).with_name("drafter.pt"), Path(a.target).with_name("vq.pt")
    if all(p.is_file() for p in (Path(a.target), drafter_path, vq_path)):
        toy = load_gpt(a.target, dtype=a.dtype, device=str(device)).eval()
        table = nearest_neighbours(read_codebook(str(vq_path)), 50).long().to(device)
        return toy, load_drafter(str(drafter_path), toy).eval(), table, "toy"
    torch.manual_seed(0)
    toy = GPT(TOY_ARGS).to(device=device, dtype=dtype).eval()
    return toy, *random_drafter_and_table(toy), "toy(random)"


def random_drafter_and_table(model: GPT) -> tuple[Drafter, torch.Tensor]:
    """A random drafter of the model's width and a neighbour table of a random 8-d codebook (k 50)."""
    p = model.output.weight
    drafter = Drafter.from_target(model).to(device=p.device, dtype=p.dtype).eval()
    return drafter, nearest_neighbours(torch.randn(model.args.vocab_size, 8), 50).long().to(p.device)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=str(TOY), help="the toy target checkpoint")
    ap.add_argument("--size", default="GPT-B")
    ap.add_argument("--tokens", type=int, default=256, help="image tokens of the GPT-B-shaped model (a square)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--gpt-batch", type=int, nargs="+", help="batch sizes of the GPT-B-shaped model (default --batch)")
    ap.add_argument("--cfg", type=float, default=2.0)
    ap.add_argument("--mode", default="sampling", choices=["sampling", "greedy"])
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--models", nargs="+", default=["toy", "gpt"], choices=["toy", "gpt"])
    ap.add_argument("--methods", nargs="+", default=METHODS, help=f"any of {METHODS}")
    ap.add_argument("--tree", default="twin_chain_8", help="static tree of the *-tree methods (trees.static_tree)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--toy-threads", type=int, default=1, help="torch threads for the toy target")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads for GPT-B")
    a = ap.parse_args()
    device, dtype = parse_device(a.device), parse_dtype(a.dtype)
    unknown = sorted(set(a.methods) - set(METHODS))
    if unknown:
        ap.error(f"unknown method(s) {unknown}; choose from {METHODS}")
    rows = []
    with torch.no_grad():
        if "toy" in a.models:
            toy, drafter, table, name = toy_models(a, device, dtype)
            rows += bench(name, toy, drafter, table, a, device, a.toy_threads, a.batch)
            del toy, drafter
        if "gpt" in a.models:
            torch.manual_seed(0)
            gpt = GPT(named_args(a.size, image_tokens=a.tokens)).to(device=device, dtype=dtype).eval()
            rows += bench(a.size, gpt, *random_drafter_and_table(gpt), a, device, a.threads, a.gpt_batch or a.batch)
    df = pd.DataFrame(rows)
    vanilla = df[df["method"] == "vanilla"].set_index(["model", "batch"])
    for path in ("eager", "compiled"):
        df[f"{path}_vs_vanilla"] = [vanilla[f"{path}_ms_per_image"].get((m, b), float("nan")) / x for m, b, x in
                                    zip(df["model"], df["batch"], df[f"{path}_ms_per_image"])]
    print(f"torch {torch.__version__}; ms_per_image = best batch wall time / B over {a.repeats} alternating rounds; "
          "speedup = eager / compiled; compile_s = first compiled call - a steady one (not in the timed runs); "
          "*_vs_vanilla = vanilla / method per image on the same path and batch")
    print(df.to_string(index=False, float_format=lambda x: f"{x:.2f}"))


if __name__ == "__main__":
    main()
