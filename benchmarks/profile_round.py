"""Where a speculative decoder's round goes, on one device: a LlamaGen shape with random weights, one image batch.

    python benchmarks/profile_round.py [--size GPT-XL] [--spec chain-exact] [--batch 1] [--tokens 256] [--eager]
        [--ops [--top 30]] [--feature-layers L ...] [--out profile.txt]

Prints (and writes to --out) plain AR's time per token and the decoder's time per round, both through the same
compile setting as `lantern sample` on that device (CUDA graphs on CUDA unless --eager); the round split into the
decoder's own timer sections (draft / verify / other: device time between CUDA events on CUDA, so a device left
idle while the host prepares the next launch counts where the gap falls); the host syncs of one batch (CUDA's sync
debug mode); with --ops, torch.profiler's operators by self host time and by self device time over one more batch
(slow on the large shapes: summarising a 256-token GPT-XL image took over two minutes on an H200; add --tokens 64
there). Random weights give
near-flat distributions: acceptance means nothing here, the cost of a round does. --spec names a decoder of
benchmarks/gpu_check.py's SPECS; --feature-layers gives its drafter those target layers beside h_t (EAGLE-3's
fusion, a random fuse map). On a machine without CUDA it runs on the CPU (fp32, eager); --smoke: toy sizes
there, for tests/test_profile_round.py.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import SIZES, SMOKE_ARGS, SPECS, World, batch, synchronizing_calls, timed  # noqa: E402

from lantern.engine.models.model import ModelArgs, named_args  # noqa: E402
from lantern.engine.decoding.sampling import SamplingParams  # noqa: E402
from lantern.io import atomic_path  # noqa: E402


def profile(a) -> list[str]:
    cuda = torch.cuda.is_available() and not a.smoke
    device, dtype = (torch.device("cuda"), torch.bfloat16) if cuda else (torch.device("cpu"), torch.float32)
    compile = cuda and not a.eager
    if a.smoke:
        args = ModelArgs(**SMOKE_ARGS)
    else:
        args = named_args(a.size, image_tokens=a.tokens)
    params = SamplingParams(cfg_scale=2.0)
    lines = []
    say = lambda text: (print(text, flush=True), lines.append(text))  # noqa: E731
    with tempfile.TemporaryDirectory() as folder:
        world = World(args, device, dtype, Path(folder), a.feature_layers)
        N = world.target.args.image_tokens
        say(f"{a.size if not a.smoke else 'tiny (--smoke)'}, {a.spec}, batch {a.batch}, {N} tokens, CFG 2, {device} "
            f"{str(dtype).removeprefix('torch.')}, {'compiled (CUDA graphs)' if compile else 'eager'}, torch "
            f"{torch.__version__}{', ' + torch.cuda.get_device_name(device) if cuda else ''}"
            f"{f', drafter fuses target layers {list(world.feature_layers)}' if world.feature_layers else ''}")
        ar, spec = world.decoder({"name": "vanilla"}, params, compile), world.decoder(SPECS[a.spec], params, compile)
        for run in (ar, spec):
            run(*batch(world, a.batch))  # warm-up (and compilation)
        t_ar, _ = timed(device, lambda: ar(*batch(world, a.batch)))
        t_spec, (_, stats) = timed(device, lambda: spec(*batch(world, a.batch)))
        rounds = max(max(s.target_forwards for s in stats) - 1, 1)  # the prefill aside
        ms = lambda seconds: 1e3 * seconds / rounds  # noqa: E731 - per round, a batch sharing its wall time
        s = stats[0]
        say(f"plain AR {1e3 * t_ar / N:.3f} ms per token; {a.spec} {ms(t_spec):.3f} ms per round over {rounds} rounds "
            f"= {t_spec / rounds / (t_ar / N):.2f} tokens of plain AR")
        say(f"timer sections per round: draft {ms(s.time_draft_s * a.batch):.3f} ms, verify "
            f"{ms(s.time_verify_s * a.batch):.3f} ms, other {ms(s.time_other_s * a.batch):.3f} ms")
        if cuda:
            syncs, _ = synchronizing_calls(spec, world, a.batch)
            say(f"host syncs: {syncs} per batch, {syncs / rounds:.1f} per round")
        if not a.ops:
            return lines
        activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
        with torch.profiler.profile(activities=activities) as prof:
            spec(*batch(world, a.batch))
            if cuda:
                torch.cuda.synchronize(device)
        table = prof.key_averages()
        say(table.table(sort_by="self_cpu_time_total", row_limit=a.top))
        if cuda:
            say(table.table(sort_by="self_cuda_time_total", row_limit=a.top))
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="GPT-XL", choices=list(SIZES))
    ap.add_argument("--spec", default="chain-exact", choices=[k for k in SPECS if k != "vanilla"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=256, help="image tokens (a square)")
    ap.add_argument("--eager", action="store_true", help="no CUDA graphs, also on CUDA")
    ap.add_argument("--ops", action="store_true", help="also torch.profiler's operator tables (slow on large shapes)")
    ap.add_argument("--top", type=int, default=30, help="operators per profiler table (--ops)")
    ap.add_argument("--feature-layers", type=int, nargs="+", default=[], metavar="L",
                    help="target layers the drafter also reads (EAGLE-3's fusion; default: h_t alone)")
    ap.add_argument("--out", help="also write the report here")
    ap.add_argument("--smoke", action="store_true", help="toy sizes on the CPU: the script's plumbing, no numbers")
    a = ap.parse_args(argv)
    if a.batch < 1 or a.top < 1:
        ap.error("--batch and --top must be >= 1")
    lines = profile(a)
    if a.out:
        with atomic_path(a.out) as tmp:
            Path(tmp).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
