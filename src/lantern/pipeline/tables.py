"""`lantern tables`: aggregate generation shards and metrics files into the tidy tables the figures read.

Inputs follow the fixed layout `<outdir>/gen/{mode}/{point}/shard{j}/` (stats.csv + manifest.json, written by
`lantern sample`) and `<outdir>/metrics/{mode}/{point}.json`; mode and point come from those paths.
Outputs under --out:
  sweep.csv      one row per (mode, point): method spec, speed, acceptance, quality and protocol columns
  positions.csv  per (mode, point, token position): share of the tokens there that were accepted drafts
  depths.csv     per (mode, point, depth): how often a verification step accepted that many drafts
  rounds.csv     per (mode, point, batch size timed): a round's milliseconds, per timer section, beside one
                 plain-AR token timed in the same job, and the round's cost in plain-AR tokens (round_cost_ar)
  summary.md     the paper's table, per mode (with --worlds, then each toy world's ambiguity and class accuracy)
tau is the mean number of tokens emitted per target forward, the bonus/correction token counted
(= sum n_tokens / sum target_forwards over the point's images; the prefill forward counts as one).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import pandas as pd

from lantern.engine import methods
from lantern.errors import UserError
from lantern.io import atomic_path, read_csv, read_structured
from lantern.metrics.shards import RECOMPUTE, expected_images, redraw, verify_shard
from lantern.metrics.speed import (ALONE, ALONE_REFERENCE, IN_JOB_REFERENCE, decoded_alone, in_job_speedup,
                                   in_job_speedup_se, round_anatomy, speedup_se)
from lantern.pipeline.relative import SE_COLUMNS, add_relative_columns

QUALITY_COLUMNS = ["fid", "kid_mean", "kid_std", "precision", "recall", "clip_score", "clip_cosine", "hpsv2",
                   "class_accuracy"]
# summary.md's quality columns in order: column -> header; those in MEASURED_ONLY only in a mode that measured them
QUALITY_HEADERS = {"fid": "FID ↓", "clip_score": "CLIP ↑", "clip_cosine": "CLIP cos ↑", "hpsv2": "HPS v2.1 ↑",
                   "precision": "Precision ↑", "recall": "Recall ↑", "kid_mean": "KID ↓",
                   "class_accuracy": "Class acc. ↑"}
MEASURED_ONLY = ("hpsv2",)
STATS_REQUIRED = ["image_index", "n_tokens", "target_forwards", "drafter_forwards", "accepted_total",
                  "time_draft_s", "time_verify_s", "time_other_s", "time_total_s", "accepted_per_step"]
LIST_COLUMNS = ["accepted_per_step", "tree_depth", "tokens"]
DEPTH_COLUMNS = ["mode", "point", "name", "drafting", "depth", "steps", "fraction"]
ROUND_COLUMNS = ["mode", "point", "name", "drafting", "batch_size", "images", "rounds_per_image", "draft_ms",
                 "verify_ms", "other_ms", "round_ms", "ar_token_ms", "round_cost_ar", "round_cost_ar_se", "split"]


@dataclass
class TableParams:
    tau_digits: int = 2  # decimals printed in summary.md
    score_digits: int = 2  # CLIP score
    distance_figures: int = 3  # significant figures of FID and KID (a CLIP-feature FD is ~0.05, Inception FID ~5)
    fraction_digits: int = 3  # precision, recall, class accuracy
    band_z: float = 2.0  # a quality difference to vanilla beyond band_z standard errors is marked as real
    speed_tolerance: float = 0.1  # across-jobs speed-ups are flagged when AR vs its control differ by more

    def __post_init__(self):
        if not self.band_z > 0 or not self.speed_tolerance >= 0:
            raise UserError(f"tables band_z = {self.band_z} must be > 0 and speed_tolerance = {self.speed_tolerance} "
                            ">= 0")


def parse_ints(value) -> np.ndarray:
    """'3 0 2' -> array([3, 0, 2]); empty / NaN (vanilla has no verification steps) -> empty array."""
    if not isinstance(value, str) or not value.strip():
        return np.zeros(0, dtype=np.int64)
    return np.array(value.split(), dtype=np.int64)


def read_shard(shard: Path) -> tuple[pd.DataFrame, dict]:
    # its manifest first (a shard without one is no finished shard), then its images as many as it records
    # (evaluate checked their bytes when it computed the metrics row)
    manifest = verify_shard(shard, digests=False)
    if not (shard / "stats.csv").is_file():
        raise UserError(f"shard {shard} has no stats.csv; {redraw(shard)}")
    stats = read_csv(shard / "stats.csv", "stats table", redraw(shard),
                     converters={c: str for c in LIST_COLUMNS}, keep_default_na=True)
    missing = [c for c in STATS_REQUIRED if c not in stats.columns]
    if missing:
        raise UserError(f"{shard / 'stats.csv'} lacks column(s) {', '.join(missing)}; {redraw(shard)}")
    recorded = len(expected_images(manifest))
    if len(stats) != recorded:  # before any count is compared with a metrics row: the stats table is what is short
        what = "short" if len(stats) < recorded else "long"
        raise UserError(f"{shard / 'stats.csv'} is {what}: it holds {len(stats)} rows, but the shard's manifest "
                        f"records {recorded} images; {redraw(shard)}")
    if not isinstance(manifest.get("method"), dict):
        raise UserError(f"{shard / 'manifest.json'} is not a `lantern sample` manifest (no method); {redraw(shard)}")
    return stats, manifest


def mode_point(path: Path, depth: int) -> tuple[str, str]:
    """gen/{mode}/{point}/shard{j} (depth 1) or metrics/{mode}/{point}.json (depth 0) -> (mode, point)."""
    parts = path.parts
    if len(parts) < depth + 2:
        raise UserError(f"{path} is not laid out as .../{{mode}}/{{point}}/...; keep the pipeline's folder layout")
    point = parts[-1 - depth] if depth else path.stem
    return parts[-2 - depth], point


def method_spec(method: dict, where: str = "manifest") -> dict:
    """The method columns of a point: the registry's spec (defaults filled, nothing that does not apply)."""
    spec = methods.normalize(methods.applicable(method), f"{where} method")
    return {"drafting": "none", **{k: spec.get(k) for k in methods.spec_columns() if k != "drafting" or k in spec}}


