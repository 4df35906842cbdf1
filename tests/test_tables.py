"""`lantern tables` on a small synthetic sweep written to disk in the layout `lantern sample` and the metrics rule use."""

import json
import math
import zlib

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from lantern.errors import UserError
from lantern.pipeline.tables import TableParams, accepted_mask, main, setting, summary_markdown, sweep_table

N_TOKENS = 16  # a 4 x 4 token grid
SIDE = 8  # tiny PNGs

POINTS = {
    "vanilla": {"name": "vanilla", "seed": 0},
    "vanilla-control": {"name": "vanilla", "seed": 1},
    "exact-chain-g4": {"name": "exact", "drafting": "chain", "gamma": 4, "residual": "bounded", "seed": 0},
    **{f"lantern-chain-g4-d{d}-k{k}": {"name": "lantern", "drafting": "chain", "gamma": 4, "delta": d, "k": k,
                                        "residual": "bounded", "seed": 0}
       for d in (0.1, 0.2, 0.4) for k in (10, 50)},
    "lanternpp-static-naive_extend_57-l2-k10": {"name": "lanternpp", "drafting": "static", "gamma": 4, "lam": 2,
                                                "k": 10, "tree": "naive_extend_57", "seed": 0},
    "exact-dynamic": {"name": "exact", "drafting": "dynamic", "gamma": 4, "seed": 0},
}


def simulate(spec: dict, rng: np.random.Generator) -> list[int]:
    """Accepted drafts per verification step of one image, consistent with how the decoders emit tokens."""
    if spec["name"] == "vanilla":
        return []
    gamma = 5 if spec.get("drafting") in ("static", "dynamic") else spec["gamma"]
    boost = spec.get("delta", 0) * 4 + (spec.get("k", 0) / 100) + (0.5 if spec["name"] == "lanternpp" else 0)
    steps, tokens = [], 1
    while tokens < N_TOKENS:
        g = min(gamma, N_TOKENS - tokens)
        a = int(min(g, rng.binomial(g, min(0.9, 0.3 + 0.3 * boost))))
        steps.append(a)
        tokens += a
        if tokens == N_TOKENS:
            break
        tokens += 1
    return steps


def stats_row(i: int, point: str, mode: str, spec: dict, rng) -> dict:
    steps = simulate(spec, rng)
    forwards = 1 + len(steps) if steps or spec["name"] != "vanilla" else N_TOKENS
    drafter = sum(min(4, 1 + a) for a in steps)
    t_verify, t_draft = 0.001 * forwards * (1.0 + 0.1 * rng.random()), 0.0002 * drafter
    row = {"image_index": i, "seed": 1000 * spec["seed"] + i, "label": i % 4, "method": spec["name"], "mode": mode,
           "n_tokens": N_TOKENS, "target_forwards": forwards, "drafter_forwards": drafter,
           "accepted_total": sum(steps), "time_draft_s": t_draft, "time_verify_s": t_verify, "time_other_s": 0.0001,
           "peak_mem_bytes": math.nan, "batch_size": 1, "accepted_per_step": " ".join(map(str, steps)),
           "tau": N_TOKENS / forwards, "time_total_s": t_draft + t_verify + 0.0001, "steps": len(steps) or forwards,
           "tokens": " ".join(str(int(t)) for t in rng.integers(0, 64, N_TOKENS))}
    if mode == "sampling" and spec["name"] != "vanilla":  # `lantern sample --in-job-vanilla`
        row["vanilla_time_total_s"] = 0.001 * N_TOKENS * (1.0 + 0.1 * rng.random())
    if spec["name"] != "vanilla":  # the deepest drafted node per round: a chain's length
        depth = {"chain": lambda a: spec.get("gamma"), "static": lambda a: 5}.get(spec["drafting"], lambda a: max(2, a + 1))
        row["tree_depth"] = " ".join(str(depth(a)) for a in steps)
    return row


