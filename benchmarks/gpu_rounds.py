"""A speculative round's cost in plain-AR tokens, appended to the committed record benchmarks/records/gpu_rounds.csv.

    python benchmarks/gpu_rounds.py --size GPT-XL --specs chain-exact chain-lantern --batch 1 8 --commit abc1234
        [--tokens 256] [--record benchmarks/records/gpu_rounds.csv] [--table-k 50]

For each batch size: plain AR's time per token through the compiled decode step (what `lantern sample` runs on
CUDA), then each decoder of benchmarks/gpu_check.py's SPECS (compile on, as `lantern sample` runs it): its time per
round (batch wall time / rounds, the prefill aside), that in plain-AR tokens (the tau at which it breaks even), the
host syncs per round (CUDA's sync debug mode, one more batch) and the ATen operators dispatched outside compiled
regions per round (benchmarks/host_ops.py, one more batch). A LlamaGen shape with random bf16 weights, CFG 2:
acceptance means nothing here, the cost of a round does. Each row is appended as soon as it is measured, so a
lease cut short keeps what it measured. On a machine without CUDA: --smoke (toy sizes, eager, CPU) or one line.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import host_ops  # noqa: E402
from gpu_check import SIZES, SMOKE_ARGS, SPECS, World, batch, synchronizing_calls, timed  # noqa: E402

from lantern.engine.models.model import ModelArgs, named_args  # noqa: E402
from lantern.engine.decoding.sampling import SamplingParams  # noqa: E402

COLUMNS = ["date", "commit", "device", "torch", "size", "spec", "batch", "round_ms", "ar_ms_per_token",
           "round_in_ar_tokens", "syncs_per_round", "host_ops_per_round"]
# beside gpu_check's decoders, LANTERN at the paper's operating point: k = 1000 of 16384 codes with the authors'
# residual (it reads k + 1 neighbours: run it with --table-k 1001)
DECODERS = {**SPECS,  # and the paper's operating point, k = 1000 of 16384 codes (--table-k 1001)
            "chain-lantern-k1000": {"name": "lantern", "drafting": "chain", "gamma": 4, "delta": 0.2, "k": 1000,
                                    "residual": "reference"},
            "static-lanternpp-k1000": {"name": "lanternpp", "drafting": "static", "tree": "naive_extend_57",
                                       "lam": 5.0, "k": 1000, "residual": "reference"}}
RECORD = Path(__file__).resolve().parent / "records" / "gpu_rounds.csv"


def append(path: Path, row: dict) -> None:
    """One row onto the record (header first if the file is new): appended whole, so an earlier row never changes."""
    new = not path.exists() or path.stat().st_size == 0
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        if new:
            writer.writeheader()
        writer.writerow(row)


def rounds_of(stats) -> int:
    return max(max(s.target_forwards for s in stats) - 1, 1)


def measure(a) -> list[dict]:
    cuda = torch.cuda.is_available() and not a.smoke
    device, dtype = (torch.device("cuda"), torch.bfloat16) if cuda else (torch.device("cpu"), torch.float32)
    args = ModelArgs(**SMOKE_ARGS) if a.smoke else named_args(a.size, image_tokens=a.tokens)
    params = SamplingParams(cfg_scale=2.0)
    base = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"), "commit": a.commit,
            "device": torch.cuda.get_device_name(device) if cuda else "cpu (--smoke)",
            "torch": torch.__version__, "size": "tiny (--smoke)" if a.smoke else a.size}
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        world = World(args, device, dtype, Path(folder), table_k=a.table_k)
        N = world.target.args.image_tokens
        for B in a.batch:
            ar = world.decoder({"name": "vanilla"}, params, cuda)
            ar(*batch(world, B))  # compilation
            t_ar, _ = timed(device, lambda: ar(*batch(world, B)))
            for name in a.specs:
                run = world.decoder(DECODERS[name], params, cuda)
                run(*batch(world, B))  # compilation
                t, (_, stats) = timed(device, lambda: run(*batch(world, B)))
                rounds = rounds_of(stats)
                syncs = synchronizing_calls(run, world, B)[0] / rounds if cuda else float("nan")
                ops, (_, stats) = host_ops.count(lambda: run(*batch(world, B)))
                row = dict(base, spec=name, batch=B, round_ms=round(1e3 * t / rounds, 3),
                           ar_ms_per_token=round(1e3 * t_ar / N, 3), round_in_ar_tokens=round(t / rounds / (t_ar / N), 2),
                           syncs_per_round=round(syncs, 1), host_ops_per_round=round(ops / rounds_of(stats), 1))
                print(", ".join(f"{k} {v}" for k, v in row.items()), flush=True)
                if a.record:
                    append(Path(a.record), row)
                rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="GPT-XL", choices=list(SIZES))
    ap.add_argument("--specs", nargs="+", default=["chain-exact"], choices=[k for k in DECODERS if k != "vanilla"])
    ap.add_argument("--batch", type=int, nargs="+", default=[1])
    ap.add_argument("--tokens", type=int, default=256, help="image tokens (a square)")
    ap.add_argument("--table-k", type=int, default=50, help="neighbours per code in the table (the paper: 1000)")
    ap.add_argument("--commit", default="unknown", help="the commit measured (the device's copy has no .git)")
    ap.add_argument("--record", default=str(RECORD), help="CSV to append to ('' : none)")
    ap.add_argument("--smoke", action="store_true", help="toy sizes on the CPU: the script's plumbing, no numbers")
    a = ap.parse_args(argv)
    if not a.smoke and not torch.cuda.is_available():
        sys.exit("gpu_rounds: no CUDA device here; run it on a GPU (or --smoke on a CPU, which records nothing)")
    if a.smoke:
        a.record = ""
    measure(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