def accepted_mask(accepted: np.ndarray, n_tokens: int, where: str = "") -> np.ndarray:
    """Which of an image's tokens were accepted drafts. The prefill emits token 0 from the target; each
    verification step then emits its accepted drafts followed by one target token (the last step may end early)."""
    mask = np.zeros(n_tokens, dtype=bool)
    if accepted.size == 0:
        return mask
    starts = 1 + np.concatenate([[0], np.cumsum(accepted[:-1] + 1)])
    end = starts[-1] + accepted[-1]  # where the last step's target token goes (past the end if drafts finished)
    if end not in (n_tokens - 1, n_tokens):
        raise UserError(f"{where}accepted_per_step {accepted.tolist()} emits {end + 1} tokens, not n_tokens = {n_tokens}; "
                        "the stats row is inconsistent, regenerate the shard")
    for s, a in zip(starts, accepted):
        mask[s : min(s + a, n_tokens)] = True
    return mask


def authors_tau(layout: dict, target_forwards: pd.Series, plain: bool) -> float:
    """The LANTERN authors' tau of a point in a layout world (engine/models/layout.tau_authors: every generated step
    after the first, forced tokens included, per verify forward), pooled over its images as their mean over all
    verify rounds is; NaN for plain AR, which has no verify round."""
    from lantern.engine.models.layout import Layout, tau_authors

    if plain:
        return math.nan
    lay = Layout(**{**layout, "prefix": tuple(layout.get("prefix", ()))})
    return tau_authors(lay, float(target_forwards.mean()))  # (steps - 1) / (mean forwards - 1): the pooled ratio


