"""`lantern sample --batch-size`: index-aligned batches give the images of one-by-one decoding, resume whole
batches, and time batch-1 latency on request; shard boundaries fall on batch multiples."""
import json
import math
from types import SimpleNamespace

import pandas as pd
import pytest

import lantern.pipeline.sample as sample_module
from lantern.pipeline.config import shard_alignment, shard_ranges
from lantern.pipeline.sample import aligned_batches, main as sample
from lantern.metrics.speed import speedup_se
from lantern.pipeline.tables import TableParams, speed_columns, summary_markdown, sweep_table
from tiny import one_thread, save_world, tiny_target  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("one_thread")
EXACT = '{"name": "exact", "drafting": "chain", "gamma": 3}'


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return save_world(tmp_path_factory.mktemp("batched"), tiny_target("c2i"))


def draw(world, out, *extra, method=EXACT, start=0, end=5):
    sample(["--target", str(world / "target.pt"), "--vq", str(world / "vq.pt"), "--drafter", str(world / "drafter.pt"),
            "--method", method, "--sampling", '{"cfg_scale": 2.0}', "--seed", "3", "--start", str(start),
            "--end", str(end), "--out", str(out), "--device", "cpu", "--threads", "1", "--no-warmup", *extra])
    return pd.read_csv(out / "stats.csv", keep_default_na=False)


def count_decodes(monkeypatch) -> list[int]:
    """The sizes of the batches every Decoder built from now on decodes (its `run` calls), in order."""
    decoded = []
    real_init = sample_module.Decoder.__init__

    def spy(self, *a, **kw):
        real_init(self, *a, **kw)
        run = self.run
        self.run = lambda cond, generators, mask=None: decoded.append(len(generators)) or run(cond, generators, mask)

    monkeypatch.setattr(sample_module.Decoder, "__init__", spy)
    return decoded


def test_aligned_batches_and_shard_ranges():
    assert aligned_batches(0, 5, 3) == [[0, 1, 2], [3, 4]]
    assert aligned_batches(4, 11, 4) == [[4, 5, 6, 7], [8, 9, 10]]
    assert aligned_batches(5, 7, 4) == [[5, 6], ]  # a range inside one aligned block
    assert aligned_batches(2, 4, 1) == [[2], [3]]
    assert aligned_batches(4, 4, 2) == []  # every image of the range decoded alone
    assert shard_ranges(200, 2) == [(0, 100), (100, 200)]
    assert shard_ranges(200, 2, 8) == [(0, 96), (96, 200)]
    assert shard_ranges(10, 3, 1) == [(0, 3), (3, 6), (6, 10)]
    assert shard_alignment({"batch_size": {"greedy": 4, "sampling": 6}}) == 12


@pytest.mark.parametrize("method", ['{"name": "vanilla"}', EXACT])
def test_a_batch_draws_the_images_of_one_by_one_decoding(world, tmp_path, method):
    alone = draw(world, tmp_path / "alone", method=method)
    batched = draw(world, tmp_path / "batched", "--batch-size", "3", method=method)
    assert batched.tokens.tolist() == alone.tokens.tolist()
    assert batched.batch_size.tolist() == [3, 3, 3, 2, 2] and (alone.batch_size == 1).all()
    for i in range(5):
        png = f"images/{i:06d}.png"
        assert (tmp_path / "batched" / png).read_bytes() == (tmp_path / "alone" / png).read_bytes()
    assert json.loads((tmp_path / "batched" / "manifest.json").read_text())["batch_size"] == 3


def test_a_killed_job_redoes_its_unfinished_batch_in_full(world, tmp_path, monkeypatch):
    real_save, saved = sample_module.save_png, []

    def save_then_die(array, path):
        if len(saved) == 4:  # the first batch of 3 is complete, the second one half written
            raise KeyboardInterrupt
        saved.append(path)
        return real_save(array, path)  # the digest its row records

    with monkeypatch.context() as m:
        m.setattr(sample_module, "save_png", save_then_die)
        with pytest.raises(KeyboardInterrupt):
            draw(world, tmp_path / "out", "--batch-size", "3", end=6)
    decoded = count_decodes(monkeypatch)
    resumed = draw(world, tmp_path / "out", "--batch-size", "3", end=6)
    assert decoded == [3]  # the finished batch kept, the half-written one decoded again in full
    assert resumed.tokens.tolist() == draw(world, tmp_path / "whole", "--batch-size", "3", end=6).tokens.tolist()


