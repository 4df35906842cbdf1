"""Speed statistics from `lantern sample` stats tables: tau with the bonus token, latency, throughput, speed-ups."""

import math

import numpy as np
import pandas as pd
import pytest

from lantern.errors import UserError
from lantern.metrics import speed


def stats(method, mode, times, n_tokens=64, forwards=64, drafter=0, **extra):
    rows = [dict(image_index=i, seed=i, label=i % 16, method=method, mode=mode, n_tokens=n_tokens,
                 target_forwards=forwards, drafter_forwards=drafter, steps=forwards, accepted_total=n_tokens - forwards,
                 tau=n_tokens / forwards, time_total_s=t, time_draft_s=0.0, time_verify_s=t, time_other_s=0.0,
                 peak_mem_bytes=float("nan"), **{"batch_size": 1, **extra})
            for i, t in enumerate(times)]
    return pd.DataFrame(rows)


def test_summary_counts_bonus_token_and_times():
    # 64 tokens in 16 target forwards: tau = 4 (each forward's bonus token included)
    row = speed.summarize(stats("lantern", "greedy", [0.1, 0.3], forwards=16, drafter=48))
    assert row["tau_incl_bonus"] == pytest.approx(4.0)
    assert row["target_forwards_per_image"] == 16 and row["drafter_forwards_per_image"] == 48
    assert row["latency_s_per_image"] == pytest.approx(0.2)
    assert row["throughput_images_per_s"] == pytest.approx(5.0)
    assert row["throughput_tokens_per_s"] == pytest.approx(320.0)
    assert math.isnan(row["peak_mem_mib"]) and math.isnan(row["speedup_vs_in_job_vanilla"])


def test_pooled_tau_weights_images_by_forwards():
    df = pd.concat([stats("x", "greedy", [1.0], forwards=64), stats("x", "greedy", [1.0], forwards=16)])
    # 128 tokens / 80 forwards, not the mean of the per-image taus (1 and 4)
    assert speed.summarize(df)["tau_incl_bonus"] == pytest.approx(128 / 80)


def test_missing_optional_columns_are_nan_not_errors():
    df = pd.DataFrame({"method": ["vanilla"] * 3, "time_total_s": [0.5, 0.5, 0.5]})
    row = speed.summarize(df)
    assert row["latency_s_per_image"] == 0.5
    assert math.isnan(row["tau_incl_bonus"]) and math.isnan(row["drafter_forwards_per_image"])
    assert row["device"] == ""


def test_speedup_against_vanilla_of_same_mode_and_in_job_reference(tmp_path):
    paths = []
    tables = [stats("vanilla", "greedy", [0.4, 0.4]), stats("vanilla", "sampling", [0.6, 0.6]),
              stats("lantern", "greedy", [0.1, 0.1], forwards=16, vanilla_time_total_s=0.3),
              stats("lantern", "sampling", [0.3, 0.3], forwards=32)]
    for k, df in enumerate(tables):
        paths.append(tmp_path / f"s{k}.csv")
        df.to_csv(paths[-1], index=False)
    out = tmp_path / "speed.csv"
    speed.main(["--stats", *map(str, paths), "--out", str(out)])
    t = pd.read_csv(out).set_index(["method", "mode"])
    assert t.loc[("lantern", "greedy"), "speedup_vs_vanilla"] == pytest.approx(4.0)
    assert t.loc[("lantern", "sampling"), "speedup_vs_vanilla"] == pytest.approx(2.0)
    assert t.loc[("vanilla", "greedy"), "speedup_vs_vanilla"] == pytest.approx(1.0)
    assert t.loc[("lantern", "greedy"), "speedup_vs_in_job_vanilla"] == pytest.approx(3.0)
    assert "tau_incl_bonus" in t.columns


def test_shards_of_one_point_merge_and_vanilla_controls_average():
    df = pd.concat([stats("vanilla", "greedy", [0.2]), stats("vanilla", "greedy", [0.4]),
                    stats("lantern", "greedy", [0.1, 0.2])])
    t = speed.add_speedups(speed.summarize_points(df, ["method", "mode"]), "vanilla", ["mode"])
    assert len(t) == 2
    assert t.set_index("method").loc["lantern", "speedup_vs_vanilla"] == pytest.approx(0.3 / 0.15)


