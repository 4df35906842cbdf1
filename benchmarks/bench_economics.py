"""Drafter step / target step and verify / target step, at batch 1 and 8 under CFG, all in one process.

    python benchmarks/bench_economics.py [--world models/toy/default] [--sizes GPT-B GPT-XL] [--shape 16x96 ...]
        [--rounds 16 [--gammas 2 3 4] [--trees] [--exact-trees '[[0], [1], [0, 0], [0, 0, 0]]' ...]
         [--lanternpp-trees twin_chain_8 '[[0], [0, 0], [0, 0, 0]]' ...]]

Rows: the shipped toy target and drafter; then LlamaGen shapes (random weights, 16 x 16 tokens, 16384 codes) and any
candidate toy shapes (--shape LAYERSxWIDTH, random weights, the toy world's tokens and codebook). Issue #31 asks
the toy world for drafter / step <= 0.08 and a 5-position verify <= 1.3 x a step, as LlamaGen-XL's on a GPU.
--rounds N then decodes the world's first N images alone (batch 1, CFG, sampling) with the exact chain, LANTERN
(delta 0.1, k 3, the default point), with --trees also LANTERN++ (lam 5, k 100) on the static and the dynamic
tree (each also with the full walk of its acceptance, as on a GPU, without tree_rounds.settled's early exits),
with --exact-trees exact decoding and with --lanternpp-trees LANTERN++ (lam 5, k 100) on more static trees (a
shape's name or its rank paths, as a sweep's `tree:`), and plain
AR, image by image in turn, and prints what a round costs in one-token steps, split into drafting,
verifying and the rest (lantern.metrics.economics.round_costs), against the tokens it yields (tau).
"""

import argparse
import json
from pathlib import Path

import torch

from lantern.engine.models.checkpoint import parse_device, parse_dtype

from lantern.worlds.llamagen.upstream import load_gpt
from lantern.engine.models.drafter import Drafter, load_drafter
from lantern.engine.models.model import GPT, ModelArgs, named_args, num_params
from lantern.engine.rules.acceptance import AcceptRule
from lantern.engine.decoding.chain import Chain
from lantern.engine.decoding.generate import generate
from lantern.engine.rules.neighbours import nearest_neighbours, read_codebook
from lantern.engine.decoding.sampling import SamplingParams, image_generator
from lantern.engine.decoding.speculative import decode
from lantern.engine.decoding.stats import GpuPath
from lantern.engine.decoding.trees import DynamicTree, static_tree
from lantern.errors import UserError
from lantern.metrics.economics import ratios, round_costs, step_costs


def report(name: str, target: GPT, drafter, batches, positions, repeats) -> None:
    a = target.args
    for B in batches:
        c = step_costs(target, drafter, B, positions=positions, repeats=repeats)
        r = ratios(c)
        print(f"{name:<22} {a.n_layer:>3}x{a.dim:<5} {num_params(target) / 1e6:8.1f}M  batch {B}  "
              f"step {c.target_step_s * 1e3:8.2f} ms  drafter/step {r['drafter_over_step']:.3f}  "
              f"verify{positions}/step {r['verify_over_step']:.2f}", flush=True)