def write_shard(folder, mode, point, spec, indices, rows=None):
    rng = np.random.default_rng(zlib.crc32(f"{mode}/{point}/{indices[0]}".encode()))
    (folder / "images").mkdir(parents=True)
    rows = rows or [stats_row(i, point, mode, spec, rng) for i in indices]
    for i in indices:
        pixels = np.full((SIDE, SIDE, 3), (37 * i + 11 * len(point)) % 256, dtype=np.uint8)
        pixels[: SIDE // 2, :, i % 3] = 255
        Image.fromarray(pixels).save(folder / "images" / f"{i:06d}.png")
    pd.DataFrame(rows).to_csv(folder / "stats.csv", index=False)
    manifest = {"method": spec, "mode": mode, "seed": spec["seed"], "start": indices[0], "end": indices[-1] + 1,
                "sampling": {"cfg_scale": 2.0, "temperature": 1.0, "top_k": 0, "top_p": 1.0},
                "environment": {"device": "cpu", "git_commit": "abc"}}
    (folder / "manifest.json").write_text(json.dumps(manifest))


def make_sweep(root, n_images=6, with_metrics=True):
    """A two-mode sweep under root/gen and root/metrics; returns (shard folders, metrics files)."""
    shards, metrics = [], []
    for mode in ("greedy", "sampling"):
        for point, spec in POINTS.items():
            half = n_images // 2
            for j, indices in enumerate((list(range(half)), list(range(half, n_images)))):
                folder = root / "gen" / mode / point / f"shard{j}"
                write_shard(folder, mode, point, spec, indices)
                shards.append(folder)
            if with_metrics:
                strength = spec.get("delta", 0) + 0.05 * (spec.get("lam", 1) - 1) + 0.001 * spec.get("k", 0)
                values = {"fid": 10 + 30 * strength + (0.4 if point == "vanilla-control" else 0),
                          "kid_mean": 0.01, "kid_std": 0.001, "precision": 0.7 - strength, "recall": 0.6 - strength / 2,
                          "clip_score": 0.3 - 0.2 * strength, "n_generated": n_images, "n_reference": 100,
                          "fid_se": 0.5, "precision_se": 0.02, "recall_se": 0.02, "clip_score_sem": 0.01,
                          "fid_extractor": "toyclip", "resolution": 32, "seed": 2020}
                path = root / "metrics" / mode / f"{point}.json"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(values))
                metrics.append(path)
    return shards, metrics


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    shards, metrics = make_sweep(root)
    main(["--shards", *map(str, shards), "--metrics", *map(str, metrics), "--out", str(root / "tables")])
    return root


def test_sweep_table_columns_and_reference_values(built):
    sweep = pd.read_csv(built / "tables" / "sweep.csv")
    assert len(sweep) == 2 * len(POINTS)
    for col in ("mode", "point", "name", "drafting", "gamma", "delta", "lam", "k", "residual", "tree", "seed",
                "n_images", "tau_incl_bonus", "target_forwards_per_image", "drafter_forwards_per_image",
                "skipped_rounds_per_image",
                "latency_s_per_image", "latency_p50_s", "latency_p90_s", "throughput_img_per_s",
                "speedup_vs_vanilla", "step_compression", "accepted_depth_mean", "tree_depth_mean",
                "fid", "clip_score", "precision", "recall", "n_reference", "fid_extractor", "metrics_seed"):
        assert col in sweep.columns, col
    van = sweep[sweep["point"] == "vanilla"]
    assert np.allclose(van["speedup_vs_vanilla"], 1.0) and np.allclose(van["step_compression"], 1.0)
    assert np.allclose(van["tau_incl_bonus"], 1.0) and (sweep["n_images"] == 6).all()
    # paper order within each mode: vanilla, its control, then exact SD
    assert list(sweep["point"][:3]) == ["vanilla", "vanilla-control", "exact-chain-g4"]
    assert sweep["tau_incl_bonus"].max() > 1.5  # the synthetic relaxations accept drafts
    assert sweep.loc[sweep["drafting"] == "chain", "accepted_depth_mean"].notna().all()
    assert sweep.loc[sweep["name"] == "vanilla", ["accepted_depth_mean", "tree_depth_mean"]].isna().all().all()
    # the sampler's top_k has a column of its own: it once overwrote the dynamic tree's top_k (shown as "top_k=0")
    assert (sweep.loc[sweep["point"] == "exact-dynamic", "top_k"] == 10).all() and (sweep["sampling_top_k"] == 0).all()


