"""benchmarks/profile_round.py: its --smoke run (toy sizes on the CPU) times plain AR and a decoder's round, splits
the round into the decoder's timer sections and writes the report, so the script still runs the day a GPU appears."""
from conftest import benchmark_script


def test_smoke_report_splits_a_round(tmp_path):
    out = tmp_path / "p.txt"
    assert benchmark_script("profile_round").main(["--smoke", "--spec", "chain-lantern", "--ops", "--top", "5", "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("tiny (--smoke), chain-lantern, batch 1, 16 tokens, CFG 2, cpu float32, eager")
    assert "ms per round over" in text and "tokens of plain AR" in text
    assert "timer sections per round: draft" in text and "Self CPU time total" in text
    assert "host syncs" not in text  # CUDA's sync debug mode only


def test_without_ops_there_is_no_operator_table(tmp_path):
    out = tmp_path / "p.txt"
    assert benchmark_script("profile_round").main(["--smoke", "--out", str(out)]) == 0
    assert "Self CPU" not in out.read_text() and len(out.read_text().splitlines()) == 3


def test_feature_layers_reach_the_drafter(tmp_path):
    out = tmp_path / "p.txt"
    assert benchmark_script("profile_round").main(["--smoke", "--feature-layers", "0", "--out", str(out)]) == 0
    assert out.read_text().splitlines()[0].endswith("drafter fuses target layers [0]")