def point_rows(mode: str, point: str, shards: list[tuple[pd.DataFrame, dict]]
               ) -> tuple[dict, pd.DataFrame, pd.DataFrame | None, list[dict]]:
    """(sweep row without the vanilla-relative columns, positions rows, depth-histogram rows, rounds rows) of one
    point."""
    specs = {json.dumps(method_spec(m["method"], f"{mode}/{point}"), sort_keys=True) for _, m in shards}
    if len(specs) > 1:
        raise UserError(f"the shards of {mode}/{point} disagree on the method spec: {sorted(specs)}; regenerate them")
    stats = pd.concat([s for s, _ in shards], ignore_index=True)
    dup = stats["image_index"][stats["image_index"].duplicated()]
    if len(dup):
        raise UserError(f"{mode}/{point}: image {int(dup.iloc[0])} appears in two shards; shard ranges must not overlap")
    if stats["n_tokens"].nunique() != 1:
        raise UserError(f"{mode}/{point}: images differ in n_tokens ({sorted(stats['n_tokens'].unique())})")
    manifest = shards[0][1]
    n_tokens = int(stats["n_tokens"].iloc[0])
    per_step = [parse_ints(v) for v in stats["accepted_per_step"]]
    batched = stats[~decoded_alone(stats)]  # the times at the job's batch size
    lat = batched["time_total_s"].to_numpy(float)
    mean_lat = lat.mean() if len(lat) else math.nan
    row = {
        "mode": mode, "point": point, **method_spec(manifest["method"]),
        "n_images": len(stats), "n_shards": len(shards), "n_tokens": n_tokens,
        "tau_incl_bonus": stats["n_tokens"].sum() / stats["target_forwards"].sum(),
        "target_forwards_per_image": stats["target_forwards"].mean(),
        "drafter_forwards_per_image": stats["drafter_forwards"].mean(),
        # VVS: rounds that committed drafts without a verify (engine/decoding/skipping.py); none before the column
        "skipped_rounds_per_image": stats["skipped_rounds"].mean() if "skipped_rounds" in stats else 0.0,
        "accepted_per_step_mean": np.concatenate(per_step).mean() if any(a.size for a in per_step) else math.nan,
        "latency_s_per_image": mean_lat,
        "latency_p50_s": np.percentile(lat, 50) if len(lat) else math.nan,
        "latency_p90_s": np.percentile(lat, 90) if len(lat) else math.nan,
        "throughput_img_per_s": 1.0 / mean_lat if mean_lat > 0 else math.nan,
        # plain AR timed in the same job on the same batches (`lantern sample --in-job-vanilla`): immune to jobs
        # landing on different machines or under different load
        "speedup_vs_in_job_vanilla": in_job_speedup(batched),
        "speedup_vs_in_job_vanilla_se": in_job_speedup_se(batched),
        "time_draft_s_per_image": batched["time_draft_s"].mean(),
        "time_verify_s_per_image": batched["time_verify_s"].mean(),
        "time_other_s_per_image": batched["time_other_s"].mean(),
        "peak_mem_mib": stats["peak_mem_bytes"].max() / 2**20 if "peak_mem_bytes" in stats else math.nan,
    }
    # share of drafted tokens accepted: meaningful for chains, where every drafter forward drafts one token
    chain = row["drafting"] == "chain" and stats["drafter_forwards"].sum() > 0
    row["draft_acceptance_rate"] = stats["accepted_total"].sum() / stats["drafter_forwards"].sum() if chain else math.nan
    all_depths = np.concatenate(per_step)  # drafts accepted per verification step: a tree's accepted depth
    if all_depths.size:
        row.update(accepted_depth_mean=all_depths.mean(), accepted_depth_p50=np.percentile(all_depths, 50),
                   accepted_depth_p90=np.percentile(all_depths, 90), accepted_depth_max=all_depths.max())
    if manifest.get("layout"):  # a world with forced structural tokens (Lumina-mGPT): the authors' count beside ours
        row["tau_authors"] = authors_tau(manifest["layout"], stats["target_forwards"], row["name"] == "vanilla")
    drafted = [parse_ints(v) for v in stats["tree_depth"]] if "tree_depth" in stats else []
    if any(a.size for a in drafted):
        row["tree_depth_mean"] = np.concatenate(drafted).mean()
    spec = methods.normalize(methods.applicable(manifest["method"]), f"{mode}/{point} method")
    # the node budget: drafts verified per target forward at most (chain gamma, tree nodes, Jacobi window)
    row["draft_nodes"] = methods.drafting(spec).nodes if methods.speculative(spec) else math.nan
    batch = manifest.get("batch_size") or (stats["batch_size"].max() if "batch_size" in stats else 1)
    row.update(batch_latency(stats, lat, int(batch)))
    row["compiled"] = manifest.get("compile")  # the job's effective torch.compile setting (rounds as one call)
    rounds = [{"mode": mode, "point": point, "name": row["name"], "drafting": row["drafting"], **r}
              for r in round_rows(stats, int(batch), n_tokens, row["name"] == "vanilla", bool(row["compiled"]))]
    row.update(dict.fromkeys(["round_cost_ar_b1", "round_cost_ar_b1_se", "round_cost_ar_in_job",
                              "round_cost_ar_in_job_se"], math.nan))
    for r in rounds:  # the sweep's two in-job round costs, beside their speed-ups (relative.py picks the headline)
        key = "round_cost_ar_b1" if r["batch_size"] == 1 else "round_cost_ar_in_job"
        row.update({key: r["round_cost_ar"], f"{key}_se": r["round_cost_ar_se"]})
        if int(batch) == 1:
            row.update(round_cost_ar_in_job=r["round_cost_ar"], round_cost_ar_in_job_se=r["round_cost_ar_se"])
    sampling = manifest.get("sampling", {})
    # top_k / top_p of the sampler are named apart from method parameters of the same name (a dynamic tree's top_k)
    row.update({"cfg_scale": sampling.get("cfg_scale"), "temperature": sampling.get("temperature"),
                "sampling_top_k": sampling.get("top_k"), "sampling_top_p": sampling.get("top_p")})
    env = manifest.get("environment", {})
    row["device"] = env.get("gpu") or env.get("device")
    row["git_commit"] = env.get("git_commit")

    masks = np.stack([accepted_mask(a, n_tokens, f"{mode}/{point} image {i}: ")
                      for i, a in zip(stats["image_index"], per_step)])
    positions = pd.DataFrame({"mode": mode, "point": point, "position": np.arange(n_tokens), "n_tokens": n_tokens,
                              "n_images": len(masks), "accepted_fraction": masks.mean(0)})
    depth_rows = None  # plain AR has no verification steps
    if all_depths.size:
        counts = np.bincount(all_depths)
        depth_rows = pd.DataFrame({"mode": mode, "point": point, "name": row["name"], "drafting": row["drafting"],
                                   "depth": np.arange(len(counts)), "steps": counts,
                                   "fraction": counts / counts.sum()}, columns=DEPTH_COLUMNS)
    return row, positions, depth_rows, rounds