def test_latency_images_are_decoded_alone_once_and_reach_the_tables(world, tmp_path, monkeypatch):
    """--latency-images 2 at batch 2: images 0 and 1 are decoded alone (batch 1), only there, and images 2..5 in two
    batches; the tables take batch-1 latency from the first, the batched columns from the second."""
    decoded = count_decodes(monkeypatch)
    root = tmp_path / "gen" / "sampling"
    for point, method in (("vanilla", '{"name": "vanilla"}'), ("exact-chain-g3", EXACT)):
        decoded.clear()
        stats = draw(world, root / point / "shard0", "--batch-size", "2", "--latency-images", "2", "--in-job-vanilla",
                     method=method, end=6)
        assert decoded == [2, 2, 1, 1]  # every image once: two batches, then the images alone
        assert stats["batch_size"].tolist() == [1, 1, 2, 2, 2, 2]
        timed = stats["latency_s"] != ""
        assert timed.tolist() == [True, True, False, False, False, False]
        assert stats.loc[timed, "latency_s"].astype(float).tolist() == stats.loc[timed, "time_total_s"].tolist()
        assert ("vanilla_latency_s" in stats) == (point != "vanilla")
        assert stats.tokens.tolist() == draw(world, tmp_path / point, method=method, end=6).tokens.tolist()
    sweep, _, _, _ = sweep_table([root / p / "shard0" for p in ("vanilla", "exact-chain-g3")], [])
    row = sweep.set_index("point").loc["exact-chain-g3"]
    stats = pd.read_csv(root / "exact-chain-g3" / "shard0" / "stats.csv")
    alone, batched = stats.iloc[:2], stats.iloc[2:]
    assert row["batch_size"] == 2 and row["latency_b1_images"] == 2 and row["n_images"] == 6
    assert row["latency_b1_s_per_image"] == pytest.approx(alone["latency_s"].mean())
    assert row["speedup_b1_in_job"] == pytest.approx(alone["vanilla_latency_s"].mean() / alone["latency_s"].mean())
    assert row["speedup_b1_in_job_se"] == speedup_se(alone["vanilla_latency_s"], alone["latency_s"], paired=False)
    assert row["latency_s_per_image"] == pytest.approx(batched["time_total_s"].mean())
    assert row["time_verify_s_per_image"] == pytest.approx(batched["time_verify_s"].mean())
    assert row["speedup_vs_in_job_vanilla"] == pytest.approx(batched["vanilla_time_total_s"].mean()
                                                             / batched["time_total_s"].mean())
    assert row["tau_incl_bonus"] == pytest.approx(stats["n_tokens"].sum() / stats["target_forwards"].sum())
    assert sweep.set_index("point").loc["vanilla", "speedup_b1_in_job"] == 1.0
    # a round's cost in plain-AR tokens: tau over the images alone / their batch-1 speed-up; the real timer sections
    # add up to the round's time
    tau_alone = alone["n_tokens"].sum() / alone["target_forwards"].sum()
    assert row["round_cost_ar_b1"] == pytest.approx(tau_alone / row["speedup_b1_in_job"])
    assert row["round_cost_ar"] == row["round_cost_ar_b1"] and row["round_cost_ar_b1_se"] > 0
    rounds = sweep_table([root / p / "shard0" for p in ("vanilla", "exact-chain-g3")], [])[3]
    at = rounds[rounds["point"] == "exact-chain-g3"].set_index("batch_size")
    assert at.index.tolist() == [1, 2] and (at["split"] == "sections").all()
    assert at[["draft_ms", "verify_ms", "other_ms"]].sum(axis=1).tolist() == pytest.approx(at["round_ms"].tolist())
    assert (at[["draft_ms", "verify_ms"]] > 0).all().all()
    # batch-1 latency, timed at every point, is the headline; the batched in-job ratio comes second
    assert (sweep["speedup_kind"] == "in-job, batch 1").all()
    assert row["speedup"] == row["speedup_b1_in_job"] and row["speedup"] != row["speedup_vs_in_job_vanilla"]
    assert row["speedup_se"] == row["speedup_b1_in_job_se"] > 0
    assert math.isnan(sweep.set_index("point").loc["vanilla", "speedup_se"])
    cells = next(r for r in summary_markdown(sweep, TableParams()).splitlines() if r.startswith("| Exact SD"))
    assert f"{row['speedup_b1_in_job']:.2f}× ± {row['speedup_b1_in_job_se']:.2f}" in cells
    assert list(speed_columns(sweep)) == ["In-job speed-up (batch 1)", "In-job speed-up (batch 2)",
                                          "Speed-up across jobs (batch 2)"]


def test_a_range_decoded_alone_leaves_the_batched_columns_empty(world, tmp_path):
    """Every image of the range alone (--latency-images >= its size): batch-1 latency only, no batched time."""
    root = tmp_path / "gen" / "sampling"
    sample(["--target", str(world / "target.pt"), "--vq", str(world / "vq.pt"), "--drafter", str(world / "drafter.pt"),
            "--method", EXACT, "--seed", "3", "--end", "4", "--out", str(root / "exact-chain-g3" / "shard0"), "--device",
            "cpu", "--threads", "1", "--batch-size", "2", "--latency-images", "4", "--in-job-vanilla"])  # warm-up on
    row = sweep_table([root / "exact-chain-g3" / "shard0"], [])[0].iloc[0]
    assert row["batch_size"] == 2 and row["latency_b1_images"] == 4 and row["speedup_b1_in_job"] > 0
    assert math.isnan(row["latency_s_per_image"]) and math.isnan(row["speedup_vs_in_job_vanilla"])


