"""Speed statistics from the per-image stats tables that `lantern sample` writes.

Conventions: tau_incl_bonus = tokens / target forwards over all images (the mean accepted length with the bonus
token counted; vanilla = 1). Latency is the per-image wall time the generator recorded (warm-up excluded, CUDA
synchronised; a batch's wall time is shared by its images), so throughput = images / summed latency. Speed-up =
vanilla latency / latency, against the vanilla rows of the same group (e.g. the same decoding mode) and, when the
table has a `vanilla_time_total_s` column (a vanilla reference timed in the same job, on all or some batches), against
that too, over the images that carry it.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from lantern.errors import UserError
from lantern.io import atomic_path, read_csv, read_structured
from lantern.params import params_from

REQUIRED = ("method", "time_total_s")
IN_JOB_REFERENCE = "vanilla_time_total_s"
# A batched job's images decoded alone (`lantern sample --latency-images`): their batch-1 time, and plain AR's alone
ALONE, ALONE_REFERENCE = "latency_s", "vanilla_latency_s"


@dataclass
class SpeedParams:
    baseline_method: str = "vanilla"  # value of the `method` column that speed-ups are measured against
    point_by: list[str] = field(default_factory=lambda: ["method", "mode"])  # columns naming one sweep point
    group_by: list[str] = field(default_factory=lambda: ["mode"])  # speed-up only within a group (same mode)


def read_stats(paths: list[str | os.PathLike]) -> pd.DataFrame:
    frames = []
    for path in paths:
        if not os.path.isfile(path):
            raise UserError(f"stats table {path} does not exist (written by `lantern sample` as stats.csv)")
        df = read_csv(path, "stats table", "regenerate it with `lantern sample`")
        missing = [c for c in REQUIRED if c not in df.columns]
        if missing:
            raise UserError(f"stats table {path} lacks column(s) {missing}; is it a `lantern sample` stats.csv?")
        frames.append(df.assign(stats_file=str(path)))
    return pd.concat(frames, ignore_index=True)


def decoded_alone(df: pd.DataFrame) -> pd.Series:
    """The rows of a batched job's images decoded alone for batch-1 latency (ALONE set, decoded at batch 1): the
    batched timings leave them out. A job before 2026-11-27 also decoded those images in its batches; its rows
    carry batch B and count as batched."""
    if ALONE not in df.columns or "batch_size" not in df.columns:
        return pd.Series(False, index=df.index)
    return df[ALONE].notna() & (df["batch_size"] == 1)


def _mean(df: pd.DataFrame, col: str) -> float:
    return float(df[col].mean()) if col in df.columns else math.nan


def in_job_speedup(df: pd.DataFrame) -> float:
    """Plain AR's mean time / the method's, over the images that carry both: the reference may be timed on every
    N-th batch only (`lantern sample --in-job-vanilla-every`), and its pairs are the method's same batches."""
    if IN_JOB_REFERENCE not in df.columns:
        return math.nan
    paired = df[IN_JOB_REFERENCE].notna()
    method_s = float(df.loc[paired, "time_total_s"].mean()) if paired.any() else math.nan
    return float(df.loc[paired, IN_JOB_REFERENCE].mean()) / method_s if method_s > 0 else math.nan


def in_job_speedup_se(df: pd.DataFrame) -> float:
    """in_job_speedup's standard error (speedup_se over the images that carry plain AR's time)."""
    if IN_JOB_REFERENCE not in df.columns:
        return math.nan
    return speedup_se(df[IN_JOB_REFERENCE].to_numpy(float), df["time_total_s"].to_numpy(float), paired=True)


def speedup_se(plain: np.ndarray, method: np.ndarray, paired: bool, draws: int = 2000, seed: int = 0) -> float:
    """Bootstrap standard error of an in-job speed-up, mean(plain) / mean(method), over the timed images: method [n]
    the method's per-image times, plain [n] plain AR's on the same images (NaN where it was not timed: one image or
    batch in N, `--in-job-vanilla-every`); paired: the method's mean over those images only (in_job_speedup), else
    over all n (the batch-1 speed-up). An image is resampled with its pair, so the load that slowed both cancels
    as it does in the ratio. The spread is the job's own: between days the machine moves speed-ups further
    (docs/decoders.md). NaN with fewer than two images timed by both."""
    means = resampled_means(plain, [method], paired, draws, seed)
    if means is None:
        return math.nan
    plain_mean, (method_mean,) = means
    return float(np.std(plain_mean / method_mean, ddof=1))


