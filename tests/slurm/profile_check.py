"""Static checks of a Snakemake profile: the mistakes Snakemake itself accepts silently.

Snakemake rejects an unknown top-level key (`unrecognized arguments`), but a misspelt resource name
(`gpus: 1`), rule name (`generat:`) or a non-integer count is passed along and ignored, and the jobs then run
with the wrong request. This module catches those:

    python tests/slurm/profile_check.py workflow/profiles/slurm [SNAKEMAKE_ARGS...]   # e.g. --snakefile Snakefile

Resource names are checked against Snakemake's standard resources plus every name the installed SLURM executor
plugin reads (found in its source), plus the names a profile declares under `resources:` (global limits such
as `gpu` in the local-GPU profile). Rule names are checked against `snakemake --list-rules`.
"""
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import yaml

SNAKEMAKE_RESOURCES = {"mem", "mem_mb", "mem_mib", "disk", "disk_mb", "disk_mib", "runtime", "tmpdir"}
PLUGINS = ("snakemake_executor_plugin_slurm", "snakemake_executor_plugin_slurm_jobstep")
# Resources that SLURM takes as counts: sbatch rejects (or the plugin refuses) anything but a positive int.
COUNTS = {"gpu", "cpus_per_gpu", "cpus_per_task", "tasks", "tasks_per_gpu", "tasks_per_node", "nodes",
          "mem_mb", "mem_mb_per_cpu", "runtime"}
ATTEMPTS = (1, 2, 3)


def plugin_resources() -> set[str]:
    names = set()
    for mod in PLUGINS:
        for f in Path(importlib.util.find_spec(mod).origin).parent.glob("*.py"):
            src = f.read_text()
            names |= set(re.findall(r"resources\.get\(\s*[\"'](\w+)[\"']", src))
            names |= set(re.findall(r"resources\.(\w+)\b(?!\()", src))
    names.discard("threads")  # job.resources.threads is Snakemake's `threads`, set with set-threads
    return names


def snakemake_options() -> set[str]:
    from snakemake.cli import get_argument_parser

    return {s[2:] for a in get_argument_parser()._actions for s in a.option_strings if s.startswith("--")}


def workflow_rules(snakemake_args: list[str]) -> set[str]:
    r = subprocess.run([sys.executable, "-m", "snakemake", "--list-rules", "--workflow-profile", "none",
                        *snakemake_args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"snakemake --list-rules failed:\n{r.stderr[-3000:]}")
    return {line.strip() for line in r.stdout.splitlines() if line.strip()}


def evaluate(value, attempt: int):
    """A resource value as Snakemake evaluates it: a number, or a string holding a Python expression."""
    if not isinstance(value, str):
        return value
    try:
        return eval(value, {"__builtins__": {"min": min, "max": max}}, {"attempt": attempt})
    except (NameError, SyntaxError):
        return value  # a plain string such as a partition name


def check_resources(where: str, resources: dict, known: set[str]) -> list[str]:
    problems = []
    for name, value in resources.items():
        if name not in known:
            problems.append(f"{where}: unknown resource {name!r} (known: {', '.join(sorted(known))})")
        elif name in COUNTS:
            for attempt in ATTEMPTS:
                v = evaluate(value, attempt)
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    problems.append(f"{where}: {name}={value!r} is {v!r} at attempt {attempt}, "
                                    "not a positive integer")
                    break
    return problems


def check_profile(profile_dir: Path, rules: set[str]) -> list[str]:
    """Problems found in profile_dir/config.yaml, each one line; empty when the profile is sound."""
    profile = yaml.safe_load((Path(profile_dir) / "config.yaml").read_text())
    problems = [f"unknown option {key!r}" for key in profile if key not in snakemake_options()]
    known = SNAKEMAKE_RESOURCES | plugin_resources() | set(profile.get("resources") or {})
    problems += check_resources("default-resources", profile.get("default-resources") or {}, known)
    for section in ("set-resources", "set-threads"):
        for rule, value in (profile.get(section) or {}).items():
            if rule not in rules:
                problems.append(f"{section}: unknown rule {rule!r} (rules: {', '.join(sorted(rules))})")
            if section == "set-resources":
                problems += check_resources(f"set-resources.{rule}", value or {}, known)
    return problems


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit("usage: profile_check.py PROFILE_DIR [SNAKEMAKE_ARGS...]")
    problems = check_profile(Path(argv[0]), workflow_rules(argv[1:]))
    for p in problems:
        print(f"error: {p}")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main(sys.argv[1:])
