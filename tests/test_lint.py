"""`snakemake --lint` finds nothing in the workflow (issue #29, item 7): functions live in common.smk and rules pass
values to their shell commands through params:, so every job's provenance covers them."""
import subprocess
import sys

from conftest import REPO, snakemake_env


def test_snakemake_lint_is_clean():
    r = subprocess.run([sys.executable, "-m", "snakemake", "--lint"], cwd=REPO, env=snakemake_env(),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "Lints for" not in r.stdout + r.stderr