def resampled_means(plain: np.ndarray, columns: list[np.ndarray], paired: bool, draws: int = 2000, seed: int = 0
                    ) -> tuple[np.ndarray, list[np.ndarray]] | None:
    """The bootstrap draws behind speedup_se and round_cost_se: images resampled with their pairs, and per draw
    plain AR's mean over the drawn images that carry its time and each column's mean (paired: over those images
    only, else over every drawn image). None with fewer than two images carrying plain AR's time."""
    plain = np.asarray(plain, float)
    has = ~np.isnan(plain)
    if has.sum() < 2:
        return None
    idx = np.random.default_rng(seed).integers(0, len(plain), size=(draws, len(plain)))
    mask = has[idx]
    timed = mask.sum(1)
    keep = timed > 0  # a resample that drew no image with plain AR's time has no ratio
    plain_mean = np.where(mask, plain[idx], 0.0).sum(1)[keep] / timed[keep]
    means = []
    for column in columns:
        values = np.asarray(column, float)[idx]
        means.append((np.where(mask, values, 0.0).sum(1) / np.maximum(timed, 1) if paired else values.mean(1))[keep])
    return plain_mean, means


def round_cost(plain: np.ndarray, method: np.ndarray, forwards: np.ndarray, n_tokens: int, paired: bool) -> float:
    """What one round (one target forward, the prefill counted as tau counts it) of a method costs in plain-AR
    tokens: (the method's time / its target forwards) / (plain AR's time / its tokens), both in one job. Over the
    images a speed-up is taken on (paired as in speedup_se) it equals tau / speed-up, tau counted on those images.
    method and forwards [n] per image; plain [n] plain AR's times, NaN where not timed. NaN when none is."""
    plain, method, forwards = (np.asarray(a, float) for a in (plain, method, forwards))
    has = ~np.isnan(plain)
    if not has.any():
        return math.nan
    used = has if paired else np.ones_like(has)
    return float(method[used].mean() / forwards[used].mean() / (plain[has].mean() / n_tokens))


def round_cost_se(plain: np.ndarray, method: np.ndarray, forwards: np.ndarray, n_tokens: int, paired: bool,
                  draws: int = 2000, seed: int = 0) -> float:
    """round_cost's bootstrap standard error: the draws of speedup_se (same seed, the same resampled images), each
    draw's round cost from its own means, so that tau's spread over the images and the times' spread both count
    (an image with many rounds is also a slow one, and the two partly cancel in the ratio)."""
    means = resampled_means(plain, [method, forwards], paired, draws, seed)
    if means is None:
        return math.nan
    plain_mean, (method_mean, forwards_mean) = means
    return float(np.std(method_mean / forwards_mean / (plain_mean / n_tokens), ddof=1))


SECTIONS = ("draft", "verify", "other")  # the decoders' timer sections (engine/decoding/stats.py)


def round_anatomy(df: pd.DataFrame, time: str, reference: str | None, paired: bool, n_tokens: int,
                  sections: bool = True) -> dict:
    """A round of one group of images timed at one batch size, from their per-image stats: ms per round (per target
    forward, the prefill counted) in all and per timer section (`sections`: the rows carry them for this decode),
    plain AR's ms per token in the same job, and round_cost with its standard error. The images are those the
    in-job speed-up is taken on: with `paired`, the ones that carry plain AR's time (`reference`), else all.
    reference None: the group is plain AR itself, its own reference (a round of it is a token). At batch B a
    per-image time is the batch's wall time / B, so a round's ms is per image row, as plain AR's token is."""
    forwards, method = df["target_forwards"].to_numpy(float), df[time].to_numpy(float)
    plain = method if reference is None else (df[reference].to_numpy(float) if reference in df
                                               else np.full(len(df), np.nan))
    has = ~np.isnan(plain)
    used = has if paired and has.any() else np.ones(len(df), dtype=bool)
    per_round = lambda values: 1e3 * float(np.sum(values[used]) / forwards[used].sum())  # noqa: E731
    out = {"images": int(used.sum()), "rounds_per_image": float(forwards[used].mean()),
           **{f"{s}_ms": per_round(df[f"time_{s}_s"].to_numpy(float)) if sections else math.nan for s in SECTIONS},
           "round_ms": per_round(method),
           "ar_token_ms": 1e3 * float(plain[has].mean()) / n_tokens if has.any() else math.nan}
    out["round_cost_ar"] = round_cost(plain, method, forwards, n_tokens, paired)
    out["round_cost_ar_se"] = round_cost_se(plain, method, forwards, n_tokens, paired)
    return out


