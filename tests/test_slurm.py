"""Cluster execution: the SLURM profile run on a real one-node SLURM, its static checks, and the local-GPU
device allocator.

The `slurm` tests install Debian's SLURM + munge when missing (root), start munged/slurmctld/slurmd on
localhost (tests/slurm/cluster.py), run the project's smoke DAG (Snakefile + config/smoke.yaml) through
workflow/profiles/slurm with its sizes cut to this machine, compare it with the session's local smoke run
(tests/conftest.py), and stop every daemon they started by PID, also on failure. The stand-in workflow
tests/slurm/mini/Snakefile (the pipeline's rule names, seconds per job) serves the retry and allocator tests.
"""
import fcntl
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "slurm"))
import cluster  # noqa: E402
import profile_check  # noqa: E402
from conftest import SMOKE_OUT, result_files, result_hashes  # noqa: E402

SLURM_PROFILE = REPO / "workflow" / "profiles" / "slurm"
LOCAL_GPU_PROFILE = REPO / "workflow" / "profiles" / "local-gpu"
GPU_RUN = REPO / "src" / "lantern" / "pipeline" / "gpu_run.py"
MINI = REPO / "tests" / "slurm" / "mini" / "Snakefile"
WORKFLOWS = {
    "smoke": ["--snakefile", str(REPO / "Snakefile"), "--configfile", str(REPO / "config" / "smoke.yaml")],
    "mini": ["--snakefile", str(MINI)],
}
GPU_RULES = ("generate", "train_drafter", "evaluate")
LOCAL_RULES = ("tables", "figure", "figure_samples", "figure_ambiguity")
SUBMITTED = re.compile(r"Job \d+ has been submitted with SLURM jobid (\d+) \(log: (.+?)\)\.")
RULE_LINE = re.compile(r"^(local)?rule (\w+):$", re.M)
# A guard against a hang (every subprocess here uses it), not a speed check: the smoke DAG takes ~6.5 min here when
# idle, far longer when the machine is busy, and progressing work must never fail for being slow.
RUN_TIMEOUT = 3600


def snakemake_cmd(*args: str) -> list[str]:
    # --workflow-profile none: exercise exactly the profile given, never a workflow/profiles/default.
    return [sys.executable, "-m", "snakemake", "--workflow-profile", "none", *args]


def env() -> dict[str, str]:
    # Rules call the venv's console scripts (`lantern ...`), also when pytest was started as .venv/bin/python.
    return dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")