def test_in_job_speedup_is_the_same_jobs_vanilla_time_over_the_methods(built):
    sweep = pd.read_csv(built / "tables" / "sweep.csv").set_index(["mode", "point"])
    stats = pd.concat(pd.read_csv(built / "gen" / "sampling" / "exact-chain-g4" / f"shard{j}" / "stats.csv")
                      for j in (0, 1))
    expected = stats["vanilla_time_total_s"].mean() / stats["time_total_s"].mean()
    assert sweep.loc[("sampling", "exact-chain-g4"), "speedup_vs_in_job_vanilla"] == pytest.approx(expected)
    assert sweep.loc["greedy", "speedup_vs_in_job_vanilla"].isna().all()  # generated without the reference
    text = (built / "tables" / "summary.md").read_text()
    greedy, sampling = text.split("## greedy")[1].split("## sampling")
    assert "In-job speed-up" in sampling and "In-job speed-up" not in greedy
    # the round cost comes with the in-job speed-up it is taken from, and only with it
    assert "Round cost (AR tokens)" in sampling and "Round cost" not in greedy.split("Noise band")[0]
    header, rule = [line for line in sampling.splitlines() if line.startswith("|")][:2]
    assert header.count("|") == rule.count("|") == 16


def test_modes_side_by_side(built):
    """The paper's greedy and sampling columns: τ and the in-job speed-ups of every point per mode, in one table
    (a mode timed without the in-job reference shows its across-jobs ratio); one mode alone gets no such table."""
    text = (built / "tables" / "summary.md").read_text()
    side = text.split("## Modes side by side")[1].splitlines()
    assert side[2] == ("| Method | Setting | greedy: τ | greedy: Speed-up across jobs | sampling: τ | "
                       "sampling: In-job speed-up |")
    sweep = pd.read_csv(built / "tables" / "sweep.csv").set_index(["mode", "point"])
    rows = [line for line in side[4:] if line.startswith("| ")]
    assert len(rows) == len(POINTS)
    cells = [c.strip() for c in next(r for r in rows if r.startswith("| Exact SD | chain γ=4")).strip("|").split("|")]
    assert cells[2:] == [f"{sweep.loc[('greedy', 'exact-chain-g4'), 'tau_incl_bonus']:.2f}",
                         f"{sweep.loc[('greedy', 'exact-chain-g4'), 'speedup_vs_vanilla']:.2f}×",
                         f"{sweep.loc[('sampling', 'exact-chain-g4'), 'tau_incl_bonus']:.2f}",
                         f"{sweep.loc[('sampling', 'exact-chain-g4'), 'speedup_vs_in_job_vanilla']:.2f}×"]
    one = summary_markdown(sweep.reset_index().query("mode == 'sampling'"), TableParams())
    assert "## sampling" in one and "side by side" not in one


def test_tau_speedup_and_compression_recomputed_from_stats(built):
    sweep = pd.read_csv(built / "tables" / "sweep.csv").set_index(["mode", "point"])
    point = "lantern-chain-g4-d0.4-k50"
    stats = pd.concat(pd.read_csv(built / "gen" / "sampling" / point / f"shard{j}" / "stats.csv") for j in (0, 1))
    vstats = pd.concat(pd.read_csv(built / "gen" / "sampling" / "vanilla" / f"shard{j}" / "stats.csv") for j in (0, 1))
    row = sweep.loc[("sampling", point)]
    assert row["tau_incl_bonus"] == pytest.approx(stats["n_tokens"].sum() / stats["target_forwards"].sum())
    assert row["speedup_vs_vanilla"] == pytest.approx(vstats["time_total_s"].mean() / stats["time_total_s"].mean())
    assert row["step_compression"] == pytest.approx(N_TOKENS / stats["target_forwards"].mean())
    assert row["throughput_img_per_s"] == pytest.approx(1 / stats["time_total_s"].mean())
    assert row["draft_acceptance_rate"] == pytest.approx(stats["accepted_total"].sum() / stats["drafter_forwards"].sum())


def test_positions_and_depths(built):
    pos = pd.read_csv(built / "tables" / "positions.csv")
    assert pos["accepted_fraction"].between(0, 1).all()
    assert len(pos) == 2 * len(POINTS) * N_TOKENS
    assert (pos[pos["position"] == 0]["accepted_fraction"] == 0).all()  # the prefill's token is the target's
    assert (pos[pos["point"].str.startswith("vanilla")]["accepted_fraction"] == 0).all()
    depths = pd.read_csv(built / "tables" / "depths.csv")
    assert set(depths["drafting"]) == {"chain", "static", "dynamic"}
    assert np.allclose(depths.groupby(["mode", "point"])["fraction"].sum(), 1.0)


