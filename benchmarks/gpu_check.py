"""GPU acceptance check, for the day a CUDA device is at hand: one device, under 10 minutes, one CSV.

    python benchmarks/gpu_check.py [--out gpu_check.csv] [--specs NAME ...] [--sizes GPT-B GPT-L GPT-XL]
        [--batch 1 8] [--tokens 256] [--budget-s 420] [--feature-layers L ...]

1. compiled == eager: every decoder (plain AR and every drafting kind with the registry's rules) decodes a batch of
   a random toy-shaped target with compile on (CUDA graphs, engine/decoding/compiled.py) and off, sampling and
   greedy, from the same generators; the tokens must be equal (exit status 1 if not). --specs narrows steps 1 and 2
   to some decoders (a short lease); --sizes with no name skips step 3.
2. host syncs: torch.cuda.set_sync_debug_mode("warn") over one batch (B = 8, CFG, sampling) of every decoder
   (eager, so compilation does not count); the count of synchronizing CUDA calls and that count per round (target
   forwards after the prefill). CUDA reports the calls that block (.item(), .tolist(), nonzero, device->host
   copies); host->device copies of pageable memory do not show.
3. latency, GPT-B/L/XL shapes with random bf16 weights, --tokens image tokens, batch 1 and 8, CFG 4: plain AR per
   token through this project's compiled decode step; the upstream-style plain AR loop (LlamaGen's: same forward and
   sampling math, tokens drawn on the device by torch.multinomial, no compile, no per-image generators); and a
   speculative round's cost (the batched chain decoder, exact rule, gamma 4, a random drafter of the target's width,
   compiled verify) per round. Random weights give near-flat distributions, so acceptance says nothing here: these
   rows time what a token and a round cost. Rows not begun when --budget-s is spent are written as skipped.

--feature-layers gives every drafter of steps 1 to 3 those target layers beside h_t (EAGLE-3's fusion,
DrafterOptions.feature_layers), its fuse map random rather than h_t alone, so the fused path is what runs; layers
beyond a shape's depth are dropped for that shape.

On a machine without CUDA it stops with one line. --smoke runs every step at toy sizes on the CPU (no compile, no
sync counting: both are CUDA's) so that tests/test_gpu_check.py keeps the script working; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
import time
import warnings
from pathlib import Path

SIZES = ("GPT-B", "GPT-L", "GPT-XL")
# --smoke's model (this script's and profile_round.py's): toy sizes, the plumbing on a CPU
SMOKE_ARGS = dict(dim=64, n_layer=2, n_head=2, vocab_size=512, num_classes=16, image_tokens=16, multiple_of=64)
# the spec of every decoder: plain AR, then each drafting kind with the rules that change its code path
SPECS = {
    "vanilla": {"name": "vanilla"},
    "chain-exact": {"name": "exact", "drafting": "chain", "gamma": 4},
    "chain-lantern": {"name": "lantern", "drafting": "chain", "gamma": 4, "delta": 0.2, "k": 50},
    "chain-lanterntv": {"name": "lanterntv", "drafting": "chain", "gamma": 4, "delta": 0.2, "k": 50},
    "chain-coolsd": {"name": "coolsd", "drafting": "chain", "gamma": 4, "scale": 2.0, "nu": 0.1},
    "static-lanternpp": {"name": "lanternpp", "drafting": "static", "tree": "naive_extend_57", "lam": 5.0, "k": 50},
    "dynamic-exact": {"name": "exact", "drafting": "dynamic"},
    "jacobi-sjd": {"name": "exact", "drafting": "jacobi", "window": 16},
    "jacobi-gsd": {"name": "gsd", "drafting": "jacobi", "window": 16, "k": 10},
}


def refuse_without_cuda(smoke: bool) -> None:
    import torch

    if not smoke and not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA device here (torch.cuda.is_available() is False); run it on a machine with a GPU")


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device, fn):
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t0, out


class World:
    """A random target and the files build_decoder reads (drafter, VQ, neighbour table), in a temporary folder."""

    def __init__(self, args, device, dtype, folder: Path, feature_layers=(), table_k: int = 50):
        import dataclasses

        import torch

        from lantern.engine.models.checkpoint import save_checkpoint
        from lantern.engine.models.drafter import Drafter, DrafterOptions, save_drafter
        from lantern.engine.models.model import GPT
        from lantern.engine.rules.neighbours import NeighbourParams, build_table, read_codebook
        from lantern.engine.models.vq import VQArgs, VQModel
        from lantern.io import save_torch

        torch.manual_seed(0)
        self.target = GPT(args).to(device=device, dtype=dtype).eval()
        self.device, self.folder = device, folder
        layers = tuple(i for i in feature_layers if i < args.n_layer - 1)
        drafter = Drafter.from_target(self.target, DrafterOptions(feature_layers=layers))
        if drafter.fuse is not None:
            drafter.fuse.reset_parameters()  # random: the other layers count, unlike the h_t-alone start
        save_drafter(folder / "drafter.pt", drafter)
        self.feature_layers = layers
        vq_args = VQArgs(codebook_size=args.vocab_size, codebook_embed_dim=8, ch=8, ch_mult=(1, 1), z_channels=8,
                         enc_res_blocks=1, dec_res_blocks=1, norm_groups=4)
        save_checkpoint(folder / "vq.pt", VQModel(vq_args), args=dataclasses.asdict(vq_args))
        save_torch(build_table(read_codebook(folder / "vq.pt"), NeighbourParams(k=table_k)),
                   folder / "neighbours.pt")

    def decoder(self, spec: dict, params, compile: bool):
        """(cond, generators) -> (tokens, stats): plain AR or the registry's decoder of `spec`."""
        from lantern.engine import methods
        from lantern.engine.decoding.generate import generate

        if spec["name"] == "vanilla":
            return lambda cond, gens: generate(self.target, cond, params, gens, compile=compile)
        run = methods.build_decoder(spec, params, self.target, str(self.folder / "drafter.pt"),
                                    str(self.folder / "neighbours.pt"), str(self.folder / "vq.pt"), self.device,
                                    compile)
        return lambda cond, gens: run(cond, gens)