def test_in_job_vanilla_every_prices_plain_ar_alone_on_one_latency_image_per_block(world, tmp_path):
    root = tmp_path / "gen" / "sampling"
    stats = draw(world, root / "exact-chain-g3" / "shard0", "--batch-size", "2", "--latency-images", "4",
                 "--in-job-vanilla", "--in-job-vanilla-every", "2", end=6)
    plain = [v != "" for v in stats["vanilla_latency_s"]]
    assert plain == [sample_module.reference_batch(i, 1, 2) for i in range(4)] + [False, False]
    assert plain[:2].count(True) == 1 and plain[2:4].count(True) == 1  # one of each block of two
    assert (stats["latency_s"][:4] != "").all()  # the method alone on every latency image
    row = sweep_table([root / "exact-chain-g3" / "shard0"], [])[0].iloc[0]
    stats = pd.read_csv(root / "exact-chain-g3" / "shard0" / "stats.csv")
    assert row["latency_b1_images"] == 4
    assert row["speedup_b1_in_job"] == pytest.approx(stats["vanilla_latency_s"].dropna().mean()
                                                     / stats["latency_s"].dropna().mean())


def test_in_job_vanilla_every_times_the_same_batches_in_any_shard(world, tmp_path):
    """Plain AR is timed on one global batch (first image // B) of each pair, here batches 1 and 2: a shard starting
    mid-way agrees, the images are those of a run timing every batch, and the in-job speed-up pairs the timed batches
    only."""
    every = ["--batch-size", "2", "--in-job-vanilla", "--in-job-vanilla-every", "2"]
    whole = draw(world, tmp_path / "gen" / "sampling" / "exact-chain-g3" / "shard0", *every, end=7)
    assert (whole["vanilla_time_total_s"] != "").tolist() == [False, False, True, True, True, True, False]
    tail = draw(world, tmp_path / "tail", *every, start=4, end=7)
    assert (tail["vanilla_time_total_s"] != "").tolist() == [True, True, False]
    assert whole.tokens.tolist() == draw(world, tmp_path / "all", "--batch-size", "2", "--in-job-vanilla",
                                         end=7).tokens.tolist()
    sweep, _, _, _ = sweep_table([tmp_path / "gen" / "sampling" / "exact-chain-g3" / "shard0"], [])
    stats = pd.read_csv(tmp_path / "gen" / "sampling" / "exact-chain-g3" / "shard0" / "stats.csv")
    paired = stats["vanilla_time_total_s"].notna()
    assert sweep["speedup_vs_in_job_vanilla"].iloc[0] == pytest.approx(
        stats.loc[paired, "vanilla_time_total_s"].mean() / stats.loc[paired, "time_total_s"].mean())


@pytest.mark.parametrize("every", [1, 2, 3, 5])
def test_reference_batches_are_one_per_block_at_drawn_offsets(every):
    """1/N of the batches, one in each block of N; the offsets vary, so labels that cycle every 2 batches (16 toy
    classes at batch 8) are not always timed on the same half."""
    timed = [b for b in range(60) if sample_module.reference_batch(b * 8, 8, every)]
    assert [b // every for b in timed] == list(range(60 // every))
    assert len({b % every for b in timed}) == every
    if every == 2:
        assert 0.25 < sum(b % 2 for b in timed) / len(timed) < 0.75


@pytest.mark.parametrize("compiled, latency, expected", [
    (False, 2, [("run", 1), ("ref", 1)]),  # eager: one-time costs are per process, one image pays them
    (True, 0, [("run", 3), ("ref", 3)]),  # compiled: graphs are per shape, the whole batch
    (True, 2, [("run", 3), ("ref", 3), ("run", 1), ("ref", 1)]),  # ... and batch 1 for the images timed alone
])
def test_the_warm_up_decodes_what_the_timed_decodes_need(compiled, latency, expected):
    calls = []
    decoder = SimpleNamespace(compile=compiled, run=lambda c, g, m: calls.append(("run", len(g))),
                              reference=lambda c, g, m: calls.append(("ref", len(g))))
    args = SimpleNamespace(seed=0, latency_images=latency)
    sample_module.warm_up(decoder, lambda images: (images, None), [0, 1, 2], args, reference=True)
    assert calls == expected


def test_compiled_vanilla_draws_the_eager_images(world, tmp_path):
    """--compile true runs plain AR's decode step through torch.compile (inductor here): the same images."""
    eager = draw(world, tmp_path / "eager", "--batch-size", "3", method='{"name": "vanilla"}')
    built = draw(world, tmp_path / "compiled", "--batch-size", "3", "--compile", "true", method='{"name": "vanilla"}')
    assert built.tokens.tolist() == eager.tokens.tolist()
    assert json.loads((tmp_path / "compiled" / "manifest.json").read_text())["compile"] is True