def summarize(df: pd.DataFrame) -> dict:
    """One sweep point's speed row from its per-image stats (all shards together)."""
    if df.empty:
        raise UserError("stats table has no rows")
    has = df.columns.__contains__
    if has("n_tokens") and has("target_forwards"):
        tau = float(df["n_tokens"].sum() / df["target_forwards"].sum())
    else:
        tau = _mean(df, "tau")
    alone = decoded_alone(df)
    df = df if alone.all() else df[~alone]  # times at the job's batch size; only batch-1 times when all are alone
    total_s = float(df["time_total_s"].sum())
    n = len(df)
    row = {
        "method": ",".join(sorted(map(str, df["method"].unique()))),
        "n_images_timed": n,
        "tau_incl_bonus": tau,
        "target_forwards_per_image": _mean(df, "target_forwards"),
        "drafter_forwards_per_image": _mean(df, "drafter_forwards"),
        "steps_per_image": _mean(df, "steps"),
        "latency_s_per_image": total_s / n,
        "latency_s_median": float(df["time_total_s"].median()),
        "time_draft_s_per_image": _mean(df, "time_draft_s"),
        "time_verify_s_per_image": _mean(df, "time_verify_s"),
        "time_other_s_per_image": _mean(df, "time_other_s"),
        "throughput_images_per_s": n / total_s if total_s > 0 else math.nan,
        "throughput_tokens_per_s": float(df["n_tokens"].sum()) / total_s if has("n_tokens") and total_s > 0
        else math.nan,
        "peak_mem_mib": float(df["peak_mem_bytes"].max()) / 2**20 if has("peak_mem_bytes") else math.nan,
        "device": ",".join(sorted(map(str, df["device"].dropna().unique()))) if has("device") else "",
        "speedup_vs_in_job_vanilla": in_job_speedup(df),
        "speedup_vs_in_job_vanilla_se": in_job_speedup_se(df),
    }
    for col in ("mode",):
        if has(col):
            row[col] = ",".join(sorted(map(str, df[col].unique())))
    return row


def summarize_points(df: pd.DataFrame, point_by: list[str]) -> pd.DataFrame:
    keys = [c for c in point_by if c in df.columns]
    if not keys:
        raise UserError(f"stats tables have none of the point_by columns {point_by}")
    rows = [{**dict(zip(keys, k if isinstance(k, tuple) else (k,))), **summarize(g)}
            for k, g in df.groupby(keys, sort=True, dropna=False)]
    return pd.DataFrame(rows)


def add_speedups(table: pd.DataFrame, baseline_method: str = "vanilla", group_by: list[str] = ()) -> pd.DataFrame:
    """speedup_vs_vanilla = mean latency of the baseline rows in the same group / the row's latency.
    Several baseline rows in one group (vanilla controls with different seeds) are averaged."""
    table = table.copy()
    keys = [c for c in group_by if c in table.columns]
    base = table[table["method"] == baseline_method]
    if keys:
        ref = base.groupby(keys, dropna=False)["latency_s_per_image"].mean().rename("_ref")
        table = table.join(ref, on=keys)
    else:
        table["_ref"] = base["latency_s_per_image"].mean() if len(base) else math.nan
    table["speedup_vs_vanilla"] = table["_ref"] / table["latency_s_per_image"]
    return table.drop(columns="_ref")


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="lantern speed", description="speed table (tau, forwards, latency, "
                                 "throughput, memory, speed-up vs vanilla) from `lantern sample` stats tables")
    ap.add_argument("--stats", nargs="+", required=True, help="stats.csv files: all shards of all sweep points")
    ap.add_argument("--out", required=True, help="output CSV, one row per sweep point")
    ap.add_argument("--params", default=None, help="SpeedParams as inline JSON/YAML or a file path")
    a = ap.parse_args(argv)
    p = params_from(read_structured(a.params), SpeedParams)
    table = add_speedups(summarize_points(read_stats(a.stats), p.point_by), p.baseline_method, p.group_by)
    with atomic_path(a.out) as tmp:
        table.to_csv(tmp, index=False)
    print(table.to_string(index=False, max_cols=12))
