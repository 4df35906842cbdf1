"""Nothing lost, nothing silently wrong (issue #52): results verify themselves, every key is checked before the
first job, defaults that size themselves cap instead of refusing, devices are checked in one place, and a job's one
error line reaches the user even when its log lies on a full disk. docs/running.md#guarantees lists what each test
here holds."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image

from lantern.pipeline.cli import main as cli
from test_bad_inputs import CONFIG, TOY, assert_one_line, config_file, lantern_cmd, merge, run
from test_tables import make_sweep

REPO = Path(__file__).resolve().parents[1]


# -- results that verify themselves ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shard(tmp_path_factory) -> Path:
    """A real `lantern sample` shard of 4 toy images (plain AR, one batch), as the generate rule writes it."""
    out = tmp_path_factory.mktemp("gen") / "gen" / "sampling" / "vanilla" / "shard0"
    rc = cli(["sample", "--target", str(TOY / "target.pt"), "--vq", str(TOY / "vq.pt"), "--end", "4",
              "--batch-size", "4", "--out", str(out), "--device", "cpu", "--threads", "1"])
    assert rc == 0
    return out


def damaged_copy(shard: Path, tmp: Path, damage) -> Path:
    copy = tmp / "gen" / "sampling" / "vanilla" / "shard0"
    shutil.copytree(shard, copy)
    damage(copy)
    return copy


def evaluate_args(shard: Path, out: Path) -> list[str]:
    # the reference is never read: the shard's check comes first
    return ["evaluate", "--images", str(shard / "images"), "--reference", str(TOY / "vq.pt"), "--out", str(out),
            "--params", '{"clip": {"enabled": false}}']


def test_the_manifest_records_every_image(shard):
    from lantern.io import sha256_file

    record = json.loads((shard / "manifest.json").read_text())["images"]
    assert record["count"] == 4
    assert record["sha256"] == {p.name: sha256_file(p) for p in sorted((shard / "images").glob("*.png"))}


def lose_one(s: Path):
    (s / "images" / "000002.png").unlink()


def change_one(s: Path):
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(s / "images" / "000001.png")


def lose_all(s: Path):
    shutil.rmtree(s / "images")


def add_one(s: Path):
    shutil.copy(s / "images" / "000000.png", s / "images" / "000009.png")


DAMAGES = {"one-png-deleted": (lose_one, r"holds 3 of the 4 images its manifest records \(1 missing, e\.g\. "
                                         r"images/000002\.png\)"),
           "every-png-deleted": (lose_all, r"holds 0 of the 4 images its manifest records \(4 missing"),
           "one-png-changed": (change_one, r"images/000001\.png is not the image its manifest records"),
           "one-png-added": (add_one, r"holds 1 image\(s\) its manifest does not record")}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_evaluate_refuses_a_damaged_shard_naming_it_and_the_redraw(damage, shard, tmp_path, capsys):
    """Before: one PNG deleted, evaluate wrote a row from 3 of 4 images (precision and recall silently skipped)."""
    make, pattern = DAMAGES[damage]
    copy = damaged_copy(shard, tmp_path, make)
    rc = cli(evaluate_args(copy, tmp_path / "row.json"))
    captured = capsys.readouterr()
    assert_one_line(rc, captured.out, captured.err, rf"shard {copy} {pattern}|shard {copy}: {pattern}")
    assert f"redraw it and what was computed from it: add `--forcerun={copy}` to the same snakemake command" \
        in captured.err
    assert not (tmp_path / "row.json").exists()


def test_a_redraw_is_byte_identical(shard, tmp_path):
    """What the redraw line promises: the same command on a deleted shard gives the same images."""
    out = tmp_path / "again"
    assert cli(["sample", "--target", str(TOY / "target.pt"), "--vq", str(TOY / "vq.pt"), "--end", "4",
                "--batch-size", "4", "--out", str(out), "--device", "cpu", "--threads", "1"]) == 0
    assert (json.loads((out / "manifest.json").read_text())["images"]
            == json.loads((shard / "manifest.json").read_text())["images"])


@pytest.fixture
def sweep(tmp_path):
    shards, metrics = make_sweep(tmp_path)
    return tmp_path, shards, metrics


def tables(shards, metrics, out: Path) -> list[str]:
    return ["tables", "--shards", *map(str, shards), "--metrics", *map(str, metrics), "--out", str(out)]


def test_tables_refuse_a_shard_missing_an_image(sweep, capsys):
    root, shards, metrics = sweep
    (shards[0] / "images" / "000001.png").unlink()
    rc = cli(tables(shards, metrics, root / "tables"))
    captured = capsys.readouterr()
    assert_one_line(rc, captured.out, captured.err, rf"shard {shards[0]} holds 2 of the 3 images .* `--forcerun={shards[0]}`")
    assert not (root / "tables").exists()


def test_tables_refuse_metrics_computed_on_another_count(sweep, capsys):
    """A metrics row says how many images it used (n_generated); tables never pair it with shards of another size."""
    root, shards, metrics = sweep
    row = json.loads(metrics[0].read_text())
    metrics[0].write_text(json.dumps({**row, "n_generated": 5}))
    rc = cli(tables(shards, metrics, root / "tables"))
    captured = capsys.readouterr()
    assert_one_line(rc, captured.out, captured.err,
                    r"metrics/greedy/vanilla\.json was computed on 5 images, but the shards of greedy/vanilla hold 6")


def test_summary_says_when_points_differ_in_image_count(sweep):
    root, shards, metrics = sweep
    assert cli(tables(shards, metrics, root / "same")) == 0
    assert "Image counts differ" not in (root / "same" / "summary.md").read_text()
    # one point's second shard gone, and its metrics computed on what is left: legal, but said
    lost = [s for s in shards if s.parts[-3:] == ("sampling", "exact-chain-g4", "shard1")][0]
    kept = [s for s in shards if s != lost]
    for m in metrics:
        if m.parts[-2:] == ("sampling", "exact-chain-g4.json"):
            m.write_text(json.dumps({**json.loads(m.read_text()), "n_generated": 3}))
    assert cli(tables(kept, metrics, root / "mixed")) == 0
    summary = (root / "mixed" / "summary.md").read_text()
    assert "**Image counts differ between points** (3 images: exact-chain-g4; 6 images:" in summary


def test_the_samples_figure_refuses_an_image_it_shows_that_changed(sweep, capsys):
    root, shards, metrics = sweep
    assert cli(tables(shards, metrics, root / "tables")) == 0
    shard = root / "gen" / "sampling" / "vanilla" / "shard0"
    manifest = json.loads((shard / "manifest.json").read_text())
    from lantern.metrics.shards import image_record

    (shard / "manifest.json").write_text(json.dumps({**manifest, "images": image_record(shard, 0, 3)}))
    change_one(shard)
    rc = cli(["figure", "samples", "--tables", str(root / "tables"), "--gen", str(root / "gen"), "--mode", "sampling",
              "--out", str(root / "samples.png")])
    captured = capsys.readouterr()
    assert_one_line(rc, captured.out, captured.err, r"shard .*sampling/vanilla/shard0: images/000001\.png is not the "
                                                    r"image its manifest records")
    assert not (root / "samples.png").exists()


def test_the_samples_figure_refuses_a_damaged_shard(sweep, capsys):
    root, shards, metrics = sweep
    assert cli(tables(shards, metrics, root / "tables")) == 0
    (root / "gen" / "sampling" / "vanilla" / "shard0" / "images" / "000000.png").unlink()
    rc = cli(["figure", "samples", "--tables", str(root / "tables"), "--gen", str(root / "gen"), "--mode", "sampling",
              "--out", str(root / "samples.png")])
    captured = capsys.readouterr()
    assert_one_line(rc, captured.out, captured.err, r"shard .*sampling/vanilla/shard0 holds 2 of the 3 images")
    assert not (root / "samples.png").exists()


# -- every key before the first job ----------------------------------------------------------------------------------
def snakemake_n(*args: str) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "snakemake", "-n", *args])


def check_config(tmp: Path, override: dict) -> subprocess.CompletedProcess:
    path = config_file(tmp, "over.yaml", yaml.safe_dump({"outdir": str(tmp / "out"), **override}))
    return run(lantern_cmd("check-config", CONFIG, path)), path


KEY_CASES = [
    # before: both passed check-config and `snakemake -n`, then failed in the proximity job after toy data,
    # neighbours and tokenize had run, naming `neighbours k`
    ("ranks-repeated", {"proximity": {"ranks": [1, 5, 5, "random"]}},
     r'config: proximity\.ranks = \[1, 5, 5, "random"\] lists 5 twice; list each rank once'),
    ("ranks-above-the-codebook", {"proximity": {"ranks": [1, 5000]}},
     r"config: proximity\.ranks holds 5000, but the toy-default world's codebook has 2048 codes"),
    ("ranks-above-the-clean-codebook", {"proximity": {"ranks": [1, 600, "random"]}},
     r"config: proximity\.ranks holds 600, but the toy-clean world's codebook has 512 codes .* at or below 511"),
    # before: the schema's raw regular expression ("does not match '^(auto|cpu|cuda(:[0-9]+)?)$'")
    ("device-mps", {"device": "mps"}, r"config: device = 'mps': mps devices are not supported; use auto, cpu, cuda"),
    ("device-xpu-index", {"device": "xpu:0"}, r"config: device = 'xpu:0': xpu devices are not supported"),
    ("device-other", {"device": "gpu"}, r"config: device = 'gpu' is not a supported device; use auto, cpu"),
    # an explicit latency_images that leaves batches after it still has to end on a batch boundary
    ("latency-explicit-misfit", {"sweep": {"n_images": 16, "shards": 1, "latency_images": 3,
                                           "batch_size": {"sampling": 4, "greedy": 4}}},
     r"sweep\.latency_images = 3 must be a multiple of every mode's batch size \(4\)"),
]


@pytest.mark.parametrize("override, pattern", [pytest.param(o, p, id=i) for i, o, p in KEY_CASES])
def test_a_key_is_refused_by_check_config_and_snakemake_before_any_job(override, pattern, tmp_path):
    r, path = check_config(tmp_path, override)
    assert_one_line(r.returncode, r.stdout, r.stderr, pattern)
    s = snakemake_n("--cores", "1", "--configfile", path)
    assert_one_line(s.returncode, s.stdout, s.stderr, pattern)
    assert not (tmp_path / "out").exists()


def test_proximity_ranks_within_every_codebook_pass(tmp_path):
    r, _ = check_config(tmp_path, {"proximity": {"ranks": [0, 511, "random"]}})
    assert r.returncode == 0, r.stderr


# -- defaults that cap ----------------------------------------------------------------------------------------------
def test_latency_images_caps_at_the_images_asked_for(tmp_path):
    """The issue's overlay: config.yaml's latency_images 32 (a key the user never set) under n_images 4 and a batch
    of 64 was refused; it now decodes all 4 images alone, as mode_images caps instead of demanding."""
    from lantern.pipeline.config import latency_counts, validate_config

    over = {"sweep": {"n_images": 4, "shards": 1, "batch_size": {"sampling": 64}}}
    r, path = check_config(tmp_path, over)
    assert r.returncode == 0 and r.stdout.startswith("config OK"), r.stderr
    s = snakemake_n("--cores", "1", "--configfile", path)
    assert s.returncode == 0, s.stderr[-2000:]
    cfg = validate_config(merge(yaml.safe_load(Path(CONFIG).read_text()), over))
    assert latency_counts(cfg["sweep"], "sampling") == [4] and latency_counts(cfg["sweep"], "greedy") == [4]


# -- devices, --cores 0 and a job's error line on a full disk --------------------------------------------------------
@pytest.mark.parametrize("device, pattern", [
    ("mps", r"--device 'mps': mps devices are not supported; use auto, cpu, cuda or cuda:<index>"),
    ("xpu", r"--device 'xpu': xpu devices are not supported"),
    ("tpu:1", r"--device 'tpu:1' is not a supported device"),
])
def test_the_cli_refuses_an_unsupported_device_in_one_line(device, pattern, tmp_path, capsys):
    """Before: `lantern sample --device mps` loaded the models and ended in a PyTorch traceback."""
    rc = cli(["sample", "--target", str(TOY / "target.pt"), "--vq", str(TOY / "vq.pt"), "--end", "2",
              "--out", str(tmp_path / "out"), "--device", device])
    captured = capsys.readouterr()
    assert_one_line(rc, captured.out, captured.err, pattern)
    assert not list(tmp_path.iterdir())


def test_a_cuda_index_without_cuda_is_one_line(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    rc = cli(["sample", "--target", str(TOY / "target.pt"), "--vq", str(TOY / "vq.pt"), "--end", "2",
              "--out", str(tmp_path / "out"), "--device", "cuda:1"])
    captured = capsys.readouterr()
    assert_one_line(rc, captured.out, captured.err, r"device 'cuda:1' requested but CUDA is not available here")
    assert not list(tmp_path.iterdir())


def test_cores_0_is_refused_at_parse_time(tmp_path):
    """Before: Snakemake planned a job and waited forever."""
    s = snakemake_n("--cores", "0", "--directory", str(tmp_path))
    assert_one_line(s.returncode, s.stdout, s.stderr, r"--cores 0 gives jobs no core to run on.*use --cores N")
    assert "Job stats" not in s.stdout


def test_a_jobs_error_reaches_stderr_when_its_log_is_on_a_full_disk(tmp_path):
    """A rule runs `lantern ... > {log} 2>&1` behind the Snakefile's shell prefix. With the log on a full disk
    (/dev/full: every write fails with ENOSPC) the job's one line still reaches Snakemake's stderr."""
    from lantern.pipeline.cli import SHELL_PREFIX

    cmd = " ".join(lantern_cmd("sample", "--target", str(TOY / "target.pt"), "--vq", str(TOY / "vq.pt"), "--end", "2",
                               "--out", str(tmp_path / "out"), "--device", "mps"))
    r = subprocess.run(["bash", "-c", f"set -euo pipefail; {SHELL_PREFIX}{cmd} > /dev/full 2>&1"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["error: --device 'mps': mps devices are not supported; use auto, cpu, "
                                             "cuda or cuda:<index>"]


def test_the_snakefile_runs_jobs_behind_the_error_prefix():
    assert "{SHELL_PREFIX}" in (REPO / "workflow" / "rules" / "common.smk").read_text()


# -- every figure renders from any legal table ---------------------------------------------------------------------
TABLE_FIGURES = ["tau_vs_delta", "tradeoff", "heatmap", "tree_depth", "tree_budget", "acceptance_map", "round_anatomy"]
# columns a legal run leaves empty: no speed-up when n_images <= latency_images and in_job_vanilla is false (a small
# llamagen run), no precision / recall below 4 images, no class accuracy outside the toy world, no CLIP score where
# no caption or class name reaches it (FID and KID are always there: evaluate refuses fewer than 2 images)
EMPTY = {"speed-up": ["speedup", "speedup_se"],
         "quality": ["precision", "recall", "precision_se", "recall_se", "clip_score", "class_accuracy"]}
EMPTY["both"] = EMPTY["speed-up"] + EMPTY["quality"]
SPEED_PANELS = ("tau_vs_delta", "tradeoff", "heatmap", "tree_budget")


@pytest.fixture(scope="module")
def legal_tables(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("legal")
    shards, metrics = make_sweep(root)
    assert cli(tables(shards, metrics, root / "tables")) == 0
    return root / "tables"


@pytest.mark.parametrize("empty", list(EMPTY))
@pytest.mark.parametrize("name", TABLE_FIGURES)
def test_every_figure_renders_with_empty_columns(name, empty, legal_tables, tmp_path, capsys):
    """Before: `figure tree_budget` with an empty speed-up column stopped with "Data cannot be log-scaled"."""
    folder = tmp_path / "tables"
    shutil.copytree(legal_tables, folder)
    sweep = pd.read_csv(folder / "sweep.csv")
    sweep[[c for c in EMPTY[empty] if c in sweep]] = float("nan")
    sweep.to_csv(folder / "sweep.csv", index=False)
    rc = cli(["figure", name, "--tables", str(folder), "--out", str(tmp_path / f"{name}.png")])
    assert rc == 0, capsys.readouterr().err
    assert Image.open(tmp_path / f"{name}.png").format == "PNG"
    if name in SPEED_PANELS and empty != "quality":  # the absent speed-up is said, not left blank
        import importlib

        import matplotlib.pyplot as plt

        from lantern.figures import Inputs

        module = importlib.import_module(f"lantern.figures.{name}")
        fig = module.plot(Inputs(tables=folder), module.Params())
        texts = [t.get_text() for t in fig.texts] + [t.get_text() for ax in fig.axes for t in ax.texts]
        texts.append(fig.get_supxlabel())
        plt.close(fig)
        assert any("not measured in this run" in t and "speed-up" in t for t in texts), texts
