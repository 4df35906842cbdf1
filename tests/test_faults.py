"""Under faults (issues #52 and #61): damaged results met by a rerun (each repaired by the same command), two
Snakemake processes on one results folder, a job killed during evaluate or tables, and a full disk during evaluate. A small real DAG (shipped toy models, plain AR on 4
images, no proximity or clean world: toy_data, tokenize, ambiguity, generate, evaluate, tables; seconds of work) is
built once, and each test works on a copy of it."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO, result_hashes, run_logged, snakemake_env, tail

pytestmark = pytest.mark.slow

OUT = "results/mini"
OVERLAY = {"outdir": OUT, "threads": 1,
           "toy": {"checkpoints": "shipped", "clean_world": False, "data": {"n_train": 64, "n_val": 16},
                   "ambiguity": {"n_samples": 16, "n_heldout": 16, "batch": 16}},
           "proximity": {"enabled": False},
           "sweep": {"n_images": 4, "shards": 1, "in_job_vanilla": False, "latency_images": 0, "modes": ["sampling"],
                     "batch_size": {"sampling": 4, "greedy": 4}, "methods": [{"name": "vanilla"}]}}
SHARD = f"{OUT}/gen/sampling/vanilla/shard0"
METRICS = f"{OUT}/metrics/sampling/vanilla.json"
TABLES = f"{OUT}/tables/summary.md"
# what two runs of this DAG agree on byte for byte (sweep.csv and summary.md hold wall times)
SAME = ("gen/*/*/shard*/images/*.png", "metrics/*/*.json", "tables/positions.csv", "tables/depths.csv")
HANG_GUARD_S = 3600  # only catches a hang; a busy machine never reaches it


def cmd(workdir: Path, *args: str) -> list[str]:
    overlay = workdir.parent / f"{workdir.name}.overlay.yaml"
    overlay.write_text(yaml.safe_dump(OVERLAY))
    return [sys.executable, "-m", "snakemake", "--workflow-profile", "none", "--snakefile", str(REPO / "Snakefile"),
            "--directory", str(workdir), *args, "--configfile", str(REPO / "config" / "config.yaml"), str(overlay)]


@pytest.fixture(scope="module")
def mini(tmp_path_factory) -> Path:
    """LANTERN_MINI_WORKDIR=<an earlier session's mini workdir> reuses it (while iterating on tests); tests change
    only copies."""
    if os.environ.get("LANTERN_MINI_WORKDIR"):
        return Path(os.environ["LANTERN_MINI_WORKDIR"])
    wd = tmp_path_factory.mktemp("mini") / "wd"
    log = wd.parent / "mini.log"
    r = run_logged(cmd(wd, "--cores", "1", TABLES), log, timeout=HANG_GUARD_S)
    assert r.returncode == 0, tail(log)
    return wd


def copy(mini: Path, tmp: Path) -> Path:
    # copy2 keeps modification times, and .snakemake's metadata comes along: the copy is as up to date as mini
    return shutil.copytree(mini, tmp / "wd", symlinks=True, ignore=shutil.ignore_patterns("locks"))


def same(wd: Path) -> dict[str, str]:
    return result_hashes(wd / OUT, SAME)


def our_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error: ")]


# -- issue #61: the check before the first job (lantern.pipeline.verify) repairs what a rerun meets -----------------
POINTS = [f"{OUT}/gen/sampling/{p}/shard0" for p in ("vanilla", "vanilla-control")]
PNG = f"{SHARD}/images/000002.png"
SWEEP = {f"{OUT}/metrics/sampling/{Path(s).parent.name}.json": [s] for s in POINTS}  # metrics file -> its shards


def keep_time(path: Path, change) -> None:
    """Change a file's bytes under its old modification time: what a crash leaves when a write never reached the
    disk, and what no check on times alone can see."""
    st = path.stat()
    change(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def drop_last_line(path: Path) -> None:
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:-1]))


def edit_json(path: Path, **values) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **values}, indent=2, sort_keys=True) + "\n")


# fault -> (what it does to the results, the item it damages, what the check says about it); every shard fault sets
# the shard aside (its redraw is byte-identical), every metrics fault the metrics file
FAULTS = {
    "delete a png": (lambda r: (r / PNG).unlink(), SHARD,
                     r"it lacks 1 of the 4 images its manifest records \(e\.g\. images/000002\.png\)"),
    "truncate a png": (lambda r: keep_time(r / PNG, lambda p: os.truncate(p, p.stat().st_size // 2)), SHARD,
                       r"images/000002\.png holds \d+ bytes, its manifest records \d+"),
    "empty a png": (lambda r: keep_time(r / PNG, lambda p: os.truncate(p, 0)), SHARD,
                    r"images/000002\.png holds 0 bytes, its manifest records \d+"),
    "edit n_generated": (lambda r: edit_json(r / METRICS, n_generated=3), METRICS,
                         r"it was computed on 3 images \(n_generated\), but its shards hold 4"),
    "lose a stats row": (lambda r: drop_last_line(r / SHARD / "stats.csv"), SHARD,
                         "its stats.csv is short: 3 rows for the 4 images its manifest records"),
    "lose a manifest": (lambda r: (r / SHARD / "manifest.json").unlink(), SHARD, "it has no manifest.json"),
    "lose a metrics json": (lambda r: (r / METRICS).unlink(), METRICS, "missing"),
}


def check_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("lantern: ")]


@pytest.mark.parametrize("fault", FAULTS)
def test_the_check_before_the_first_job_finds_each_fault(fault, mini, tmp_path, monkeypatch):
    """Each fault is one line naming the item and what the run does; a damaged item is moved under damaged/ (never
    deleted), and what read it gets a 1970 modification time, so Snakemake reruns it and remakes the item."""
    import re

    from lantern.pipeline.verify import STALE_NS, verify_results

    wd = copy(mini, tmp_path)
    monkeypatch.chdir(wd)
    damage, item, why = FAULTS[fault]
    damage(wd)
    found = verify_results(OUT, SWEEP, f"{OUT}/tables")
    assert len(found.lines) == 1, found.lines
    line = found.lines[0]
    assert re.fullmatch(rf"{re.escape(item)}: {why}; .*", line), line
    if why != "missing":  # set aside whole, under its own path
        assert re.search(rf"; set aside as {OUT}/damaged/\d{{8}}T\d{{6}}Z/{re.escape(item.removeprefix(OUT + '/'))}; ",
                         line), line
        assert not Path(item).exists() and len(list(Path(OUT, "damaged").glob(f"*/{item.removeprefix(OUT + '/')}"))) == 1
    stale = [Path(OUT, "tables", n) for n in ("sweep.csv", "positions.csv", "depths.csv", "summary.md")]
    stale += [Path(METRICS)] if item == SHARD else []
    assert all(p.stat().st_mtime_ns == STALE_NS for p in stale), "what read the item must be marked out of date"
    for p in stale:  # marked, not changed
        assert p.read_bytes() == (mini / p).read_bytes()
    # a sound copy, every digest checked: nothing found, nothing moved or marked
    monkeypatch.chdir(copy(mini, tmp_path / "sound"))
    assert verify_results(OUT, SWEEP, f"{OUT}/tables", digests=True).lines == []
    assert all(p.stat().st_mtime_ns == (mini / p).stat().st_mtime_ns for p in stale)


def test_a_cut_png_under_a_manifest_without_sizes_is_found(mini, tmp_path, monkeypatch):
    """Shards written before manifests recorded sizes: a PNG cut under its old time lacks the PNG end chunk."""
    from lantern.pipeline.verify import verify_results

    wd = copy(mini, tmp_path)
    monkeypatch.chdir(wd)
    manifest = json.loads((wd / SHARD / "manifest.json").read_text())
    del manifest["images"]["bytes"], manifest["stats_table"]
    (wd / SHARD / "manifest.json").write_text(json.dumps(manifest))
    assert verify_results(OUT, SWEEP, f"{OUT}/tables").lines == []
    keep_time(wd / PNG, lambda p: os.truncate(p, p.stat().st_size - 20))
    lines = verify_results(OUT, SWEEP, f"{OUT}/tables").lines
    assert len(lines) == 1 and lines[0].startswith(f"{SHARD}: images/000002.png is cut short (no PNG end chunk; "), lines


@pytest.mark.parametrize("fault", ["lose a manifest", "edit n_generated", "lose a metrics json", "empty a png"])
def test_the_same_command_repairs_a_fault_to_the_same_bytes(fault, mini, tmp_path):
    """Before: a rerun said "Nothing to be done" and kept the damage. Now the same command sets the item aside,
    redraws or recomputes it and what read it, and ends with the undamaged run's bytes; a third run has nothing to
    do. Each fault of FAULTS takes one of these paths: a shard redrawn, a metrics file set aside, a missing one
    remade through its marked readers; or damaged PNGs of a sound shard restored from their tokens (no job runs)."""
    wd = copy(mini, tmp_path)
    damage, item, why = FAULTS[fault]
    damage(wd)
    r = subprocess.run(cmd(wd, "--cores", "1", TABLES), cwd=REPO, env=snakemake_env(), capture_output=True,
                       text=True, timeout=HANG_GUARD_S)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = check_lines(r.stderr)
    assert lines[0].startswith(f"lantern: {item}: ") and "this run re" in lines[0] or "restored 1 image" in lines[0], \
        lines
    assert same(wd) == same(mini)
    if "restored" in lines[0]:
        assert "Nothing to be done" in r.stdout + r.stderr
    if item == METRICS or "restored" in lines[0]:  # no image redrawn: the tables, times included, are the same
        for name in ("sweep.csv", "summary.md"):
            assert (wd / OUT / "tables" / name).read_bytes() == (mini / OUT / "tables" / name).read_bytes()
    again = subprocess.run(cmd(wd, "--cores", "1", TABLES), cwd=REPO, env=snakemake_env(), capture_output=True,
                           text=True, timeout=HANG_GUARD_S)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr
    assert check_lines(again.stderr)[-1].endswith("nothing to repair"), again.stderr[-2000:]


def test_a_dry_run_checks_nothing(mini, tmp_path):
    """A dry run (-n) moves and marks nothing: it only says what a real run would do."""
    wd = copy(mini, tmp_path)
    (wd / PNG).unlink()
    r = subprocess.run(cmd(wd, "-n", TABLES), cwd=REPO, env=snakemake_env(), capture_output=True, text=True,
                       timeout=HANG_GUARD_S)
    assert r.returncode == 0 and check_lines(r.stderr) == [], r.stderr[-2000:]
    assert (wd / SHARD / "manifest.json").is_file() and not (wd / OUT / "damaged").exists()


def start(wd: Path, log: Path, *targets: str) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen(cmd(wd, "--cores", "1", *targets), cwd=REPO, env=snakemake_env(), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def wait_for(job: subprocess.Popen, path: Path, log: Path) -> None:
    """Until `path` exists (a job's log: the job has started), while the run is alive."""
    deadline = time.monotonic() + HANG_GUARD_S
    while not path.exists():
        assert job.poll() is None, f"the run ended before {path.name} appeared:\n{tail(log)}"
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_two_snakemake_processes_on_one_results_folder_never_interleave(mini, tmp_path):
    """The second refuses (Snakemake's lock on the working directory) while the first holds it; the first then
    finishes with the bytes of an undisturbed run."""
    wd = copy(mini, tmp_path)
    shutil.rmtree(wd / SHARD)
    (wd / METRICS).unlink()
    job_log = wd / OUT / "logs" / "generate" / "sampling" / "vanilla" / "shard0.log"
    job_log.unlink()  # the copy holds the finished run's
    first_log = tmp_path / "first.log"
    first = start(wd, first_log, METRICS)
    try:
        wait_for(first, job_log, first_log)
        os.killpg(first.pid, signal.SIGSTOP)  # the first run holds the lock mid-job, as long as this test needs
        second = subprocess.run(cmd(wd, "--cores", "1", METRICS), cwd=REPO, env=snakemake_env(), capture_output=True,
                                text=True, timeout=HANG_GUARD_S)
        assert second.returncode != 0 and "cannot be locked" in second.stdout + second.stderr
        os.killpg(first.pid, signal.SIGCONT)
        assert first.wait(timeout=HANG_GUARD_S) == 0, tail(first_log)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    assert same(wd) == same(mini)


@pytest.mark.parametrize("rule, target, job_log, outputs", [
    ("evaluate", METRICS, "evaluate/sampling/vanilla.log", [METRICS]),
    ("tables", TABLES, "tables.log", [f"{OUT}/tables/{n}" for n in ("sweep.csv", "positions.csv", "depths.csv",
                                                                      "rounds.csv", "summary.md")]),
])
def test_a_job_killed_mid_run_resumes_to_the_same_bytes(rule, target, job_log, outputs, mini, tmp_path):
    """SIGKILL to Snakemake and its job (a node failure) once the job has started: no output is left half-written
    (each is absent or complete), and --unlock plus the same command give the undisturbed run's bytes."""
    wd = copy(mini, tmp_path)
    for o in outputs:
        (wd / o).unlink()
    (wd / OUT / "logs" / job_log).unlink()
    log = tmp_path / "killed.log"
    job = start(wd, log, target)
    try:
        wait_for(job, wd / OUT / "logs" / job_log, log)
        os.killpg(job.pid, signal.SIGKILL)
    finally:
        job.wait()
    for o in outputs:  # every write is renamed into place when complete: what exists is whole
        if not (wd / o).exists():
            continue
        if o.endswith(("summary.md", "sweep.csv")):  # wall times differ between runs, the rows do not
            assert len((wd / o).read_text().splitlines()) == len((mini / o).read_text().splitlines())
        else:
            assert (wd / o).read_bytes() == (mini / o).read_bytes()
    assert run_logged(cmd(wd, "--unlock", target), tmp_path / "unlock.log").returncode == 0
    r = run_logged(cmd(wd, "--cores", "1", "--rerun-incomplete", target), log, timeout=HANG_GUARD_S)
    assert r.returncode == 0, tail(log)
    assert same(wd) == same(mini)


def test_a_full_disk_during_evaluate_is_one_line_and_leaves_nothing(mini, tmp_path, monkeypatch, capsys):
    """The disk fills while evaluate writes: one line naming the file and what to free, no metrics file and no
    temporary file left (the same command then resumes)."""
    from lantern.pipeline.cli import main as cli
    from lantern.pipeline.config import evaluate_params, merge_config, validate_config
    from test_bad_inputs import assert_one_line, enospc_on_write

    wd = copy(mini, tmp_path)
    base = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg = validate_config(merge_config(base, json.loads(json.dumps({**OVERLAY, "outdir": str(wd / OUT)}))))
    toy = REPO / "models" / "toy" / "default"
    params = evaluate_params(cfg, str(toy / "clip.pt"), str(toy / "classifier.pt"))
    out = wd / OUT / "metrics" / "full.json"
    args = ["evaluate", "--images", str(wd / SHARD / "images"), "--reference",
            str(wd / OUT / "toy" / "default" / "data" / "val.pt"), "--captions", str(wd / SHARD / "stats.csv"),
            "--out", str(out), "--params", json.dumps(params), "--threads", "1"]
    enospc_on_write(monkeypatch)
    rc = cli(args)
    monkeypatch.undo()
    captured = capsys.readouterr()
    assert_one_line(rc, captured.out, captured.err, r"cannot write \S+: no space left on the device \(ENOSPC\); free "
                                                    r"space on the file system of")
    assert not out.exists()
    assert not list((wd / OUT).rglob("*.tmp")), "a temporary file was left behind"
    assert cli(args) == 0 and out.is_file()  # room again: the same command completes
    capsys.readouterr()


@pytest.mark.parametrize("fault", ["delete a png", "truncate a png", "empty a png"])
def test_damaged_pngs_of_a_sound_shard_are_restored_from_their_tokens(fault, mini, tmp_path, monkeypatch):
    """A PNG is its stats row's tokens decoded by the VQ: redrawn so, it holds its recorded sha256 again, and the
    shard, its times and what read it stay as they were. A decode that comes out otherwise restores nothing."""
    from lantern.pipeline.verify import png_restorer, verify_results

    wd = copy(mini, tmp_path)
    monkeypatch.chdir(wd)
    FAULTS[fault][0](wd)
    restore = png_restorer(str(REPO / "models" / "toy" / "default" / "vq.pt"), 1)
    found = verify_results(OUT, SWEEP, f"{OUT}/tables", restore=restore)
    assert len(found.lines) == 1 and found.lines[0].endswith("; restored 1 image(s) from the tokens in its "
                                                             "stats.csv, each holding its recorded sha256 again: "
                                                             "nothing to redraw"), found.lines
    assert (wd / PNG).read_bytes() == (mini / PNG).read_bytes()
    for f in [METRICS, *(f"{OUT}/tables/{n}" for n in ("sweep.csv", "summary.md"))]:  # nothing marked
        assert (wd / f).stat().st_mtime_ns == (mini / f).stat().st_mtime_ns
    assert verify_results(OUT, SWEEP, f"{OUT}/tables", digests=True, restore=restore).lines == []
    (wd / PNG).unlink()  # another VQ decodes other pixels: the shard is set aside for its redraw instead
    other = png_restorer(str(REPO / "models" / "toy" / "clean" / "vq.pt"), 1)
    lines = verify_results(OUT, SWEEP, f"{OUT}/tables", restore=other).lines
    assert len(lines) == 1 and "; set aside as " in lines[0], lines