def test_accepted_mask_hand_made_case():
    # prefill -> target; step 1: 2 drafts + target; step 2: 0 drafts + target; step 3: 3 drafts, image complete
    mask = accepted_mask(np.array([2, 0, 3]), 8)
    assert mask.tolist() == [False, True, True, False, False, True, True, True]
    # the last step's target token lies past the end and is truncated
    assert accepted_mask(np.array([2, 1]), 5).tolist() == [False, True, True, False, True]
    assert not accepted_mask(np.zeros(0, dtype=int), 4).any()
    with pytest.raises(UserError, match="not n_tokens = 8"):
        accepted_mask(np.array([1]), 8)
    with pytest.raises(UserError, match="not n_tokens = 4"):
        accepted_mask(np.array([3, 3]), 4)


def test_positions_exact_for_one_hand_made_point(tmp_path):
    spec = POINTS["exact-chain-g4"]
    base = stats_row(0, "exact-chain-g4", "greedy", spec, np.random.default_rng(0))
    rows = [{**base, "image_index": 0, "accepted_per_step": "2 0 3", "target_forwards": 4, "n_tokens": 8},
            {**base, "image_index": 1, "accepted_per_step": "0 0 0 0 0 0 0", "target_forwards": 8, "n_tokens": 8}]
    folder = tmp_path / "gen" / "greedy" / "exact-chain-g4" / "shard0"
    write_shard(folder, "greedy", "exact-chain-g4", spec, [0, 1], rows)
    sweep, pos, _, _ = sweep_table([folder], [])
    assert pos["accepted_fraction"].tolist() == [0, 0.5, 0.5, 0, 0, 0.5, 0.5, 0.5]
    assert sweep["tau_incl_bonus"].iloc[0] == pytest.approx(16 / 12)
    assert math.isnan(sweep["speedup_vs_vanilla"].iloc[0]) and math.isnan(sweep["fid"].iloc[0])  # no vanilla, no metrics


def test_summary_markdown(built):
    text = (built / "tables" / "summary.md").read_text()
    assert "## greedy" in text and "## sampling" in text
    assert "bonus" in text and "τ (incl. bonus)" in text
    greedy = text.split("## greedy")[1].split("## sampling")[0]
    lines = [l for l in greedy.splitlines() if l.startswith("| ") and not l.startswith("| Method")]
    assert lines[0].startswith("| AR (vanilla) | seed 0 |") and "1.00×" in lines[0]
    assert "(control)" in lines[1] and lines[2].startswith("| Exact SD | chain γ=4")
    # the band: 2·√2·SE of vanilla; the control (0.4 off in FID, z = 0.57) is inside, strong relaxations are not
    assert "Noise band (±2·√2·SE of vanilla): fid ±1.41, precision ±0.057, recall ±0.057, clip_score ±0.03." in greedy
    assert "Check: the control AR run lies at z = fid +0.6" in greedy
    beyond = greedy.split("Beyond the band: ")[1].split("\n")[0]
    assert "LANTERN chain γ=4, δ=0.4, k=50 (fid, precision, recall, clip_score)" in beyond and "control" not in beyond
    assert "Exact SD" not in beyond  # strength 0: the same metrics as vanilla
    row = next(l for l in lines if "δ=0.4, k=50" in l)
    assert "23.5†" in row and row.count("†") == 4  # FID, CLIP, precision, recall; KID has no band
    assert setting({"name": "lantern", "point": "x", "drafting": "chain", "gamma": 4.0, "delta": 0.2, "lam": math.nan,
                    "k": 50.0, "residual": "reference"}) == "chain γ=4, δ=0.2, k=50, residual=reference"


def test_bad_inputs_are_one_line_user_errors(tmp_path):
    shards, metrics = make_sweep(tmp_path, n_images=2)
    with pytest.raises(UserError, match="has no manifest.json.*--forcerun"):
        sweep_table([tmp_path / "gen" / "greedy" / "nowhere" / "shard0"], [])
    with pytest.raises(UserError, match="but no generation shards"):
        sweep_table(shards[:2], metrics)
    with pytest.raises(UserError, match="appears in two shards"):
        sweep_table([shards[0], shards[0]], [])
    with pytest.raises(UserError, match="unknown key 'digits'"):
        main(["--shards", str(shards[0]), "--out", str(tmp_path / "t"), "--params", '{"digits": 3}'])
    assert not (tmp_path / "t").exists()  # nothing written before the inputs check out