def batch(world: World, B: int, seed: int = 0):
    import torch

    from lantern.engine.decoding.sampling import image_generator

    cond = torch.arange(B, device=world.device) % world.target.args.num_classes
    return cond, [image_generator(seed, i) for i in range(B)]


def check_compiled_equals_eager(world: World, rows: list, smoke: bool, specs) -> bool:
    from lantern.engine.decoding.sampling import SamplingParams

    ok = True
    for mode, params in (("sampling", SamplingParams(cfg_scale=2.0)), ("greedy", SamplingParams(cfg_scale=2.0,
                                                                                                greedy=True))):
        for name in specs:
            spec = SPECS[name]
            if smoke:  # inductor on a CPU takes minutes per shape: the smoke run checks the plumbing only
                rows.append(row("compiled_equals_eager", name, mode=mode, note="not run (--smoke: no compile)"))
                continue
            eager, _ = world.decoder(spec, params, False)(*batch(world, 4))
            compiled, _ = world.decoder(spec, params, True)(*batch(world, 4))
            same = bool((eager == compiled).all())
            ok &= same
            rows.append(row("compiled_equals_eager", name, mode=mode, value=same, unit="bool",
                            note=fused_note(world).removeprefix(", ")))
            print(f"compiled == eager, {name} {mode}{fused_note(world)}: {same}", flush=True)
    return ok


def synchronizing_calls(run, world: World, B: int) -> tuple[int, list]:
    """The synchronizing CUDA calls of one decoder run over a batch of B (CUDA's sync debug mode), and its stats."""
    import torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            _, stats = run(*batch(world, B))
            sync(world.device)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught), stats


def count_syncs(world: World, rows: list, smoke: bool, specs) -> None:
    from lantern.engine.decoding.sampling import SamplingParams

    params = SamplingParams(cfg_scale=2.0)
    for name in specs:
        run = world.decoder(SPECS[name], params, False)
        run(*batch(world, 8))  # warm-up: first-call allocations and lazy initialisation are not the loop's
        if smoke:
            rows.append(row("host_syncs_per_round", name, batch=8, note="not run (--smoke: CUDA's sync debug mode)"))
            continue
        syncs, stats = synchronizing_calls(run, world, 8)
        rounds = max(s.target_forwards for s in stats) - 1  # the prefill aside
        rows.append(row("host_syncs", name, batch=8, value=syncs, unit="syncs per batch"))
        rows.append(row("host_syncs_per_round", name, batch=8, value=round(syncs / max(rounds, 1), 1),
                        unit="syncs per round", note=f"{rounds} rounds{fused_note(world)}"))
        print(f"host syncs, {name}{fused_note(world)}: {syncs} over {rounds} rounds", flush=True)


def upstream_ar(model, cond, params) -> None:
    """LlamaGen-style plain AR: the same forward and sampling math as generate.generate, each token drawn on the
    device by torch.multinomial from the global CUDA generator, eager, no per-image generators."""
    import torch

    from lantern.engine.decoding.generate import cfg_rows, decode_one_token, duplicate_for_cfg, prefill
    from lantern.engine.decoding.sampling import logits_to_probs, mix_cfg

    T, N = model.args.cls_token_num, model.args.image_tokens
    rows, rows_mask = cfg_rows(model, cond, params)
    model.setup_cache(rows.shape[0])
    logits, _ = prefill(model, rows, rows_mask)
    for i in range(N):
        token = torch.multinomial(logits_to_probs(mix_cfg(logits, params, i), params), 1)[:, 0]
        if i == N - 1:
            break
        logits, _ = decode_one_token(model, duplicate_for_cfg(token, params), T + i)
    model.clear_cache()