def round_rows(stats: pd.DataFrame, batch: int, n_tokens: int, plain: bool, compiled: bool) -> list[dict]:
    """rounds.csv's rows of one point: per batch size its images were timed at (the job's, and batch 1 for the images
    decoded alone, `--latency-images`), speed.round_anatomy over the images and plain-AR reference its in-job
    speed-up is taken on. Plain AR (`plain`) is its own reference: a round of it is a token, round_cost_ar = 1 by
    definition (its standard error left empty). A round run as one compiled call has no draft section (speculative.py
    times the call as verify): its split is "one call" and only its total means anything."""
    batched = stats[~decoded_alone(stats)]
    groups = [(batch, batched, "time_total_s", IN_JOB_REFERENCE, True, True)]
    if batch > 1 and ALONE in stats and stats[ALONE].notna().any():
        alone = stats[stats[ALONE].notna()]  # a job before 2026-11-27 decoded them in its batches too: no sections
        groups.insert(0, (1, alone, ALONE, ALONE_REFERENCE, False, bool(decoded_alone(alone).all())))
    out = []
    for size, rows, time, reference, paired, sections in groups:
        if rows.empty:
            continue
        r = round_anatomy(rows, time, None if plain else reference, paired, n_tokens, sections)
        if plain:
            r.update(round_cost_ar=1.0, round_cost_ar_se=math.nan)
        split = "sections" if sections else "none"
        if sections and compiled and not plain and rows["time_draft_s"].sum() == 0:
            split = "one call"
        out.append({"batch_size": size, **r, "split": split})
    return out


def batch_latency(stats: pd.DataFrame, per_image: np.ndarray, batch: int) -> dict:
    """The batch size, and the per-image latency at batch 1 (the paper's setting) with its in-job speed-up: the
    generation's own times when it ran at batch 1, else those of the images decoded alone (`--latency-images`)."""
    if batch == 1:
        return {"batch_size": 1, "latency_b1_images": len(per_image), "latency_b1_s_per_image": per_image.mean(),
                "speedup_b1_in_job": in_job_speedup(stats), "speedup_b1_in_job_se": in_job_speedup_se(stats)}
    if ALONE in stats:
        timed = stats[ALONE].notna()
        alone, plain = stats.loc[timed, ALONE].to_numpy(float), stats.loc[timed].get(ALONE_REFERENCE)
    else:
        alone, plain = np.zeros(0), None
    # plain AR alone runs on one image in each block of sweep.in_job_vanilla_every: its mean prices every image
    by_image = plain.to_numpy(float) if plain is not None and plain.notna().any() else None  # NaN: not timed
    plain = by_image[~np.isnan(by_image)] if by_image is not None else None
    return {"batch_size": batch, "latency_b1_images": len(alone),
            "latency_b1_s_per_image": alone.mean() if len(alone) else math.nan,
            "speedup_b1_in_job": plain.mean() / alone.mean() if plain is not None and len(alone) else math.nan,
            "speedup_b1_in_job_se": speedup_se(by_image, alone, paired=False) if plain is not None else math.nan}