def test_headline_speedup_is_in_job_and_across_jobs_drift_is_flagged(built):
    sweep = pd.read_csv(built / "tables" / "sweep.csv").set_index(["mode", "point"])
    sampling, greedy = sweep.loc["sampling"], sweep.loc["greedy"]
    # generated at batch 1: the in-job ratio is the batch-1 latency ratio, the paper's headline
    assert (sampling["speedup_kind"] == "in-job, batch 1").all() and (greedy["speedup_kind"] == "across jobs").all()
    assert np.allclose(sampling["speedup"], sampling["speedup_vs_in_job_vanilla"])
    assert np.allclose(sampling["speedup"], sampling["speedup_b1_in_job"])
    assert np.allclose(greedy["speedup"], greedy["speedup_vs_vanilla"])
    assert sampling.loc["vanilla", "speedup"] == 1.0 and greedy["speedup_vs_in_job_vanilla"].isna().all()
    text = (built / "tables" / "summary.md").read_text()
    for mode, part in (("greedy", greedy), ("sampling", sampling)):
        drift = abs(part.loc["vanilla", "latency_s_per_image"] / part.loc["vanilla-control", "latency_s_per_image"] - 1)
        assert np.allclose(part["speedup_across_jobs_drift"], drift)
        section = text.split(f"## {mode}")[1].split("## ")[0]
        assert ("Across-jobs speed-ups are unreliable" in section) == (drift > 0.1)
        assert bool(part.loc["exact-chain-g4", "speedup_across_jobs_reliable"]) == (drift <= 0.1)


def test_draft_nodes_is_the_node_budget(built):
    sweep = pd.read_csv(built / "tables" / "sweep.csv").set_index(["mode", "point"]).loc["sampling"]
    assert sweep.loc["exact-chain-g4", "draft_nodes"] == 4
    assert sweep.loc["lanternpp-static-naive_extend_57-l2-k10", "draft_nodes"] == 57
    assert sweep.loc["exact-dynamic", "draft_nodes"] == 58  # total_tokens 59 counts y
    assert np.isnan(sweep.loc["vanilla", "draft_nodes"])


def test_tolerance_and_band_params_are_checked(tmp_path):
    shards, metrics = make_sweep(tmp_path, n_images=2)
    for bad in ('{"band_z": 0}', '{"speed_tolerance": -0.1}'):
        with pytest.raises(UserError, match="band_z .* must be > 0 and speed_tolerance"):
            main(["--shards", str(shards[0]), "--out", str(tmp_path / "t"), "--params", bad])
    assert not (tmp_path / "t").exists()


def test_greedy_without_a_control_row_takes_its_band_from_the_bootstrap(tmp_path):
    """The pipeline runs no control point in greedy mode (greedy ignores the seed): the table has no control row
    there, still draws the noise band from the bootstrap SEs, and says so; sampling keeps its control check."""
    shards, metrics = make_sweep(tmp_path)

    def greedy_control(path):
        return "greedy" in path.parts and (path.name == "vanilla-control.json" or "vanilla-control" in path.parts)

    main(["--shards", *[str(s) for s in shards if not greedy_control(s)],
          "--metrics", *[str(m) for m in metrics if not greedy_control(m)], "--out", str(tmp_path / "tables")])
    sweep = pd.read_csv(tmp_path / "tables" / "sweep.csv")
    assert set(sweep.loc[sweep["mode"] == "greedy", "point"]) == set(POINTS) - {"vanilla-control"}
    assert sweep.loc[sweep["mode"] == "greedy", "speedup_across_jobs_drift"].isna().all()
    text = (tmp_path / "tables" / "summary.md").read_text()
    greedy, sampling = text.split("## greedy")[1].split("## sampling")[0], text.split("## sampling")[1]
    assert "(control)" not in greedy and "Noise band (±2·√2·SE of vanilla): fid ±1.41" in greedy
    assert "No control run in this mode" in greedy and "the band is the bootstrap's alone" in greedy
    assert "No control run" not in sampling and "Check: the control AR run lies at z" in sampling


