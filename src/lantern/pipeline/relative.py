"""Sweep columns relative to plain AR of the same mode: speed-ups and the quality noise band.

Speed. The headline speed-up is the paper's: batch-1 latency measured in one process (`speedup_b1_in_job`: images
decoded alone, and plain AR alone, in the method's own job), where every point of a mode timed it; else the
batched in-job ratio (`speedup_vs_in_job_vanilla`: plain AR timed in the method's own job on the same batches).
Both are taken in one process because two jobs may land on differently loaded cores, and both carry a bootstrap
standard error over the timed images (`speedup_se`, from `*_se`; speed.speedup_se). The across-jobs
ratio (`speedup_vs_vanilla`: the vanilla point's mean latency / the method's) stays as a secondary column; the
vanilla control run measures how far it can be trusted: when the control's across-jobs ratio is off 1 by more than
a tolerance, the mode's across-jobs numbers are flagged.

Round cost. `round_cost_ar` = tau / the headline's in-job speed-up: a round's (a target forward's) time in plain-AR
tokens timed in the same job, from `round_cost_ar_b1` or `round_cost_ar_in_job` (tables.round_rows,
speed.round_cost: tau and the speed-up on the same images; bootstrap SE on speedup_se's draws). Plain AR's is 1 by
definition; across jobs there is none (NaN), a round and a plain-AR token being timed under different loads.

Quality. Each metric's standard error comes from `lantern evaluate`'s bootstrap over the generated images
(fid_se, precision_se, recall_se; the CLIP score's and HPS v2.1's per-image SEMs; class accuracy's binomial SE). A method differs from vanilla beyond noise when
|value - vanilla| > band_z * sqrt(se^2 + se_vanilla^2): `{metric}_z` holds that ratio's numerator over the root.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

# quality column -> its standard-error column
SE_COLUMNS = {"fid": "fid_se", "precision": "precision_se", "recall": "recall_se", "clip_score": "clip_score_sem",
              "hpsv2": "hpsv2_sem", "class_accuracy": "class_accuracy_se"}


def add_relative_columns(sweep: pd.DataFrame, speed_tolerance: float) -> pd.DataFrame:
    """sweep.csv's vanilla-relative columns, inserted after throughput_img_per_s (speed) and at the end (z)."""
    sweep = sweep.copy()
    base = sweep[sweep["point"] == "vanilla"].set_index("mode")
    lat = sweep["mode"].map(base["latency_s_per_image"])
    fwd = sweep["mode"].map(base["target_forwards_per_image"])
    is_ar = sweep["name"] == "vanilla"
    measured = sweep["speedup_vs_in_job_vanilla"].notna().groupby(sweep["mode"]).transform("any")
    # plain AR is its own in-job reference, in a mode whose jobs timed it
    in_job = sweep["speedup_vs_in_job_vanilla"].where(~(is_ar & measured), 1.0)
    across = lat / sweep["latency_s_per_image"]
    # one kind per mode, so that a figure never mixes in-job and across-jobs ratios
    full = in_job.notna().groupby(sweep["mode"]).transform("all")
    # the paper's setting, batch-1 latency, is the headline wherever every point of the mode timed it
    b1 = sweep["speedup_b1_in_job"] if "speedup_b1_in_job" in sweep else pd.Series(math.nan, index=sweep.index)
    b1 = b1.where(~(is_ar & b1.notna().groupby(sweep["mode"]).transform("any")), 1.0)
    b1_full = b1.notna().groupby(sweep["mode"]).transform("all")
    control = sweep[sweep["point"] == "vanilla-control"].set_index("mode")["latency_s_per_image"]
    drift = (sweep["mode"].map(base["latency_s_per_image"]) / sweep["mode"].map(control) - 1).abs()
    at = sweep.columns.get_loc("throughput_img_per_s") + 1
    se = lambda col: sweep[col] if col in sweep else pd.Series(math.nan, index=sweep.index)  # noqa: E731
    for i, (name, values) in enumerate([
        ("speedup", b1.where(b1_full, in_job.where(full, across))),
        ("speedup_se", se("speedup_b1_in_job_se").where(b1_full, se("speedup_vs_in_job_vanilla_se").where(full))),
        ("speedup_kind", np.where(b1_full, "in-job, batch 1", np.where(full, "in-job", "across jobs"))),
        ("speedup_vs_vanilla", across),
        ("speedup_across_jobs_drift", drift),
        ("speedup_across_jobs_reliable", (drift <= speed_tolerance).where(drift.notna())),
        ("step_compression", fwd / sweep["target_forwards_per_image"]),
        # what a round costs in plain-AR tokens (tau / speed-up), of the headline's in-job kind; none across jobs
        ("round_cost_ar", se("round_cost_ar_b1").where(b1_full, se("round_cost_ar_in_job").where(full))),
        ("round_cost_ar_se", se("round_cost_ar_b1_se").where(b1_full, se("round_cost_ar_in_job_se").where(full))),
    ]):
        sweep.insert(at + i, name, values)
    sweep["speedup_vs_in_job_vanilla"] = in_job
    if "speedup_b1_in_job" in sweep:
        sweep["speedup_b1_in_job"] = b1
    for metric, se in SE_COLUMNS.items():
        sweep[f"{metric}_z"] = quality_z(sweep, metric, se)
    return sweep


def quality_z(sweep: pd.DataFrame, metric: str, se: str) -> pd.Series:
    """(value - vanilla) / sqrt(se^2 + se_vanilla^2) per row; NaN where a standard error is missing."""
    if metric not in sweep or se not in sweep:
        return pd.Series(math.nan, index=sweep.index)
    # numeric: a metric skipped at every point (precision / recall below 4 images) is a column of None
    value, own = pd.to_numeric(sweep[metric], errors="coerce"), pd.to_numeric(sweep[se], errors="coerce")
    vanilla = sweep["point"] == "vanilla"
    v = sweep["mode"].map(value[vanilla].set_axis(sweep.loc[vanilla, "mode"]))
    v_se = sweep["mode"].map(own[vanilla].set_axis(sweep.loc[vanilla, "mode"]))
    z = (value - v) / np.sqrt(own**2 + v_se**2)
    return z.where(sweep["point"] != "vanilla")