def read_metrics(paths: list[Path]) -> dict[tuple[str, str], dict]:
    out = {}
    for path in paths:
        if not path.is_file():
            raise UserError(f"metrics file {path} does not exist; {RECOMPUTE}")
        try:
            values = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UserError(f"metrics file {path} is not valid JSON ({e}); {RECOMPUTE}") from None
        if not isinstance(values, dict):
            raise UserError(f"metrics file {path} holds a {type(values).__name__}, not a metrics row; {RECOMPUTE}")
        out[mode_point(path, 0)] = {k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in values.items()}
    return out


def order_key(row) -> tuple:
    """Paper order: registry order of families (vanilla, its control, exact SD, LANTERN, LANTERN++, ...) and of
    drafting kinds, then every parameter ascending."""
    def value(v):
        missing = v is None or (isinstance(v, float) and math.isnan(v))
        return (0, -1.0, "") if missing else (1, float(v), "") if isinstance(v, (int, float)) else (2, 0.0, str(v))

    family, drafting = methods.order({"name": row["name"], "drafting": row.get("drafting")})
    params = tuple(value(row.get(c)) for c in methods.spec_columns()[2:-1])
    return (row["mode"], family, row["name"], row["point"] != "vanilla", drafting, params, row["point"])


def sweep_table(shard_dirs: list[Path], metric_files: list[Path], speed_tolerance: float = 0.1
                ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    if not shard_dirs:
        raise UserError("no shards given; pass --shards results/gen/{mode}/{point}/shard{j} ...")
    groups: dict[tuple[str, str], list] = {}
    for shard in shard_dirs:
        stats, manifest = read_shard(shard)
        mode, point = mode_point(shard, 1)
        if manifest.get("mode", mode) != mode:
            raise UserError(f"shard {shard} lies under mode {mode!r} but its manifest says {manifest['mode']!r}")
        groups.setdefault((mode, point), []).append((stats, manifest))
    metrics = read_metrics(metric_files)
    orphans = sorted(set(metrics) - set(groups))
    if orphans:
        raise UserError(f"metrics for {'/'.join(orphans[0])} but no generation shards of it; pass its shards too")

    rows, positions, depths, rounds, metric_cols = [], [], [], [], dict.fromkeys(QUALITY_COLUMNS)
    for (mode, point), shards in groups.items():
        row, pos, dep, rnd = point_rows(mode, point, shards)
        rounds += rnd
        check_counts(mode, point, row["n_images"], metrics.get((mode, point), {}))
        for key, value in metrics.get((mode, point), {}).items():
            key = f"metrics_{key}" if key in row else key
            row[key] = value
            metric_cols[key] = None
        rows.append(row)
        positions.append(pos)
        if dep is not None:
            depths.append(dep)
    sweep = pd.DataFrame(sorted(rows, key=order_key))
    for col in QUALITY_COLUMNS:
        if col not in sweep:
            sweep[col] = math.nan
    # speed and acceptance first, then quality, then the metrics protocol
    sweep = sweep[[c for c in sweep.columns if c not in metric_cols] + list(metric_cols)]
    sweep = add_relative_columns(sweep, speed_tolerance)
    keys = sweep[["mode", "point"]]
    positions = keys.merge(pd.concat(positions, ignore_index=True), on=["mode", "point"])
    depths = (keys.merge(pd.concat(depths, ignore_index=True), on=["mode", "point"]) if depths
              else pd.DataFrame(columns=DEPTH_COLUMNS))
    rounds = keys.merge(pd.DataFrame(rounds, columns=ROUND_COLUMNS), on=["mode", "point"])
    return sweep, positions, depths, rounds


def check_counts(mode: str, point: str, n_images: int, metrics: dict) -> None:
    """A metrics row computed on another number of images than the point's shards hold (a shard redrawn or cut
    after its evaluation) would pair one set's speed with another's quality."""
    used = metrics.get("n_generated")
    if used is not None and not pd.isna(used) and int(used) != n_images:
        raise UserError(f"metrics/{mode}/{point}.json was computed on {int(used)} images, but the shards of {mode}/"
                        f"{point} hold {n_images}; {RECOMPUTE}")


def count_note(part: pd.DataFrame) -> list[str]:
    """summary.md's line when a mode's points were measured on different numbers of images: their quality columns
    then compare estimates of different precision, which the reader must know."""
    counts = part.groupby("n_images")["point"].apply(list)
    if len(counts) < 2:
        return []
    said = "; ".join(f"{int(n)} images: {', '.join(points)}" for n, points in counts.items())
    return ["", f"**Image counts differ between points** ({said}): their quality values are estimated on different "
                "numbers of images."]


def setting(row) -> str:
    """Short human description of a point's hyperparameters, e.g. 'chain γ=4, δ=0.2, k=50'."""
    if row["name"] == "vanilla":
        return f"seed {row['seed']}" + ("" if row["point"] == "vanilla" else " (control)")
    return methods.setting(methods.from_row(row))


def method_label(row) -> str:
    return methods.label(row["name"])


def _fmt(value, digits: int, suffix: str = "", significant: bool = False) -> str:
    """`digits` decimals, or `digits` significant figures (trailing zeros kept, so 0.4 prints as 0.400)."""
    if value is None or pd.isna(value):
        return "—"
    if significant:
        digits = max(0, digits - 1 - math.floor(math.log10(abs(value)))) if value else digits - 1
    return f"{value:.{digits}f}{suffix}"


def summary_markdown(sweep: pd.DataFrame, p: TableParams) -> str:
    lines = ["# Sweep summary", "",
             "τ = mean tokens emitted per target forward, **bonus/correction token counted** (plain AR: 1.00). "
             "In-job speed-up (batch 1), the headline as in the paper = plain AR's per-image latency / the method's, "
             "both timed in the method's own job on the images decoded alone (`sweep.latency_images`; plain AR on "
             "one in N of them, `sweep.in_job_vanilla_every`); "
             "in-job speed-up (batch B) = plain AR timed in the same job on the same batches of the other images (all, "
             "or one in N: "
             "`sweep.in_job_vanilla_every`) / the method, per-image times being batch wall time / B (throughput); "
             "an in-job speed-up's ± is its bootstrap standard error over the timed images, the job's own spread "
             "(between days the machine moves speed-ups further); across-jobs speed-up = per-image time of the "
             "vanilla point / of the method (two jobs: load and placement differ); step compression = target forwards of vanilla / of the "
             "method; round cost = τ / in-job speed-up, what one round (one target forward) costs in plain-AR "
             "tokens timed in the same job, ± its bootstrap SE (plain AR: 1 by definition). "
             f"† marks a quality value that differs from vanilla's by more than {p.band_z:g} standard errors of "
             "the difference (bootstrap over the generated images; CLIP, HPS v2.1: per-image SEM; class accuracy: "
             "binomial); "
             "unmarked differences are within noise.", ""]
    digits = {"fid": (p.distance_figures, True), "clip_score": (p.score_digits, False),
              "clip_cosine": (p.fraction_digits + 1, False), "hpsv2": (p.fraction_digits + 1, False),
              "precision": (p.fraction_digits, False), "recall": (p.fraction_digits, False),
              "kid_mean": (p.distance_figures, True), "class_accuracy": (p.fraction_digits, False)}
    for mode, part in sweep.groupby("mode", sort=False):
        speed = speed_columns(part)
        speed = {h: c for h, c in speed.items() if c in ROUND_COSTS} | cost_columns(speed) | speed  # in-job first
        shown = [c for c in QUALITY_HEADERS
                 if c not in MEASURED_ONLY or (c in part and pd.to_numeric(part[c], errors="coerce").notna().any())]
        lines += [f"## {mode}", "",
                  "| Method | Setting | τ (incl. bonus) | " + " | ".join(speed) + " | Step compr. | " +
                  " | ".join(QUALITY_HEADERS[c] for c in shown) + " | Images |",
                  "|" + "|".join(["---"] * 2 + ["---:"] * (3 + len(shown) + len(speed))) + "|"]
        for _, r in part.iterrows():
            beyond = beyond_band(r, p.band_z)
            quality = " | ".join(_fmt(r[c], digits[c][0], significant=digits[c][1]) + "†" * (c in beyond)
                                 for c in shown)
            lines.append(
                f"| {method_label(r)} | {setting(r)} | {_fmt(r['tau_incl_bonus'], p.tau_digits)} | "
                + " | ".join(speed_cell(r, c) for c in speed.values())
                + f" | {_fmt(r['step_compression'], 2, '×')} | {quality} | {int(r['n_images'])} |")
        lines += noise_lines(part, digits, p) + count_note(part)
        protocol = [f"{c} = {part[c].dropna().iloc[0]}" for c in
                    ("fid_extractor", "extractor", "reference_kind", "n_reference", "resolution", "resize_filter",
                     "prc_extractor", "clip_model", "hpsv2_model", "caption_source", "device", "cfg_scale",
                     "temperature", "batch_size", "latency_b1_images")
                    if c in part and part[c].dropna().nunique() == 1]
        if protocol:
            lines += ["", "Protocol: " + "; ".join(protocol) + "."]
        lines.append("")
    return "\n".join(lines + modes_side_by_side(sweep, p))


def modes_side_by_side(sweep: pd.DataFrame, p: TableParams) -> list[str]:
    """The paper's greedy and sampling columns: with two or more modes, every point run in all of them with its τ and
    in-job speed-ups (batched, and batch 1 when timed) per mode, side by side."""
    modes = list(dict.fromkeys(sweep["mode"]))
    if len(modes) < 2:
        return []
    parts = {m: sweep[sweep["mode"] == m].set_index("point") for m in modes}
    speed = {m: {h: c for h, c in speed_columns(parts[m]).items() if c != "speedup_vs_vanilla"} or
             speed_columns(parts[m]) for m in modes}
    header = [h for m in modes for h in [f"{m}: τ"] + [f"{m}: {name}" for name in speed[m]]]
    lines = ["## Modes side by side", "", "| Method | Setting | " + " | ".join(header) + " |",
             "|" + "|".join(["---"] * 2 + ["---:"] * len(header)) + "|"]
    for point, r in parts[modes[0]].iterrows():
        if not all(point in parts[m].index for m in modes):
            continue
        cells = [c for m in modes for c in [_fmt(parts[m].at[point, "tau_incl_bonus"], p.tau_digits)] +
                 [_fmt(parts[m].at[point, col], 2, "×") for col in speed[m].values()]]
        lines.append(f"| {method_label(r)} | {setting(r.to_dict() | {'point': point})} | " + " | ".join(cells) + " |")
    return lines + [""]


def speed_cell(row, column: str) -> str:
    """A speed-up or round cost with its standard error where it has one (the in-job columns: `{column}_se`)."""
    se = row.get(f"{column}_se")
    unit = "" if column.startswith("round_cost") else "×"
    return _fmt(row.get(column), 2, unit) + (f" ± {se:.2f}" if se is not None and pd.notna(se) else "")


# an in-job speed-up column -> the round cost taken with it (tau / that speed-up)
ROUND_COSTS = {"speedup_b1_in_job": "round_cost_ar_b1", "speedup_vs_in_job_vanilla": "round_cost_ar_in_job"}


def cost_columns(speed: dict[str, str]) -> dict[str, str]:
    """header -> column of a mode's round costs in plain-AR tokens, one per in-job speed-up it shows."""
    return {header.replace("In-job speed-up", "Round cost (AR tokens)"): ROUND_COSTS[column]
            for header, column in speed.items() if column in ROUND_COSTS}


def speed_columns(part: pd.DataFrame) -> dict[str, str]:
    """header -> column of a mode's speed-ups: in-job at the generation's batch size (the headline, when measured),
    in-job at batch 1 when the batched generation also timed images alone, and across jobs."""
    batch = int(part["batch_size"].max()) if "batch_size" in part else 1
    at = f" (batch {batch})" if batch > 1 else ""
    out = {}
    if batch > 1 and "speedup_b1_in_job" in part and (part["speedup_b1_in_job"].notna()).all():
        out["In-job speed-up (batch 1)"] = "speedup_b1_in_job"
    if part["speedup_vs_in_job_vanilla"].notna().all():
        out[f"In-job speed-up{at}"] = "speedup_vs_in_job_vanilla"
    out[f"Speed-up across jobs{at}"] = "speedup_vs_vanilla"
    return out


def beyond_band(row, band_z: float) -> list[str]:
    """The quality metrics in which a row differs from vanilla by more than band_z standard errors."""
    return [c for c in SE_COLUMNS if abs(row.get(f"{c}_z", 0) or 0) > band_z]


def noise_lines(part: pd.DataFrame, digits: dict, p: TableParams) -> list[str]:
    """The mode's noise band (± band_z standard errors of the difference between two runs with vanilla's spread),
    which points lie beyond it, and whether the across-jobs speed-ups can be read."""
    at = part.set_index("point")
    if "vanilla" not in at.index:
        return []
    lines = []
    band = [f"{c} ±{_fmt(p.band_z * math.sqrt(2) * at.at['vanilla', se], digits[c][0], significant=digits[c][1])}"
            for c, se in SE_COLUMNS.items() if se in at and pd.notna(at.at["vanilla", se])]
    if band:
        beyond = [f"{method_label(r)} {setting(r)} ({', '.join(beyond_band(r, p.band_z))})"
                  for _, r in part.iterrows() if beyond_band(r, p.band_z)]
        lines += ["", f"Noise band (±{p.band_z:g}·√2·SE of vanilla): {', '.join(band)}.",
                  "", f"Beyond the band: {'; '.join(beyond) if beyond else 'none'}."]
    if "vanilla-control" not in at.index and band:
        lines += ["", "No control run in this mode (greedy decoding ignores the seed, so a second AR run would repeat "
                  "vanilla): the band is the bootstrap's alone."]
    if "vanilla-control" in at.index:
        control = at.loc["vanilla-control"]
        z = [f"{c} {control[f'{c}_z']:+.1f}" for c in SE_COLUMNS if pd.notna(control[f"{c}_z"])]
        if z:
            lines += ["", f"Check: the control AR run lies at z = {', '.join(z)} from vanilla."]
        if pd.notna(control["speedup_across_jobs_drift"]) and control["speedup_across_jobs_drift"] > p.speed_tolerance:
            lines += ["", f"⚠ Across-jobs speed-ups are unreliable here: the two AR runs' latencies differ by "
                      f"{control['speedup_across_jobs_drift']:.0%} (tolerance {p.speed_tolerance:.0%}); read the "
                      "in-job column."]
    return lines


def world_lines(paths: list[Path], p: TableParams) -> list[str]:
    """summary.md's toy-world section: per world, source and CFG scale, how flat the target's distributions are and
    (where the world has a classifier) whether its images show their class: `lantern ambiguity`'s tables."""
    lines = ["## Toy worlds", "",
             "The target's sampling distribution at every step of its own samples and of teacher-forced held-out "
             "images (`lantern ambiguity`): LANTERN's regime is a low top-1. Class accuracy: the classifier on the "
             "decoded samples (does the target use its class, and does guidance help?) and on the held-out VQ "
             "reconstructions (the most a sample can show), ± binomial SE.", "",
             "| World | Source | CFG | Mean top-1 | Steps with top-1 < 0.2 | Entropy (nats) | Class acc. | Images |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for path in paths:
        df = read_csv(path, "ambiguity table", "give `lantern ambiguity`'s --out file")
        for _, r in df.iterrows():
            acc = (f"{_fmt(r['class_accuracy'], p.fraction_digits)} ± {_fmt(r['class_accuracy_se'], p.fraction_digits)}"
                   if "class_accuracy" in df.columns else "—")
            lines.append(f"| {path.parent.name} | {r['source']} | {r['cfg_scale']:g} | "
                         f"{_fmt(r['mean_top1'], p.fraction_digits)} | {r['frac_top1_below_0.2']:.0%} | "
                         f"{r['mean_entropy']:.2f} | {acc} | {int(r['images'])} |")
    return lines + [""]


def write_csv(df: pd.DataFrame, path: Path) -> None:
    with atomic_path(path) as tmp:
        df.to_csv(tmp, index=False)


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="lantern tables", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", nargs="+", required=True, help="shard folders <outdir>/gen/{mode}/{point}/shard{j}")
    ap.add_argument("--metrics", nargs="*", default=[], help="metrics files <outdir>/metrics/{mode}/{point}.json")
    ap.add_argument("--out", required=True, help="folder for sweep.csv, positions.csv, depths.csv, rounds.csv, summary.md")
    ap.add_argument("--worlds", nargs="*", default=[], help="toy worlds' ambiguity tables <outdir>/toy/{world}/"
                    "ambiguity.csv, summarised at the end of summary.md")
    ap.add_argument("--params", default=None, help="TableParams overrides (JSON/YAML or file)")
    return ap.parse_args(argv)


def main(argv: list[str]) -> None:
    a = parse_args(argv)
    raw = read_structured(a.params)
    known = {f.name for f in fields(TableParams)}
    for key in raw:
        if key not in known:
            raise UserError(f"--params: unknown key {key!r}; allowed: {', '.join(sorted(known))}")
    p = TableParams(**raw)
    sweep, positions, depths, rounds = sweep_table([Path(s) for s in a.shards], [Path(m) for m in a.metrics],
                                                   p.speed_tolerance)
    out = Path(a.out)
    write_csv(sweep, out / "sweep.csv")
    write_csv(positions, out / "positions.csv")
    write_csv(depths, out / "depths.csv")
    write_csv(rounds, out / "rounds.csv")
    with atomic_path(out / "summary.md") as tmp:
        worlds = world_lines([Path(w) for w in a.worlds], p) if a.worlds else []
        tmp.write_text("\n".join([summary_markdown(sweep, p), *([""] + worlds if worlds else [])]))
    print(f"wrote {len(sweep)} sweep rows ({sweep['mode'].nunique()} modes) to {out}")