def test_class_accuracy_is_carried_with_its_noise_band(tmp_path, built):
    """class_accuracy (+ its SE) from the metrics rows reaches sweep.csv, the z test against vanilla and summary.md;
    a sweep without it (the llamagen world: no classifier) has an empty column and no error."""
    shards, metrics = make_sweep(tmp_path)
    for path in metrics:
        values = json.loads(path.read_text())
        drop = 0.3 if path.stem == "lantern-chain-g4-d0.4-k50" else 0.0
        path.write_text(json.dumps({**values, "class_accuracy": 0.9 - drop, "class_accuracy_se": 0.02}))
    main(["--shards", *map(str, shards), "--metrics", *map(str, metrics), "--out", str(tmp_path / "tables")])
    sweep = pd.read_csv(tmp_path / "tables" / "sweep.csv").set_index(["mode", "point"])
    assert sweep.loc[("greedy", "lantern-chain-g4-d0.4-k50"), "class_accuracy"] == pytest.approx(0.6)
    assert sweep.loc[("greedy", "lantern-chain-g4-d0.4-k50"), "class_accuracy_z"] == pytest.approx(-0.3 / (0.02 * 2 ** 0.5))
    assert sweep.loc[("greedy", "exact-chain-g4"), "class_accuracy_z"] == pytest.approx(0.0)
    greedy = (tmp_path / "tables" / "summary.md").read_text().split("## greedy")[1].split("## sampling")[0]
    assert "| Class acc. ↑ |" in greedy and "| 0.600† |" in greedy and "| 0.900 |" in greedy
    assert "class_accuracy ±0.057" in greedy
    plain = pd.read_csv(built / "tables" / "sweep.csv")
    assert plain["class_accuracy"].isna().all() and plain["class_accuracy_z"].isna().all()


def test_hpsv2_is_carried_with_its_noise_band_where_measured(tmp_path, built):
    """hpsv2 (+ its per-image SEM) from the metrics rows reaches sweep.csv, the z test against vanilla and summary.md's
    column and band; a mode (or a sweep) that did not measure it shows no HPS column."""
    shards, metrics = make_sweep(tmp_path)
    for path in metrics:
        if path.parent.name == "sampling":
            drop = 0.05 if path.stem == "lantern-chain-g4-d0.4-k50" else 0.0
            path.write_text(json.dumps({**json.loads(path.read_text()), "hpsv2": 0.28 - drop, "hpsv2_sem": 0.01,
                                        "hpsv2_model": "ViT-H-14"}))
    main(["--shards", *map(str, shards), "--metrics", *map(str, metrics), "--out", str(tmp_path / "tables")])
    sweep = pd.read_csv(tmp_path / "tables" / "sweep.csv").set_index(["mode", "point"])
    assert sweep.loc[("sampling", "lantern-chain-g4-d0.4-k50"), "hpsv2"] == pytest.approx(0.23)
    assert sweep.loc[("sampling", "lantern-chain-g4-d0.4-k50"), "hpsv2_z"] == pytest.approx(-0.05 / (0.01 * 2 ** 0.5))
    assert sweep.loc[("sampling", "exact-chain-g4"), "hpsv2_z"] == pytest.approx(0.0)
    assert sweep.loc["greedy", "hpsv2"].isna().all()
    text = (tmp_path / "tables" / "summary.md").read_text()
    greedy, sampling = text.split("## greedy")[1].split("## sampling")[0], text.split("## sampling")[1]
    header, rule = [line for line in sampling.splitlines() if line.startswith("|")][:2]
    assert "| CLIP cos ↑ | HPS v2.1 ↑ | Precision ↑ |" in header and header.count("|") == rule.count("|") == 17
    row = next(line for line in sampling.splitlines() if "δ=0.4, k=50" in line)
    assert "| 0.2300† |" in row and "| 0.2800 |" in next(line for line in sampling.splitlines() if "Exact SD" in line)
    assert "hpsv2 ±0.0283." in sampling and "hpsv2_model = ViT-H-14" in sampling
    assert "LANTERN chain γ=4, δ=0.4, k=50 (fid, precision, recall, clip_score, hpsv2)" in sampling
    assert "HPS" not in greedy and "hpsv2" not in greedy
    plain = (built / "tables" / "summary.md").read_text()  # no mode measured it: no column anywhere
    assert not any("HPS" in line for line in plain.splitlines() if line.startswith("|"))


