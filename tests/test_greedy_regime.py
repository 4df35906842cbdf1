"""benchmarks/greedy_regime.py on the shipped toy world at a tiny size: its CSV has every column and group, the
numbers lie in their ranges, and greedy paths are what greedy decoding makes (every token the target's argmax,
one image per class) while sampled paths are not."""
import math

import pandas as pd
import pytest
import torch

from conftest import REPO, benchmark_script

WORLD = REPO / "models" / "toy" / "default"
IMAGES = 6  # one image per class of the 6-class toy world


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    bench = benchmark_script("greedy_regime")
    out = tmp_path_factory.mktemp("greedy_regime") / "regime.csv"
    threads = torch.get_num_threads()
    try:
        assert bench.main(["--world", str(WORLD), "--images", str(IMAGES), "--cfgs", "2", "--batch", "6",
                           "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    return bench, pd.read_csv(out, keep_default_na=False, na_values=[""])


def test_columns_and_groups(table):
    bench, df = table
    assert tuple(df.columns) == bench.COLUMNS
    assert set(df["mode"]) == {"greedy", "sampling"} and set(df.cfg_scale) == {2.0}
    groups = ["all", *(f"row {r}" for r in range(8)),
              *(f"margin [{lo:g}, {hi:g})" for lo, hi in zip(bench.MARGIN_BINS, bench.MARGIN_BINS[1:]))]
    for mode in ("greedy", "sampling"):
        part = df[df["mode"] == mode].set_index("group")
        assert list(part.index) == groups
        # positions 1..63 of every image: row 0 lacks the first token (the drafter predicts from token 1 on)
        assert part.positions["all"] == IMAGES * 63
        assert [part.positions[f"row {r}"] for r in range(8)] == [IMAGES * 7] + [IMAGES * 8] * 7
        assert sum(part.positions[g] for g in groups if g.startswith("margin")) == IMAGES * 63


def test_numbers_in_range(table):
    _, df = table
    for col in ("ties", "agree", "second", "on_argmax", "overlap", "lantern_accept"):
        assert df[col].between(0, 1).all(), col
    assert (df.top1 > 0).all() and (df.top1 <= 1).all()
    assert (df.margin >= 0).all() and (df.margin <= df.top1).all()
    assert (df.q_top > 0).all() and (df.q_top <= 1).all()
    assert (df.agree + df.second <= 1 + 1e-9).all()  # the drafter's argmax is one code
    whole = df[df.group == "all"].set_index("mode")
    assert whole.tau_exact_chain.between(1, 3).all()  # gamma 2: at most 2 drafts and the bonus token per forward
    assert whole.tau_lantern.between(1, 5).all()  # gamma 4
    # LANTERN only adds acceptance: greedy, the argmax stays accepted; sampling, p + borrowed mass >= p
    greedy, sampled = df[df["mode"] == "greedy"], df[df["mode"] == "sampling"]
    assert (greedy.lantern_accept >= greedy.agree - 1e-9).all()
    assert (sampled.lantern_accept >= sampled.overlap - 1e-6).all()
    assert whole.lantern_accept["greedy"] > whole.agree["greedy"]  # near-ties are what it relaxes
    assert whole.class_accuracy.between(0, 1).all() and whole.codes_per_image.between(1, 64).all()
    assert whole.top3_share.between(3 / 64, 1).all() and whole.code_entropy.between(0, math.log(64)).all()
    per_row = df[df.group != "all"]
    assert per_row.images.isna().all() and per_row.tau_exact_chain.isna().all() and per_row.tau_lantern.isna().all()


def test_greedy_paths_are_greedy(table):
    _, df = table
    whole = df[df.group == "all"].set_index("mode")
    # teacher-forced, every greedy token is the target's argmax; a sampled path leaves it most of the time
    assert whole.on_argmax["greedy"] > 0.99, whole.on_argmax["greedy"]
    assert whole.on_argmax["sampling"] < 0.5, whole.on_argmax["sampling"]
    assert whole.distinct_images["greedy"] == IMAGES  # one label each: six different argmax paths
    assert whole.images["greedy"] == IMAGES