def run(cmd: list[str], log: Path, timeout: float = RUN_TIMEOUT) -> subprocess.CompletedProcess:
    with open(log, "w") as out:
        r = subprocess.run(cmd, cwd=REPO, env=env(), stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
    return r


def tail(path: Path, n: int = 60) -> str:
    return "\n".join(path.read_text().splitlines()[-n:])


# --- the profiles' static checks: no cluster needed ----------------------------------------------------------

@pytest.fixture(scope="module")
def rules() -> set[str]:
    return profile_check.workflow_rules(WORKFLOWS["smoke"])


def load(profile_dir: Path) -> dict:
    return yaml.safe_load((profile_dir / "config.yaml").read_text())


def test_profiles_pass_check(rules):
    assert profile_check.check_profile(SLURM_PROFILE, rules) == []
    assert profile_check.check_profile(LOCAL_GPU_PROFILE, rules) == []


def test_slurm_profile_requests():
    p = load(SLURM_PROFILE)
    assert p["executor"] == "slurm"
    # sacct hangs without slurmdbd; squeue works everywhere.
    assert p["slurm-status-command"] == "squeue"
    assert p["slurm-logdir"] and p["slurm-keep-successful-logs"] is True
    assert p["retries"] >= 1
    defaults = p["default-resources"]
    # The user fills in partition/account; an account set on a cluster without slurmdbd breaks submission.
    assert "slurm_account" not in defaults and "slurm_partition" not in defaults
    assert profile_check.evaluate(defaults["mem_mb"], 1) > 0
    for res in [defaults, *p["set-resources"].values()]:
        if "runtime" in res:  # more time on each retry
            assert profile_check.evaluate(res["runtime"], 2) > profile_check.evaluate(res["runtime"], 1)
    for rule in GPU_RULES:
        assert p["set-resources"][rule]["gpu"] >= 1 and p["set-resources"][rule]["cpus_per_gpu"] >= 1
    for rule in LOCAL_RULES:  # run by Snakemake itself (localrules), so nothing to request
        assert rule not in p["set-resources"]


TYPOS = [
    ("    gpu: 1", "    gpus: 1", "unknown resource 'gpus'"),
    ("    cpus_per_gpu: 8", "    cpus_per_gup: 8", "unknown resource 'cpus_per_gup'"),
    ("  runtime: 60 * attempt", "  runtmie: 60 * attempt", "unknown resource 'runtmie'"),
    ("  generate:", "  generat:", "unknown rule 'generat'"),
    ("    cpus_per_gpu: 8", "    cpus_per_gpu: 8.5", "cpus_per_gpu=8.5"),
    ("    runtime: 240 * attempt", "    runtime: 240 * atempt", "runtime='240 * atempt'"),
    ("slurm-status-command:", "slurm-status-comand:", "unknown option 'slurm-status-comand'"),
]


@pytest.mark.parametrize("old,new,problem", TYPOS, ids=[t[1].strip() for t in TYPOS])
def test_profile_typo_is_caught(tmp_path, rules, old, new, problem):
    text = (SLURM_PROFILE / "config.yaml").read_text()
    assert old in text, f"the profile changed: update this test's typo {old!r}"
    (tmp_path / "config.yaml").write_text(text.replace(old, new, 1))
    problems = profile_check.check_profile(tmp_path, rules)
    assert any(problem in p for p in problems), problems


def test_option_typo_fails_snakemake(tmp_path):
    text = (SLURM_PROFILE / "config.yaml").read_text()
    (tmp_path / "config.yaml").write_text(text.replace("slurm-status-command:", "slurm-status-comand:"))
    r = subprocess.run(snakemake_cmd("--profile", str(tmp_path), "-n", *WORKFLOWS["mini"],
                                     "--directory", str(tmp_path / "wd")),
                       cwd=REPO, env=env(), capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert r.returncode != 0 and "unrecognized arguments: --slurm-status-comand" in r.stderr


# --- local-GPU device allocator ----------------------------------------------------------------------------

def gpu_env(tmp_path: Path, pool: str) -> dict[str, str]:
    e = env()
    for var in ("SLURM_JOB_ID", "CUDA_VISIBLE_DEVICES"):
        e.pop(var, None)
    return dict(e, LANTERN_GPUS=pool, LANTERN_GPU_LOCK_DIR=str(tmp_path / "locks"))


def test_gpu_run_gives_free_devices_and_waits(tmp_path):
    e = gpu_env(tmp_path, "0,1")
    release = tmp_path / "release"
    # holders keep their device until the test says so: no sleep that a slow machine could outlast
    hold = [sys.executable, str(GPU_RUN), "sh", "-c",
            f"echo $CUDA_VISIBLE_DEVICES; while [ ! -e {release} ]; do sleep 0.05; done"]
    first = subprocess.Popen(hold, env=e, stdout=subprocess.PIPE, text=True)
    second = subprocess.Popen(hold, env=e, stdout=subprocess.PIPE, text=True)
    third = None
    try:
        got = {first.stdout.readline().strip(), second.stdout.readline().strip()}
        assert got == {"0", "1"}
        third = subprocess.Popen([sys.executable, str(GPU_RUN), "sh", "-c", "echo $CUDA_VISIBLE_DEVICES"],
                                 env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert "busy, waiting" in third.stderr.readline()  # both devices are held: it waits
        release.touch()
        out, _ = third.communicate(timeout=RUN_TIMEOUT)
        assert out.strip() in {"0", "1"} and third.returncode == 0
    finally:
        release.touch()
        for p in (first, second, third):
            if p is not None:
                p.wait(timeout=RUN_TIMEOUT)


def test_gpu_run_passes_through_without_pool_or_under_slurm(tmp_path):
    echo = [sys.executable, str(GPU_RUN), "sh", "-c", "echo ${CUDA_VISIBLE_DEVICES-unset}"]
    r = subprocess.run(echo, env=gpu_env(tmp_path, ""), capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert r.stdout.strip() == "unset"  # empty pool = CPU machine: CUDA_VISIBLE_DEVICES untouched
    r = subprocess.run(echo, env=dict(gpu_env(tmp_path, "0,1"), SLURM_JOB_ID="7", CUDA_VISIBLE_DEVICES="3"),
                       capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert r.stdout.strip() == "3"  # SLURM's assignment stands


@pytest.mark.parametrize("slurm_job", [None, "7"], ids=["local", "salloc"])
def test_gpu_run_locks_within_cuda_visible_devices(tmp_path, slurm_job):
    """CUDA_VISIBLE_DEVICES="3,5" (a SLURM allocation of two GPUs, or a user's choice): each command gets one of
    them, never a device outside them (LANTERN_GPUS is this machine's list, not the allocation's, under SLURM)."""
    e = gpu_env(tmp_path, "0,1") if slurm_job else gpu_env(tmp_path, "")
    if slurm_job:
        e["SLURM_JOB_ID"] = slurm_job
    else:
        e.pop("LANTERN_GPUS")
    e = dict(e, CUDA_VISIBLE_DEVICES="3,5", CUDA_DEVICE_ORDER="FASTEST_FIRST")
    release = tmp_path / "release"
    hold = [sys.executable, str(GPU_RUN), "sh", "-c", "echo $CUDA_VISIBLE_DEVICES $CUDA_DEVICE_ORDER "
            f"$LANTERN_GPU_RUN_DEVICE; while [ ! -e {release} ]; do sleep 0.05; done"]
    holders = [subprocess.Popen(hold, env=e, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        got = sorted(p.stdout.readline().split() for p in holders)
        assert got == [["3", "PCI_BUS_ID", "3"], ["5", "PCI_BUS_ID", "5"]]
    finally:
        release.touch()
        for p in holders:
            p.wait(timeout=RUN_TIMEOUT)


def test_gpu_run_lock_folder_is_per_slurm_job(monkeypatch):
    from lantern.pipeline import gpu_run

    monkeypatch.delenv("LANTERN_GPU_LOCK_DIR", raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    in_job = gpu_run.lock_dir()
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert in_job.endswith("-slurm41") and gpu_run.lock_dir().endswith("-slurm42")
    monkeypatch.delenv("SLURM_JOB_ID")
    assert "slurm" not in gpu_run.lock_dir()


def test_cuda_index_under_gpu_run_means_its_device(monkeypatch, capsys):
    """device: cuda:2 in a job to which lantern-gpu-run left one visible GPU: that GPU, said in the log; without
    gpu_run a missing index is still an error."""
    import torch

    from lantern.engine.models.checkpoint import parse_device
    from lantern.errors import UserError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.delenv("LANTERN_GPU_RUN_DEVICE", raising=False)
    with pytest.raises(UserError, match="does not exist"):
        parse_device("cuda:2")
    monkeypatch.setenv("LANTERN_GPU_RUN_DEVICE", "5")
    assert parse_device("cuda:2") == torch.device("cuda", 0)
    assert "gave this job GPU 5" in capsys.readouterr().err
    assert parse_device("cuda:0") == torch.device("cuda", 0) and parse_device("cuda") == torch.device("cuda")


def hold_intervals(workdir: Path) -> list[tuple[float, float, str]]:
    out = []
    for log in (workdir / "logs" / "gpu").glob("*.log"):
        text = log.read_text()
        start = re.search(r"start (\S+) dev=(\S+)", text)
        end = re.search(r"end (\S+)", text)
        out.append((float(start[1]), float(end[1]), start[2]))
    return out


def test_local_gpu_profile_spreads_jobs_over_devices(tmp_path):
    wd = tmp_path / "wd"
    cmd = snakemake_cmd("--profile", str(LOCAL_GPU_PROFILE), "--cores", "2", "--resources", "gpu=2",
                        *WORKFLOWS["mini"], "--directory", str(wd))
    r = subprocess.run(cmd, cwd=REPO, env=gpu_env(tmp_path, "0,1"), capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert r.returncode == 0, r.stderr[-3000:]
    held = hold_intervals(wd)
    assert len(held) == 5 and {dev for _, _, dev in held} == {"0", "1"}
    overlapping = [(a, b) for i, a in enumerate(held) for b in held[i + 1:] if a[0] < b[1] and b[0] < a[1]]
    assert overlapping, "two GPU jobs should have run at once"
    assert all(a[2] != b[2] for a, b in overlapping), held


# --- the real SLURM run -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("the local SLURM test cluster needs root (apt-get, daemons as root)")
    # One test cluster per machine: a second test session waits here instead of failing to bind the ports.
    with open("/tmp/lantern-slurm-test.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if cluster.conf_is_foreign():
            pytest.skip(f"{cluster.SLURM_CONF} belongs to another SLURM installation; not touching it")
        c = cluster.start(tmp_path_factory.mktemp("cluster"))
        try:
            yield c
        finally:
            cluster.stop(c)


def scaled_profile(dst: Path) -> Path:
    """The real SLURM profile with its sizes cut to this 2-CPU, fake-GPU node: same keys, same rules."""
    p = load(SLURM_PROFILE)
    for res in [p["default-resources"], *p["set-resources"].values()]:
        for name, small in (("cpus_per_gpu", 1), ("cpus_per_task", 1), ("mem_mb", 1000)):
            if name in res:
                res[name] = small
        if "gpu" in res:
            res["gpu"] = min(res["gpu"], cluster.FAKE_GPUS)
        if "slurm_partition" in res:
            res["slurm_partition"] = cluster.PARTITION
        res.pop("slurm_account", None)  # account checks need slurmdbd
    # Poll a test cluster often; one thread per job keeps both runs' numerics identical (see local run).
    p.update({"slurm-init-seconds-before-status-checks": 2, "seconds-between-status-checks": 2,
              "max-threads": 1})
    dst.mkdir(parents=True)
    (dst / "config.yaml").write_text(yaml.safe_dump(p, sort_keys=False))
    return dst


def requested(profile: dict, rule: str, attempt: int = 1) -> dict:
    res = {**profile["default-resources"], **profile["set-resources"].get(rule, {})}
    return {k: profile_check.evaluate(v, attempt) for k, v in res.items()}


def scontrol_job(job_id: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], check=True, capture_output=True,
                         text=True).stdout
    return dict(re.findall(r"(?:^| )([\w/:]+)=(\S*)", out))


def minutes(limit: str) -> int:
    days, _, hms = limit.rpartition("-")
    h, m, s = (int(x) for x in hms.split(":"))
    return int(days or 0) * 1440 + h * 60 + m + (s > 0)


def submitted_jobs(log: Path) -> list[tuple[str, Path]]:
    return [(jid, Path(path)) for jid, path in SUBMITTED.findall(log.read_text())]


def check_job(job: dict[str, str], want: dict, tag: str) -> None:
    assert job["Partition"] == cluster.PARTITION, tag
    assert minutes(job["TimeLimit"]) == want["runtime"], (tag, job["TimeLimit"], want)
    assert job["MinMemoryNode"] == f"{want['mem_mb']}M", (tag, job["MinMemoryNode"], want)
    if want.get("gpu"):
        assert job.get("TresPerJob") == f"gres:gpu:{want['gpu']}", (tag, job.get("TresPerJob"))
        assert job.get("CpusPerTres") == f"gres:gpu:{want['cpus_per_gpu']}", (tag, job.get("CpusPerTres"))
    else:
        assert "gpu" not in job.get("TresPerJob", ""), tag


@pytest.mark.slurm
@pytest.mark.slow
def test_slurm_run_matches_local_run(slurm, smoke_run, tmp_path, rules):
    # A broken profile (misspelt resource or rule) fails here, before any job is submitted.
    assert profile_check.check_profile(SLURM_PROFILE, rules) == []
    profile = scaled_profile(tmp_path / "profile")
    assert profile_check.check_profile(profile, rules) == []
    slurm_wd, slurm_log = tmp_path / "slurm", tmp_path / "slurm.log"
    t0 = time.monotonic()
    r = run(snakemake_cmd("--profile", str(profile), *WORKFLOWS["smoke"], "--directory", str(slurm_wd)), slurm_log)
    wall = time.monotonic() - t0
    assert r.returncode == 0, tail(slurm_log)

    # Every non-local job went through sbatch and completed on the cluster, with the profile's requests.
    log_text = slurm_log.read_text()
    ran = RULE_LINE.findall(log_text)
    cluster_rules = sorted(name for local_, name in ran if not local_)
    jobs = submitted_jobs(slurm_log)
    assert len(jobs) == len(cluster_rules) > 0, (jobs, cluster_rules)
    scaled = load(profile)
    rows = []
    for jid, slurm_logfile in jobs:
        job = scontrol_job(jid)
        rule = re.fullmatch(r"rule_(\w+?)(?:_wildcards_.*)?", job["Comment"])[1]
        assert job["JobState"] == "COMPLETED" and job["ExitCode"] == "0:0", (jid, job["JobState"])
        check_job(job, requested(scaled, rule), f"job {jid} ({rule})")
        # Logs land in the profile's predictable folder, and successful ones are kept.
        assert slurm_logfile.is_file() and slurm_logfile.is_relative_to(slurm_wd / scaled["slurm-logdir"])
        rows.append((jid, job["Comment"], job["SubmitTime"], job["StartTime"], job["EndTime"]))
    submitted_rules = sorted(re.fullmatch(r"rule_(\w+?)(?:_wildcards_.*)?", c)[1] for _, c, *_ in rows)
    assert submitted_rules == cluster_rules
    assert set(GPU_RULES) <= set(submitted_rules), "a GPU rule did not run: its GPU request went untested"
    for rule in LOCAL_RULES:
        assert rule not in submitted_rules and ("local", rule) in ran, f"{rule} must run as a localrule"

    # The same results as the local run: the same files, and the deterministic ones byte for byte (stats,
    # tables and speed figures hold wall-clock times, which no two runs share).
    out = slurm_wd / SMOKE_OUT
    assert result_files(out) == smoke_run.files
    slurm_h = result_hashes(out)
    differ = sorted(k for k in smoke_run.hashes.keys() | slurm_h.keys() if smoke_run.hashes.get(k) != slurm_h.get(k))
    assert not differ, f"results differ between the local and the SLURM run: {differ}"
    # ... at one thread count on both sides: smoke.yaml's `threads: 1`, recorded by the trainers beside their models
    for side in (smoke_run.out, out):
        counts = {json.loads(p.read_text())["threads"] for name in ("vq", "target")
                  for p in side.glob(f"toy/*/models/{name}.json")}
        assert counts == {1}, (side, counts)

    report = tmp_path / "slurm_jobs.tsv"
    report.write_text("jobid\tcomment\tsubmit\tstart\tend\n" + "".join("\t".join(r) + "\n" for r in rows))
    print(f"\nSLURM run of the smoke DAG: {len(rows)} sbatch jobs, {wall:.0f} s wall "
          f"(local run: {smoke_run.wall_s:.0f} s); {report}")
    for row in rows:
        print("  " + "  ".join(row))


@pytest.mark.slurm
@pytest.mark.slow
def test_slurm_retry_gets_more_time(slurm, tmp_path):
    """A job failing once is resubmitted by the profile's `retries`, with `runtime` grown by `attempt`."""
    profile = scaled_profile(tmp_path / "profile")
    log = tmp_path / "flaky.log"
    r = run(snakemake_cmd("--profile", str(profile), *WORKFLOWS["mini"], "--directory", str(tmp_path / "wd"),
                          "results/flaky.txt"), log)
    assert r.returncode == 0, tail(log)
    jobs = [scontrol_job(jid) for jid, _ in submitted_jobs(log)]
    assert [(j["JobState"], j["ExitCode"] == "0:0") for j in jobs] == [("FAILED", False), ("COMPLETED", True)]
    scaled = load(profile)
    for attempt, job in enumerate(jobs, start=1):
        check_job(job, requested(scaled, "flaky", attempt), f"flaky attempt {attempt}")
    assert minutes(jobs[1]["TimeLimit"]) > minutes(jobs[0]["TimeLimit"])


# --- thread counts: two runs of one config compute alike wherever they run ------------------------------------------

TORCH_JOBS = ("ambiguity", "evaluate", "proximity", "sample", "tokenize", "train-gpt", "train-vq")  # take --threads
TORCH_PARAMS_JOBS = ("train-clip", "train-drafter")  # take "threads" in --params


def planned_threads(tmp_path: Path, *args: str) -> dict[str, set[int]]:
    """The torch thread counts `snakemake -n -p` plans for every job of the smoke DAG, by command."""
    r = subprocess.run(snakemake_cmd("-n", "-p", "--forceall", *WORKFLOWS["smoke"], "--directory", str(tmp_path / "wd"),
                                     *args), cwd=REPO, env=env(), capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert r.returncode == 0, r.stderr[-3000:]
    found: dict[str, set[int]] = {}
    for command, rest in re.findall(r"\blantern ([a-z-]+) (.*)", r.stdout):
        n = re.search(r'--threads (\d+)|\\?"threads\\?": (\d+)', rest)
        found.setdefault(command, set()).add(int(n[1] or n[2]) if n else None)
    return found


def test_every_torch_job_runs_the_configured_thread_count(tmp_path):
    """config.threads fixes torch's thread count in every job that computes with torch (smoke.yaml: 1), whatever
    the cores or a profile's max-threads give the rule: CPU kernels round differently at another count, so a local
    run on 2 cores and a SLURM run on 1 core per job train the same models only at one fixed count."""
    for cores, extra in (("2", ()), ("1", ("--max-threads", "1"))):
        found = planned_threads(tmp_path, "--cores", cores, *extra)
        assert set(TORCH_JOBS + TORCH_PARAMS_JOBS) <= set(found), sorted(found)
        for command in TORCH_JOBS + TORCH_PARAMS_JOBS:
            assert found[command] == {1}, (command, found[command], cores)
    # threads: 0 leaves each job its rule's `threads` (train-gpt: 2 on two cores), still passed explicitly
    found = planned_threads(tmp_path, "--cores", "2", "--config", "threads=0")
    assert found["train-gpt"] == {2} and found["train-vq"] == {1}
    assert all(None not in found[c] for c in TORCH_JOBS + TORCH_PARAMS_JOBS)