def test_summary_ends_with_each_toy_worlds_ambiguity_and_class_accuracy(tmp_path):
    shards, metrics = make_sweep(tmp_path, n_images=2)
    rows = {"source": ["samples", "samples", "heldout"], "cfg_scale": [1.0, 2.0, 1.0], "images": [256, 256, 512],
            "steps": [16384, 16384, 32768], "mean_top1": [0.21, 0.24, 0.2], "median_top1": [0.2, 0.2, 0.2],
            "frac_top1_below_0.2": [0.6, 0.5, 0.55], "mean_entropy": [3.1, 2.9, 3.0]}
    for world, extra in {"default": {"class_accuracy": [0.41, 0.86, 0.97], "class_accuracy_se": [0.03, 0.02, 0.01]},
                         "clean": {}}.items():
        (tmp_path / "toy" / world).mkdir(parents=True)
        pd.DataFrame({**rows, **extra}).to_csv(tmp_path / "toy" / world / "ambiguity.csv", index=False)
    main(["--shards", *map(str, shards), "--metrics", *map(str, metrics), "--out", str(tmp_path / "tables"),
          "--worlds", str(tmp_path / "toy" / "default" / "ambiguity.csv"), str(tmp_path / "toy" / "clean" / "ambiguity.csv")])
    text = (tmp_path / "tables" / "summary.md").read_text()
    section = text[text.index("## Toy worlds"):]
    assert "| default | samples | 2 | 0.240 | 50% | 2.90 | 0.860 ± 0.020 | 256 |" in section
    assert "| default | heldout | 1 | 0.200 | 55% | 3.00 | 0.970 ± 0.010 | 512 |" in section
    assert "| clean | samples | 1 | 0.210 | 60% | 3.10 | — | 256 |" in section  # no classifier in that world
    main(["--shards", *map(str, shards), "--metrics", *map(str, metrics), "--out", str(tmp_path / "bare")])
    assert "## Toy worlds" not in (tmp_path / "bare" / "summary.md").read_text()


def steps_for(forwards: int) -> list[int]:
    """Accepted drafts per round of a 16-token image that took `forwards` target forwards (the prefill one of them):
    the tokens after the prefill's spread over the rounds, the last round ending on the image's end."""
    rounds = forwards - 1
    drafts = N_TOKENS - 1 - (rounds - 1)  # every round but the last also emits its target token
    return [drafts // rounds + (i < drafts % rounds) for i in range(rounds)]


def round_point(tmp_path, name="exact", compiled=False):
    """A hand-made point of a batch-2 job: images 0-3 decoded alone (plain AR alone on 0 and 2), images 4-7 in two
    batches (plain AR on the first); times grow with the rounds, as a decoder's do."""
    spec = POINTS["exact-chain-g4"] if name == "exact" else POINTS["vanilla"]
    point = "exact-chain-g4" if name == "exact" else "vanilla"
    base = stats_row(0, point, "sampling", spec, np.random.default_rng(0))
    forwards = [5, 9, 6, 4, 7, 5, 8, 6] if name == "exact" else [N_TOKENS] * 8
    rows = []
    for i, f in enumerate(forwards):
        steps = steps_for(f) if name == "exact" else []
        draft, verify, other = (0.0 if compiled else 0.0003 * f), 0.001 * f + 0.0004 * (i % 3), 0.0001 * f
        alone, timed = i < 4, (i < 4 and i % 2 == 0) or i in (4, 5)
        plain = 0.016 + 0.001 * (i % 3) if name == "exact" and timed else math.nan
        total = draft + verify + other
        rows.append({**base, "image_index": i, "target_forwards": f, "accepted_per_step": " ".join(map(str, steps)),
                     "accepted_total": sum(steps), "tree_depth": " ".join("4" for _ in steps),
                     "time_draft_s": draft, "time_verify_s": verify, "time_other_s": other, "time_total_s": total,
                     "batch_size": 1 if alone else 2, "latency_s": total if alone else math.nan,
                     "vanilla_latency_s": plain if alone else math.nan,
                     "vanilla_time_total_s": math.nan if alone else plain})
    folder = tmp_path / "gen" / "sampling" / point / "shard0"
    write_shard(folder, "sampling", point, spec, list(range(8)), rows)
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "batch_size": 2, "compile": compiled}))
    return folder, pd.DataFrame(rows)


