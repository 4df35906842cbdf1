"""benchmarks/bench_rule_cost.py runs (tiny vocabulary) and prints a row per rule, k and batch."""
import pytest

from conftest import benchmark_script

bench = benchmark_script("bench_rule_cost")


def test_prints_every_rule(capsys):
    assert bench.main(["--vocab", "64", "--ks", "4", "8", "--batch", "1", "3", "--repeats", "2"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert len(rows) == 2 * 5
    assert {" ".join(r[:2]) for r in rows} >= {"lantern k8", "lanternpp k4", "exact 1"}


def test_a_k_past_the_vocabulary_is_refused(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--vocab", "16", "--ks", "15"])
    assert "--ks must stay below" in capsys.readouterr().err