def latency(args_of, sizes, batches, a, rows: list, device, dtype, started: float) -> None:
    import torch

    from lantern.engine.decoding.sampling import SamplingParams

    params = SamplingParams(cfg_scale=4.0)
    chain = SPECS["chain-exact"]
    for size in sizes:
        with tempfile.TemporaryDirectory() as folder:
            world = World(args_of(size), device, dtype, Path(folder), a.feature_layers)
            N = world.target.args.image_tokens
            compile = not a.smoke
            size = f"{size} (tiny: --smoke)" if a.smoke else size
            for B in batches:
                if time.perf_counter() - started > a.budget_s:
                    rows.append(row("latency", size, batch=B, note=f"skipped: --budget-s {a.budget_s:g} spent"))
                    continue
                cond, _ = batch(world, B)
                ours = world.decoder({"name": "vanilla"}, params, compile)
                ours(*batch(world, B))  # warm-up (and compilation)
                t_ours, _ = timed(device, lambda: ours(*batch(world, B)))
                with torch.no_grad():
                    upstream_ar(world.target, cond, params)
                    t_up, _ = timed(device, lambda: upstream_ar(world.target, cond, params))
                spec = world.decoder(chain, params, compile)
                spec(*batch(world, B))
                t_spec, (_, stats) = timed(device, lambda: spec(*batch(world, B)))
                rounds = max(s.target_forwards for s in stats) - 1
                path = "compiled (CUDA graphs)" if compile else "eager (--smoke)"
                rows += [
                    row("plain_ar_ms_per_token", size, batch=B, value=1e3 * t_ours / N, unit="ms", note=path),
                    row("upstream_ar_ms_per_token", size, batch=B, value=1e3 * t_up / N, unit="ms",
                        note="eager, torch.multinomial on the device"),
                    row("chain_round_ms", size, batch=B, value=1e3 * t_spec / max(rounds, 1), unit="ms",
                        note=f"exact, gamma 4, {rounds} rounds, {path}{fused_note(world)}"),
                ]
                print(f"{size} batch {B}: plain AR {1e3 * t_ours / N:.3f} ms/token ({path}), upstream-style "
                      f"{1e3 * t_up / N:.3f} ms/token, chain round {1e3 * t_spec / max(rounds, 1):.3f} ms", flush=True)
            del world
            if device.type == "cuda":
                torch.cuda.empty_cache()


def fused_note(world: World) -> str:
    return f", drafter fuses layers {list(world.feature_layers)}" if world.feature_layers else ""


def row(check: str, name: str, batch: int | None = None, mode: str = "", value=None, unit: str = "",
        note: str = "") -> dict:
    return {"check": check, "name": name, "batch": batch, "mode": mode, "value": value, "unit": unit, "note": note}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="gpu_check.csv")
    ap.add_argument("--specs", nargs="+", default=list(SPECS), choices=list(SPECS),
                    help="decoders of the compiled == eager and host-sync checks (default: all)")
    ap.add_argument("--sizes", nargs="*", default=list(SIZES), choices=list(SIZES),
                    help="latency shapes (none: no latency rows)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--tokens", type=int, default=256, help="image tokens of the latency models (a square)")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="latency rows not begun after this many seconds are skipped (compiling XL takes minutes)")
    ap.add_argument("--feature-layers", type=int, nargs="+", default=[], metavar="L",
                    help="target layers every drafter also reads (EAGLE-3's fusion; default: h_t alone)")
    ap.add_argument("--smoke", action="store_true", help="toy sizes on the CPU: the script's plumbing, no numbers")
    a = ap.parse_args(argv)
    refuse_without_cuda(a.smoke)

    import torch

    from lantern.engine.models.model import ModelArgs, named_args
    from lantern.io import atomic_path

    started = time.perf_counter()
    device = torch.device("cpu" if a.smoke else "cuda")
    torch.backends.cuda.matmul.allow_tf32 = False  # compiled == eager is asked in fp32 arithmetic
    check_args = ModelArgs(dim=128, n_layer=2 if a.smoke else 6, n_head=4, vocab_size=512, num_classes=16,
                           image_tokens=16 if a.smoke else 64, multiple_of=64)
    if a.smoke:
        args_of, dtype = (lambda size: ModelArgs(**SMOKE_ARGS)), torch.float32
    else:
        args_of, dtype = (lambda size: named_args(size, image_tokens=a.tokens)), torch.bfloat16
    rows: list[dict] = []
    with torch.no_grad(), tempfile.TemporaryDirectory() as folder:
        world = World(check_args, device, torch.float32, Path(folder), a.feature_layers)
        ok = check_compiled_equals_eager(world, rows, a.smoke, a.specs)
        count_syncs(world, rows, a.smoke, a.specs)
        del world
    latency(args_of, a.sizes, a.batch, a, rows, device, dtype, started)
    rows.append(row("wall_s", "gpu_check", value=round(time.perf_counter() - started, 1), unit="s",
                    note=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (--smoke)"))
    with atomic_path(a.out) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"gpu_check: {len(rows)} rows -> {a.out}; compiled == eager: {'yes' if ok else 'NO'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
