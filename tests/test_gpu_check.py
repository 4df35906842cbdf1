"""benchmarks/gpu_check.py: refuses a machine without CUDA in one line; its --smoke run (every step at toy sizes on
the CPU, compile and sync counting aside) writes the CSV, so the script still runs the day a GPU appears."""
import csv
import os
import subprocess
import sys
from pathlib import Path

from conftest import benchmark_script

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_check.py"


def test_refuses_without_cuda_in_one_line(tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # no device visible, on any machine
    r = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "c.csv")], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        "gpu_check: no CUDA device here (torch.cuda.is_available() is False); run it on a machine with a GPU"]
    assert not (tmp_path / "c.csv").exists()


def test_smoke_run_writes_every_row(tmp_path):
    gpu_check = benchmark_script("gpu_check")
    out = tmp_path / "c.csv"
    assert gpu_check.main(["--smoke", "--out", str(out), "--sizes", "GPT-B", "--batch", "1", "2"]) == 0
    rows = list(csv.DictReader(out.open()))
    names = set(gpu_check.SPECS)
    assert {r["name"] for r in rows if r["check"] == "compiled_equals_eager"} == names
    assert {r["name"] for r in rows if r["check"] == "host_syncs_per_round"} == names
    timed = [r for r in rows if r["check"] in ("plain_ar_ms_per_token", "upstream_ar_ms_per_token", "chain_round_ms")]
    assert len(timed) == 6 and all(float(r["value"]) > 0 for r in timed)
    assert {r["batch"] for r in timed} == {"1", "2"}


def test_specs_narrow_the_checks_and_no_sizes_skip_latency(tmp_path):
    gpu_check = benchmark_script("gpu_check")
    out = tmp_path / "c.csv"
    assert gpu_check.main(["--smoke", "--out", str(out), "--specs", "vanilla", "chain-exact", "--sizes"]) == 0
    rows = list(csv.DictReader(out.open()))
    assert {r["name"] for r in rows if r["check"] == "compiled_equals_eager"} == {"vanilla", "chain-exact"}
    assert {r["name"] for r in rows if r["check"] == "host_syncs_per_round"} == {"vanilla", "chain-exact"}
    assert {r["check"] for r in rows} == {"compiled_equals_eager", "host_syncs_per_round", "wall_s"}


def test_feature_layers_give_every_drafter_a_fused_input(tmp_path):
    gpu_check = benchmark_script("gpu_check")
    out = tmp_path / "c.csv"
    # the smoke shape has 2 layers: layer 0 is read, layer 5 lies beyond it and is dropped
    assert gpu_check.main(["--smoke", "--out", str(out), "--specs", "chain-exact", "static-lanternpp",
                           "--sizes", "GPT-B", "--batch", "1", "--feature-layers", "0", "5"]) == 0
    rows = list(csv.DictReader(out.open()))
    timed = [r for r in rows if r["check"] == "chain_round_ms"]
    assert len(timed) == 1 and timed[0]["note"].endswith("drafter fuses layers [0]")
