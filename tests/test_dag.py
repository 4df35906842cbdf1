"""The experiment DAG end to end at smoke size (config/smoke.yaml): every table, figure and the report come out;
a finished run is up to date; a deleted figure reruns only its rule; a killed generation job resumes to
byte-identical images; the shard count never changes an image."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO, SMOKE_OUT, result_hashes, run_logged, smoke_cmd, snakemake_env, tail

pytestmark = pytest.mark.slow

JOB_STATS = re.compile(r"Job stats:\n.*?\n-+\s+-+\n(.*?)\ntotal\s+(\d+)", re.S)
POINTS = ["vanilla", "vanilla-control", "exact-chain-g3", "lantern-chain-g3-d0.2-k2", "lantern-chain-g3-d0.2-k10",
          "lanternpp-static-naive_extend_57-l5-k10", "exact-jacobi-w4"]
FIGURES = ["tradeoff", "tau_vs_delta", "heatmap", "tree_depth", "tree_budget", "acceptance_map", "samples_sampling", "ambiguity",
           "round_anatomy"]


def jobs_run(log: Path) -> dict[str, int]:
    """Rule -> number of jobs, from the job stats Snakemake prints before running (empty when none ran)."""
    return jobs_run_text(log.read_text())


def jobs_run_text(text: str) -> dict[str, int]:
    m = JOB_STATS.search(text)
    if not m:
        return {}
    counts = dict(line.split() for line in m[1].strip().splitlines())
    return {rule: int(n) for rule, n in counts.items() if rule != "all"}


def copy_workdir(src: Path, dst: Path) -> Path:
    # copy2 keeps modification times, and .snakemake's metadata comes along: the copy is as up to date as src.
    shutil.copytree(src, dst, symlinks=True, ignore=shutil.ignore_patterns("locks"))
    return dst


def images(folder: Path) -> dict[str, str]:
    return {Path(k).name: v for k, v in result_hashes(folder, ("shard*/images/*.png",)).items()}


def test_smoke_dag_makes_every_table_and_figure(smoke_run, tmp_path):
    out = smoke_run.out
    for name in ["sweep.csv", "positions.csv", "depths.csv", "rounds.csv", "summary.md"]:
        assert (out / "tables" / name).stat().st_size > 0, name
    for name in FIGURES:
        assert (out / "figures" / f"{name}.png").stat().st_size > 10_000, name
    for world in ["default", "clean"]:  # the toy world's report: model quality beside the ambiguity table
        stats = json.loads((out / "toy" / world / "world_stats.json").read_text())
        assert stats["vq_psnr"] > 5 and 0 < stats["vq_codebook_usage"] <= 1 and stats["target_val_loss"] > 0
    sweep = pd.read_csv(out / "tables" / "sweep.csv").set_index("point")
    assert set(POINTS) <= set(sweep.index), "a sweep point is missing from the table"
    # smoke.yaml sets sweep.in_job_vanilla: every speculative point carries a speed-up timed in its own jobs, the
    # tables' headline (plain AR is its own reference)
    in_job = sweep["speedup_vs_in_job_vanilla"]
    assert (in_job[["vanilla", "vanilla-control"]] == 1).all() and (in_job.drop(["vanilla", "vanilla-control"]) > 0).all()
    # at batch 1 the in-job ratio is the batch-1 latency ratio: the paper's setting, the headline
    assert (sweep["speedup"] == in_job).all() and (sweep["speedup_kind"] == "in-job, batch 1").all()
    for point in POINTS:
        assert len(list((out / "gen" / "sampling" / point).glob("shard*/images/*.png"))) == 4, point
    # Every generation job's output appeared whole: no half-written shard folders are left anywhere.
    assert not list(out.glob("gen/**/*.partial"))

    report = tmp_path / "report.html"
    log = tmp_path / "report.log"
    r = run_logged(smoke_cmd(smoke_run.workdir, "--report", str(report)), log, timeout=3600)
    assert r.returncode == 0, tail(log)
    assert report.stat().st_size > 100_000


def test_second_run_does_nothing(smoke_run, tmp_path):
    log = tmp_path / "again.log"
    r = run_logged(smoke_cmd(smoke_run.workdir, "--cores", "2"), log)
    assert r.returncode == 0, tail(log)
    assert jobs_run(log) == {} and "Nothing to be done" in log.read_text(), tail(log)


def test_a_changed_training_recipe_reruns_its_rule(smoke_run, tmp_path):
    # the drafter, CLIP and classifier rules pass their thread count beside the recipe, not inside it: Snakemake
    # ignores params that are functions of threads, and a changed recipe then kept the old checkpoint
    overlay = {"toy": {"drafter": {"lr": 0.0005}, "clip": {"steps": 31}, "classifier": {"steps": 21}}}
    log = tmp_path / "changed.log"
    r = run_logged(smoke_cmd(smoke_run.workdir, "-n", overlay=overlay), log)
    assert r.returncode == 0, tail(log)
    text = log.read_text()
    for rule in ("train_drafter", "train_clip", "train_classifier"):
        block = text.split(f"rule {rule}:", 1)
        assert len(block) == 2 and "Params have changed" in block[1].split("\n\n", 1)[0], tail(log)


def test_the_drafter_alone_retrains_for_the_shipped_target(tmp_path):
    """With shipped checkpoints the drafter rule still exists (ship_toy.py --only drafter; the EAGLE-1 recipe of
    config/drafter-eagle1.yaml): it trains on the shipped target, and a self-generated recipe asks for no token files
    (no data, VQ or tokenize job)."""
    out = tmp_path / "out"
    drafter = out / "toy" / "default" / "models" / "drafter.pt"
    cmd = [sys.executable, "-m", "snakemake", "--workflow-profile", "none", "-n", "-p", "--cores", "2",
           "--configfile", "config/config.yaml", "config/drafter-eagle1.yaml", "--config", f"outdir={out}", "--",
           str(drafter)]
    r = subprocess.run(cmd, cwd=REPO, env=snakemake_env(), capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert jobs_run_text(r.stdout) == {"train_drafter": 1}
    shell = next(line for line in r.stdout.splitlines() if "lantern train-drafter" in line)
    assert f"--target {REPO}/models/toy/default/target.pt" in shell and "--tokens" not in shell
    assert '"feature_layers": []' in shell and '"unroll": 1' in shell  # the overlay's recipe, not the default's


def test_deleting_a_figure_reruns_only_its_rule(smoke_run, tmp_path):
    figure = smoke_run.out / "figures" / "tau_vs_delta.png"
    before = figure.read_bytes()
    figure.unlink()
    log = tmp_path / "rerun.log"
    r = run_logged(smoke_cmd(smoke_run.workdir, "--cores", "2"), log)
    assert r.returncode == 0, tail(log)
    assert jobs_run(log) == {"figure": 1}, tail(log)
    assert "figures/tau_vs_delta.png" in log.read_text()
    # The figure is a function of the tables alone: redrawn, it is the same file.
    assert figure.read_bytes() == before


def test_killed_generation_job_resumes_to_identical_images(smoke_run, tmp_path):
    wd = copy_workdir(smoke_run.workdir, tmp_path / "wd")
    point = "lantern-chain-g3-d0.2-k10"
    shard = wd / SMOKE_OUT / "gen" / "sampling" / point / "shard0"
    partial = Path(f"{shard}.partial")
    # 40 images per point, so shard 0 (images 0-19) runs long enough to be killed in the middle.
    config = {"sweep": {"n_images": 40}}
    cmd = smoke_cmd(wd, "--cores", "1", "--force", targets=(str(shard.relative_to(wd)),), overlay=config)
    with open(tmp_path / "killed.log", "w") as log:
        job = subprocess.Popen(cmd, cwd=REPO, env=snakemake_env(), stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        deadline = time.monotonic() + 3600  # a hang guard: a busy machine may take minutes to start the job
        # A row is written after its image, so three rows mean three finished images.
        while len(list(partial.glob("rows/*.json"))) < 3:
            assert job.poll() is None, f"the job ended before it could be killed:\n{tail(tmp_path / 'killed.log')}"
            assert time.monotonic() < deadline, "no finished images after an hour"
            time.sleep(0.02)
        os.killpg(job.pid, signal.SIGKILL)  # Snakemake and the job with it, as a node failure would
    finally:
        job.wait()
    kept = len(list(partial.glob("rows/*.json")))
    assert 3 <= kept < 20 and not shard.exists(), "a killed job must leave nothing that looks finished"

    log = tmp_path / "resumed.log"
    assert run_logged(smoke_cmd(wd, "--unlock", targets=(str(shard.relative_to(wd)),), overlay=config),
                      log).returncode == 0
    r = run_logged(smoke_cmd(wd, "--cores", "1", targets=(str(shard.relative_to(wd)),), overlay=config), log)
    assert r.returncode == 0, tail(log)
    job_log = (wd / SMOKE_OUT / "logs" / "generate" / "sampling" / point / "shard0.log").read_text()
    assert "finished images kept" in job_log and not partial.exists()
    resumed = images(shard.parent)
    assert len(resumed) == 20

    r = run_logged(smoke_cmd(wd, "--cores", "1", "--force", targets=(str(shard.relative_to(wd)),),
                             overlay=config), log)
    assert r.returncode == 0, tail(log)
    assert images(shard.parent) == resumed, "resumed images differ from an uninterrupted run's"
    # Images 0 and 1 are also those of the 4-image smoke run: an image never depends on how many were asked for.
    original = images(smoke_run.out / "gen" / "sampling" / point)
    assert original == {k: resumed[k] for k in original}


def test_shard_count_does_not_change_images(smoke_run, tmp_path):
    wd = copy_workdir(smoke_run.workdir, tmp_path / "wd")
    shutil.rmtree(wd / SMOKE_OUT / "gen")
    targets = tuple(f"{SMOKE_OUT}/gen/sampling/{p}/shard{j}" for p in POINTS for j in range(3))
    log = tmp_path / "shards3.log"
    r = run_logged(smoke_cmd(wd, "--cores", "2", targets=targets, overlay={"sweep": {"shards": 3}}), log)
    assert r.returncode == 0, tail(log)
    assert jobs_run(log) == {"generate": 3 * len(POINTS)}
    for point in POINTS:
        three = images(wd / SMOKE_OUT / "gen" / "sampling" / point)
        two = images(smoke_run.out / "gen" / "sampling" / point)
        assert len(three) == 4 and three == two, point


def test_batched_generation_draws_the_unbatched_images(smoke_run, tmp_path):
    """sweep.batch_size 2: every point's images equal the batch-1 smoke run's, and the tables carry the batch and
    the batch-1 latency of the images decoded alone (sweep.latency_images 2: shard 0's images; shard 1 batched)."""
    wd = copy_workdir(smoke_run.workdir, tmp_path / "wd")
    shutil.rmtree(wd / SMOKE_OUT / "gen")
    overlay = {"sweep": {"batch_size": {"sampling": 2}, "latency_images": 2}}
    log = tmp_path / "batched.log"
    r = run_logged(smoke_cmd(wd, "--cores", "2", targets=(f"{SMOKE_OUT}/tables/sweep.csv",), overlay=overlay), log)
    assert r.returncode == 0, tail(log)
    for point in POINTS:
        batched = images(wd / SMOKE_OUT / "gen" / "sampling" / point)
        assert len(batched) == 4 and batched == images(smoke_run.out / "gen" / "sampling" / point), point
    sweep = pd.read_csv(wd / SMOKE_OUT / "tables" / "sweep.csv").set_index("point")
    assert (sweep["batch_size"] == 2).all() and (sweep["latency_b1_images"] == 2).all()
    assert sweep["speedup_b1_in_job"].notna().all() and sweep["speedup_vs_in_job_vanilla"].notna().all()
    for point in POINTS:  # each image decoded once: shard 0's alone, shard 1's in one batch
        sizes = [pd.read_csv(wd / SMOKE_OUT / "gen" / "sampling" / point / f"shard{j}" / "stats.csv")["batch_size"]
                 .tolist() for j in range(2)]
        assert sizes == [[1, 1], [2, 2]], point


def test_mode_images_draw_the_first_images_of_each_shard(smoke_run, tmp_path):
    """sweep.mode_images {greedy: 2}: greedy jobs decode image 0 of shard 0 and image 2 of shard 1 (the sweep's shard
    starts), so a cheap greedy column keeps every image's index, seed and caption shard."""
    wd = copy_workdir(smoke_run.workdir, tmp_path / "wd")
    overlay = {"sweep": {"modes": ["sampling", "greedy"], "mode_images": {"greedy": 2}}}
    points = ["vanilla", "exact-chain-g3"]
    targets = tuple(f"{SMOKE_OUT}/gen/greedy/{p}/shard{j}" for p in points for j in range(2))
    log = tmp_path / "greedy.log"
    r = run_logged(smoke_cmd(wd, "--cores", "2", targets=targets, overlay=overlay), log)
    assert r.returncode == 0, tail(log)
    assert jobs_run(log) == {"generate": 4}
    for point in points:
        for j, index in enumerate((0, 2)):
            stats = pd.read_csv(wd / SMOKE_OUT / "gen" / "greedy" / point / f"shard{j}" / "stats.csv")
            assert stats["image_index"].tolist() == [index] and (stats["mode"] == "greedy").all(), (point, j)
