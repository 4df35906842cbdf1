"""Shared fixtures: one local run of the smoke DAG per test session (tests/test_dag.py and tests/test_slurm.py
compare against it)."""
import hashlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SMOKE_CONFIG = REPO / "config" / "smoke.yaml"
SMOKE_OUT = "results/smoke"  # config/smoke.yaml's outdir, relative to the working directory
# Outputs that are a pure function of config and seed (no wall-clock numbers in them): two runs of the smoke
# DAG, wherever they run, must agree on these byte for byte. Paths are relative to the outdir.
DETERMINISTIC = ("toy/*/data/*.pt", "toy/*/models/*.pt", "toy/*/ambiguity*.csv", "neighbours/*.pt",
                 "gen/*/*/shard*/images/*.png", "metrics/*/*.json")


def benchmark_script(name: str):
    """benchmarks/<name>.py imported as a module (the scripts are not a package, so their folder joins sys.path
    for the import only)."""
    import importlib

    folder = str(REPO / "benchmarks")
    sys.path.insert(0, folder)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(folder)


def snakemake_env() -> dict[str, str]:
    # Rules call the interpreter running Snakemake; PATH also gets the venv's console scripts.
    return dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")


def smoke_cmd(workdir: Path, *args: str, targets: tuple[str, ...] = (), overlay: dict | None = None) -> list[str]:
    """The smoke DAG in `workdir`; `overlay` (nested keys) is merged over config/smoke.yaml from a file beside
    `workdir` (--config would turn nested numbers into strings)."""
    configs = [str(SMOKE_CONFIG)]
    if overlay:
        path = workdir.parent / f"{workdir.name}.overlay.yaml"
        path.write_text(yaml.safe_dump(overlay))
        configs.append(str(path))
    return [sys.executable, "-m", "snakemake", "--workflow-profile", "none", "--snakefile", str(REPO / "Snakefile"),
            "--directory", str(workdir), *args, *targets, "--configfile", *configs]


def run_logged(cmd: list[str], log: Path, timeout: float = 3600) -> subprocess.CompletedProcess:
    with open(log, "w") as out:
        return subprocess.run(cmd, cwd=REPO, env=snakemake_env(), stdout=out, stderr=subprocess.STDOUT,
                              timeout=timeout)


def tail(path: Path, n: int = 60) -> str:
    return "\n".join(path.read_text().splitlines()[-n:])


def result_hashes(out: Path, globs=DETERMINISTIC) -> dict[str, str]:
    return {str(f.relative_to(out)): hashlib.sha256(f.read_bytes()).hexdigest()
            for g in globs for f in sorted(out.glob(g)) if f.is_file()}


def result_files(out: Path) -> set[str]:
    """Every result file (logs and benchmarks aside), deterministic or not."""
    skip = ("logs", "benchmarks")
    return {str(f.relative_to(out)) for f in out.rglob("*") if f.is_file() and f.relative_to(out).parts[0] not in skip}


@dataclass(frozen=True)
class SmokeRun:
    workdir: Path
    out: Path
    log: Path
    wall_s: float
    hashes: dict[str, str]  # DETERMINISTIC outputs right after the run, before any test touched them
    files: frozenset[str]


# test files that share the smoke run (a session fixture) and the local SLURM cluster: one xdist worker for all
SMOKE_FILES = {"test_dag.py", "test_slurm.py", "test_gpu_check.py"}


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """`make test`'s pytest-xdist schedule: a test file's tests on one worker (its module fixtures are built once),
    and the files that share the smoke run on the same one, which builds it once and runs them in file order. A
    scheduler rather than xdist_group marks: --dist loadgroup reads marks through a test id that pytest 9 no longer
    lets a plugin rewrite."""
    from xdist.scheduler import LoadFileScheduling

    class SmokeTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return "smoke" if Path(scope).name in SMOKE_FILES else scope

    return SmokeTogether(config, log)


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory) -> SmokeRun:
    """The whole smoke DAG (toy training included), run locally on 2 cores, once per session.

    LANTERN_SMOKE_WORKDIR=<folder of an earlier session's smoke run> reuses that run (while iterating on tests)."""
    reuse = os.environ.get("LANTERN_SMOKE_WORKDIR")
    if reuse:
        out = Path(reuse) / SMOKE_OUT
        return SmokeRun(Path(reuse), out, Path(reuse).parent / "smoke_local.log", 0.0, result_hashes(out),
                        frozenset(result_files(out)))
    wd = tmp_path_factory.mktemp("smoke")
    log = wd.parent / "smoke_local.log"
    t0 = time.monotonic()
    r = run_logged(smoke_cmd(wd, "--cores", "2"), log)
    wall = time.monotonic() - t0
    assert r.returncode == 0, tail(log)
    out = wd / SMOKE_OUT
    print(f"\nsmoke DAG, local, 2 cores: {wall:.0f} s")
    return SmokeRun(wd, out, log, wall, result_hashes(out), frozenset(result_files(out)))