def test_round_cost_is_tau_over_the_in_job_speedup_on_the_same_images(tmp_path):
    """round_cost_ar = (the method's time / its target forwards) / (plain AR's time / its tokens), both in one job:
    at batch 1 over every image decoded alone (plain AR on some), at the job's batch over the images that carry plain
    AR's time (as the speed-ups pair them); it equals tau / speed-up with tau on those images. The headline follows
    the headline speed-up; plain AR is 1 by definition, with no SE."""
    folder, stats = round_point(tmp_path)
    van, _ = round_point(tmp_path, "vanilla")
    sweep, _, _, rounds = sweep_table([folder, van], [])
    row = sweep.set_index("point").loc["exact-chain-g4"]
    alone, batched = stats[stats["batch_size"] == 1], stats[stats["batch_size"] == 2]
    paired = batched[batched["vanilla_time_total_s"].notna()]
    b1 = (alone["time_total_s"].mean() / alone["target_forwards"].mean()) / (alone["vanilla_latency_s"].mean() / 16)
    in_job = ((paired["time_total_s"].mean() / paired["target_forwards"].mean())
              / (paired["vanilla_time_total_s"].mean() / 16))
    assert row["round_cost_ar_b1"] == pytest.approx(b1) and row["round_cost_ar_in_job"] == pytest.approx(in_job)
    tau_alone, tau_paired = 16 / alone["target_forwards"].mean(), 16 / paired["target_forwards"].mean()
    assert row["round_cost_ar_b1"] == pytest.approx(tau_alone / row["speedup_b1_in_job"])
    assert row["round_cost_ar_in_job"] == pytest.approx(tau_paired / row["speedup_vs_in_job_vanilla"])
    assert row["speedup_kind"] == "in-job, batch 1" and row["round_cost_ar"] == row["round_cost_ar_b1"]
    assert row["round_cost_ar_se"] == row["round_cost_ar_b1_se"] > 0 and row["round_cost_ar_in_job_se"] > 0
    vanilla = sweep.set_index("point").loc["vanilla"]
    assert vanilla["round_cost_ar"] == vanilla["round_cost_ar_b1"] == vanilla["round_cost_ar_in_job"] == 1.0
    assert math.isnan(vanilla["round_cost_ar_se"])
    # rounds.csv: the same costs, a round's ms per section summing to its whole, plain AR's ms per token beside it
    at = rounds[rounds["point"] == "exact-chain-g4"].set_index("batch_size")
    assert at.loc[1, "round_cost_ar"] == pytest.approx(b1) and at.loc[2, "round_cost_ar"] == pytest.approx(in_job)
    assert at.loc[1, "round_ms"] == pytest.approx(1e3 * alone["time_total_s"].sum() / alone["target_forwards"].sum())
    assert at.loc[1, "ar_token_ms"] == pytest.approx(1e3 * alone["vanilla_latency_s"].mean() / 16)
    assert (at["round_ms"] / at["ar_token_ms"]).tolist() == pytest.approx(at["round_cost_ar"].tolist())
    assert (at[["draft_ms", "verify_ms", "other_ms"]].sum(axis=1)).tolist() == pytest.approx(at["round_ms"].tolist())
    assert at["images"].tolist() == [4, 2] and (at["split"] == "sections").all()
    plain = rounds[rounds["point"] == "vanilla"]
    assert (plain["round_cost_ar"] == 1.0).all() and (plain["round_ms"] == plain["ar_token_ms"]).all()
    cells = next(r for r in summary_markdown(sweep, TableParams()).splitlines() if r.startswith("| Exact SD"))
    assert f"| {row['round_cost_ar_b1']:.2f} ± {row['round_cost_ar_b1_se']:.2f} |" in cells


def test_round_cost_se_matches_the_delta_method():
    """Independent times: log R = log m - log f - log a, so SE(R)^2 ~ R^2 (var(m/m̄ - f/f̄) / n + var a / (n_a ā^2)),
    the method's time and rounds varying together per image (plain AR on every other image)."""
    from lantern.metrics.speed import round_cost, round_cost_se

    rng = np.random.default_rng(2)
    n = 400
    forwards = rng.integers(20, 40, n).astype(float)
    method = 0.004 * forwards * rng.normal(1.0, 0.05, n)
    plain = np.where(np.arange(n) % 2 == 0, rng.normal(0.064, 0.006, n), np.nan)
    r = round_cost(plain, method, forwards, 64, paired=False)
    a = np.nanmean(plain)
    u = method / method.mean() - forwards / forwards.mean()
    delta = r * math.sqrt(u.var(ddof=1) / n + np.nanvar(plain, ddof=1) / (n / 2 * a**2))
    assert r == pytest.approx((method.mean() / forwards.mean()) / (a / 64))
    assert round_cost_se(plain, method, forwards, 64, paired=False) == pytest.approx(delta, rel=0.15)
    assert math.isnan(round_cost_se(np.where(np.arange(n) == 0, 0.06, np.nan), method, forwards, 64, paired=False))


def test_a_round_run_as_one_compiled_call_is_not_split(tmp_path):
    """A compiled job's graph rounds time the whole call as verify (no draft section): rounds.csv says "one call"."""
    folder, _ = round_point(tmp_path, compiled=True)
    sweep, _, _, rounds = sweep_table([folder], [])
    assert (rounds["split"] == "one call").all() and bool(sweep["compiled"].iloc[0])
    eager, _ = round_point(tmp_path / "eager")
    assert (sweep_table([eager], [])[3]["split"] == "sections").all()