def report_rounds(world: Path, target: GPT, drafter, n: int, gammas: list[int], trees: bool = False,
                  exact_trees: tuple = (), lanternpp_trees: tuple = ()) -> None:
    """Rounds of the chain decoders in use, at batch 1: their cost in steps against tau (module docstring); the
    exact chain at every draft length in `gammas`, since the best one depends on the drafter's acceptance; with
    `trees`, the default run's tree pair too (LANTERN++ lam 5 k 100 on the static and the dynamic tree); exact
    decoding on each StaticTree of `exact_trees`, LANTERN++ on each of `lanternpp_trees`."""
    table = nearest_neighbours(read_codebook(world / "vq.pt"), 100).long().to(target.output.weight.device)
    params, classes = SamplingParams(cfg_scale=2.0), target.args.num_classes
    exact = lambda drafting: lambda c, g: decode(target, drafter, c, params, AcceptRule(), drafting, g, table)[1]  # noqa: E731
    def tree(shape, full_walk: bool):
        """LANTERN++ on a tree; full_walk: its sampled acceptance without the CPU's early exits, as on a GPU."""
        def run(c, g):
            GpuPath.counting += full_walk
            try:
                return decode(target, drafter, c, params, AcceptRule("lanternpp", lam=5, k=100), shape, g, table)[1]
            finally:
                GpuPath.counting -= full_walk
        return run

    decoders = {
        **{f"exact chain g{gamma}": exact(Chain(gamma)) for gamma in gammas},
        **{f"exact tree {tree_label(shape)}": exact(shape) for shape in exact_trees},
        "LANTERN d0.1 k3": lambda c, g: decode(target, drafter, c, params, AcceptRule("lantern", delta=0.1, k=3),
                                               Chain(4), g, table)[1],
        **({f"LANTERN++ {kind}{' full walk' if full else ''}": tree(shape, full)
            for kind, shape in (("static", static_tree("naive_extend_57")), ("dynamic", DynamicTree()))
            for full in (False, True)} if trees else {}),
        **{f"LANTERN++ tree {tree_label(shape)}": tree(shape, False) for shape in lanternpp_trees},
        "plain AR": lambda c, g: generate(target, c, params, g)[1],
    }
    device = target.output.weight.device
    rows: dict[str, list[dict]] = {name: [] for name in decoders}
    for i in range(-1, n):  # image -1: an untimed warm-up
        for name, run in decoders.items():
            stats = run(torch.tensor([max(i, 0) % classes], device=device), [image_generator(0, max(i, 0))])
            if i >= 0:
                rows[name] += [s.row() for s in stats]
    print(f"batch 1, CFG 2, sampling, {n} images each; a round in one-token steps of plain AR (same images, same process)")
    for name in list(decoders)[:-1]:
        r = round_costs(rows[name], rows["plain AR"])
        print(f"{name:<30} round {r['round_steps']:.2f} steps = draft {r['draft_steps']:.2f} + verify "
              f"{r['verify_steps']:.2f} + other {r['other_steps']:.2f}; tau {r['tau']:.2f}; speed-up {r['speedup']:.2f}x",
              flush=True)


def tree_label(shape) -> str:
    """A static tree's name, or its rank paths in short: [[0], [1], [0, 0]] -> 0|1|00."""
    return shape.name if shape.name != "custom" else "|".join("".join(map(str, p)) for p in shape.paths)


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
    ap.add_argument("--rounds", type=int, default=0, metavar="N",
                    help="also decode the world's first N images at batch 1 and split a round's cost (0: skip)")
    ap.add_argument("--gammas", type=int, nargs="+", default=[4], help="draft lengths of the exact chain in --rounds")
    ap.add_argument("--exact-trees", nargs="*", default=[], metavar="TREE",
                    help="--rounds also splits exact decoding on these static trees: a name (naive_extend_57, "
                         "twin_chain_8) or rank paths as JSON, '[[0], [1], [0, 0]]'")
    ap.add_argument("--lanternpp-trees", nargs="*", default=[], metavar="TREE",
                    help="--rounds also splits LANTERN++ (lam 5, k 100) on these static trees, as --exact-trees")
    ap.add_argument("--trees", action="store_true", help="--rounds also splits the LANTERN++ static and dynamic trees, with and without the CPU walk's early exits")
    a = ap.parse_args()
    if a.rounds < 0 or (a.rounds and not a.world):
        ap.error("--rounds takes N >= 0 images and needs --world (its target, drafter and vq.pt)")
    if min(a.gammas) < 1:
        ap.error(f"--gammas are draft lengths >= 1, got {a.gammas}")
    trees = {}
    for flag in ("exact_trees", "lanternpp_trees"):  # before any model is loaded
        try:
            trees[flag] = [static_tree(json.loads(t) if t.lstrip().startswith("[") else t) for t in getattr(a, flag)]
        except (ValueError, UserError) as e:
            ap.error(f"--{flag.replace('_', '-')}: {e}")
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
        if a.rounds:
            with torch.inference_mode():
                report_rounds(world, target, drafter, a.rounds, a.gammas, a.trees, **trees)
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