def test_bad_inputs_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        speed.read_stats([tmp_path / "nope.csv"])
    bad = tmp_path / "bad.csv"
    pd.DataFrame({"x": [1]}).to_csv(bad, index=False)
    with pytest.raises(UserError, match="lacks column"):
        speed.read_stats([bad])
    with pytest.raises(UserError, match="unknown key bogus"):
        speed.main(["--stats", str(bad), "--out", str(tmp_path / "o.csv"), "--params", "{bogus: 1}"])


def test_in_job_speedup_pairs_the_images_that_carry_a_reference():
    """--in-job-vanilla-every N times plain AR on some batches: the ratio is over those images only."""
    df = pd.DataFrame({"method": ["lantern"] * 4, "time_total_s": [0.1, 0.1, 0.5, 0.5],
                       speed.IN_JOB_REFERENCE: [0.3, 0.3, math.nan, math.nan]})
    assert speed.summarize(df)["speedup_vs_in_job_vanilla"] == pytest.approx(3.0)
    assert math.isnan(speed.in_job_speedup(df.assign(**{speed.IN_JOB_REFERENCE: math.nan})))


def test_images_decoded_alone_stay_out_of_the_batched_times():
    """Rows a batched job decoded alone (latency_s at batch 1) carry batch-1 times: the batched latency, throughput
    and in-job ratio leave them out, tau keeps them. Older jobs also decoded those images in their batches (batch
    B with latency_s): those rows count. A job of alone rows only reports their times."""
    batched = stats("exact", "sampling", [0.1, 0.1], forwards=32, batch_size=8).assign(
        **{speed.IN_JOB_REFERENCE: [0.2, 0.2]})
    alone = stats("exact", "sampling", [0.5, 0.5], forwards=16)
    alone = alone.assign(**{speed.ALONE: alone["time_total_s"], speed.ALONE_REFERENCE: [0.9, math.nan]})
    row = speed.summarize(pd.concat([alone, batched], ignore_index=True))
    assert row["n_images_timed"] == 2 and row["latency_s_per_image"] == pytest.approx(0.1)
    assert row["speedup_vs_in_job_vanilla"] == pytest.approx(2.0)
    assert row["tau_incl_bonus"] == pytest.approx(256 / 96)
    older = pd.concat([batched, batched.assign(**{speed.ALONE: 0.4})], ignore_index=True)
    assert not speed.decoded_alone(older).any() and speed.summarize(older)["n_images_timed"] == 4
    assert speed.summarize(alone)["latency_s_per_image"] == pytest.approx(0.5)


def test_speedup_se_is_zero_for_constant_times_and_nan_without_two_pairs():
    plain, method = np.full(16, 0.6), np.full(16, 0.4)
    assert speed.speedup_se(plain, method, paired=True) == 0.0
    assert speed.speedup_se(plain, method, paired=False) == pytest.approx(0.0, abs=1e-12)
    one = np.where(np.arange(16) == 3, 0.6, np.nan)
    assert math.isnan(speed.speedup_se(one, method, paired=False))


def test_speedup_se_matches_the_delta_method_for_independent_times():
    """mean(a) / mean(b) of independent samples: SE^2 ~ R^2 (var a / (n_a a^2) + var b / (n_b b^2)); plain AR timed
    on every other image (n_a = n / 2), the method on all of them."""
    rng = np.random.default_rng(1)
    n = 400
    method = rng.normal(0.5, 0.05, n)
    plain = np.where(np.arange(n) % 2 == 0, rng.normal(1.0, 0.1, n), np.nan)
    a, b = np.nanmean(plain), method.mean()
    delta = (a / b) * math.sqrt(np.nanvar(plain, ddof=1) / (n / 2 * a**2) + method.var(ddof=1) / (n * b**2))
    assert speed.speedup_se(plain, method, paired=False) == pytest.approx(delta, rel=0.15)


def test_speedup_se_lets_a_load_shared_by_the_pair_cancel():
    """A slowdown that hits an image's method and plain AR alike (here: plain AR always twice the method) leaves the
    paired ratio at exactly 2 in every resample; the same times as unpaired means spread."""
    method = np.random.default_rng(2).uniform(0.2, 1.0, 64)
    plain = np.where(np.arange(64) % 2 == 0, 2 * method, np.nan)
    assert speed.speedup_se(plain, method, paired=True) == pytest.approx(0.0, abs=1e-12)
    assert speed.speedup_se(plain, method, paired=False) > 0.05
    df = stats("x", "sampling", method).assign(**{speed.IN_JOB_REFERENCE: plain})
    row = speed.summarize(df)
    assert row["speedup_vs_in_job_vanilla"] == pytest.approx(2.0) and row["speedup_vs_in_job_vanilla_se"] < 1e-12
