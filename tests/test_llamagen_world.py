"""The paper's recipes on a llamagen-shaped world built from scratch (tests/llamagen_world.py): the whole t2i DAG
(prompts from a COCO annotation file, T5 caption features, drafter data and training, neighbours, generation for
vanilla / exact / LANTERN / LANTERN++, metrics, tables, figures, report) and the c2i recipe's plan, with the
recipes scaled down by an overlay that only points at the fakes and shrinks the sweep."""
import json
import subprocess
import sys

import pandas as pd
import pytest
import yaml
from conftest import REPO, run_logged, tail

from llamagen_world import CAPTIONS, GPT_SIZE, build_world

pytestmark = pytest.mark.slow
T2I_RECIPE = REPO / "config" / "llamagen-t2i.yaml"
C2I_RECIPE = REPO / "config" / "llamagen-c2i.yaml"
POINTS = ["vanilla", "vanilla-control", "exact-chain-g3", "lantern-chain-g3-d0.2-k50",
          "lanternpp-static-naive_extend_57-l5-k50"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("llamagen_world"))


def overlay(world: dict, model_type: str) -> dict:
    """What a user with the real files changes in a recipe (paths), plus a sweep small enough for a CPU."""
    drafter = ({"images": world["drafter_images"], "layout": "captions"} if model_type == "t2i" else
               {"images": world["class_images"], "layout": "classes"})
    return {
        "outdir": "results", "device": "cpu", "dtype": "fp32", "threads": 1,
        "llamagen": {
            "gpt_ckpt": world[model_type], "gpt_size": GPT_SIZE, "vq_ckpt": world["vq"], "authors_drafter": "",
            **({"num_classes": 10} if model_type == "c2i" else {}),
            "prompts": {"coco_captions": world["coco"]}, "t5": {"path": world["t5"], "dtype": "fp32"},
            "drafter": {**drafter, "n_images": 8, "shards": 2, "train": {"epochs": 1, "batch_size": 4}},
        },
        "neighbours": {"max_k": 50},
        "sweep": {"n_images": 4, "shards": 2, "in_job_vanilla": True, "modes": ["sampling"],
                  "batch_size": {"sampling": 2, "greedy": 2}, "latency_images": 2, "methods": [
            {"name": "vanilla"},
            {"name": "exact", "drafting": "chain", "gamma": 3},
            {"name": "lantern", "drafting": "chain", "gamma": 3, "delta": 0.2, "k": 50},
            {"name": "lanternpp", "drafting": "static", "lam": 5, "k": 50},
        ]},
        "metrics": {"reference": world["reference"], "inception_weights": world["inception"], "vgg16_weights": "",
                    "clip_model": "toy", "clip_ckpt": ""},
        # the proximity check end to end on the vanilla point's tokens, at the smallest size that shows a shift
        "proximity": {"fractions": [0.5], "ranks": [1, "random"]},
    }


def snakemake(workdir, recipe, over: dict, *args):
    path = workdir / "overlay.yaml"
    path.write_text(yaml.safe_dump(over))
    return [sys.executable, "-m", "snakemake", "--workflow-profile", "none", "--snakefile", str(REPO / "Snakefile"),
            "--directory", str(workdir), *args, "--configfile", str(recipe), str(path)]


def test_t2i_recipe_runs_end_to_end(world, tmp_path):
    log = tmp_path / "t2i.log"
    r = run_logged(snakemake(tmp_path, T2I_RECIPE, overlay(world, "t2i"), "--cores", "2"), log, timeout=3600)
    assert r.returncode == 0, tail(log)
    out = tmp_path / "results"
    prompts = pd.read_csv(out / "llamagen" / "prompts.csv")
    assert list(prompts["caption"]) == CAPTIONS[:4]  # each image's longest caption, images in annotation order
    stats = pd.concat(pd.read_csv(f) for f in sorted((out / "gen" / "sampling" / "lantern-chain-g3-d0.2-k50").glob("shard*/stats.csv")))
    assert list(stats["caption"]) == list(prompts["caption"])  # image i carries prompt row i, across shards
    sweep = pd.read_csv(out / "tables" / "sweep.csv").set_index("point")
    assert set(POINTS) <= set(sweep.index)
    assert (sweep.loc[POINTS, "fid"] >= 0).all() and sweep.loc[POINTS, "clip_score"].notna().all()
    # shard 1 decoded in a batch of 2 with ragged caption masks; shard 0's two images alone (batch-1 latency)
    assert (sweep["batch_size"] == 2).all() and (sweep["latency_b1_images"] == 2).all()
    assert sweep["latency_s_per_image"].notna().all()
    assert (out / "llamagen" / "drafter" / "trained.pt").is_file()
    report = tmp_path / "report.html"
    r = run_logged(snakemake(tmp_path, T2I_RECIPE, overlay(world, "t2i"), "--report", str(report)), log, timeout=3600)
    assert r.returncode == 0 and report.stat().st_size > 100_000, tail(log)

    # The authors' released drafter instead of a trained one: the convert_drafter rule, then a decode with it.
    over = overlay(world, "t2i")
    over["llamagen"]["authors_drafter"] = world["authors_drafter"]
    converted = out / "llamagen" / "drafter" / "converted.pt"
    r = run_logged(snakemake(tmp_path, T2I_RECIPE, over, "--cores", "1", str(converted.relative_to(tmp_path))), log,
                   timeout=3600)
    assert r.returncode == 0 and converted.is_file(), tail(log)
    spec = ["--target-spec", json.dumps({"model_type": "t2i", "gpt_size": GPT_SIZE, "image_tokens": 256})]
    r = subprocess.run([sys.executable, "-m", "lantern", "sample", "--target", world["t2i"], *spec, "--vq", world["vq"],
                        "--drafter", str(converted), "--captions", str(out / "llamagen" / "captions" / "shard0.pt"),
                        "--method", '{"name": "exact", "drafting": "chain", "gamma": 3}', "--end", "1",
                        "--sampling", '{"cfg_scale": 7.5, "top_k": 1000}', "--device", "cpu", "--threads", "1",
                        "--out", str(tmp_path / "authors")], cwd=REPO, capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert pd.read_csv(tmp_path / "authors" / "stats.csv")["caption"].tolist() == CAPTIONS[:1]


def test_c2i_recipe_plans_the_paper_sweep(world, tmp_path):
    over = overlay(world, "c2i")
    del over["sweep"], over["neighbours"]  # the recipe's own sweep and k: every point of the paper's grid
    r = subprocess.run(snakemake(tmp_path, C2I_RECIPE, over, "-n", "--quiet", "rules"), cwd=REPO,
                       capture_output=True, text=True, timeout=3600)  # a hang guard only
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for rule in ("drafter_images", "train_drafter", "neighbours", "generate", "evaluate", "tables"):
        assert rule in r.stdout, rule


def test_c2i_recipe_runs_with_imagenet_class_captions(world, tmp_path):
    """Class folders -> drafter, class-conditional sampling, CLIP captions from the ImageNet class names."""
    over = overlay(world, "c2i")
    over["sweep"].update(shards=1, in_job_vanilla=False, methods=[
        {"name": "vanilla"}, {"name": "lantern", "drafting": "dynamic", "delta": 0.2, "k": 50}])
    log = tmp_path / "c2i.log"
    r = run_logged(snakemake(tmp_path, C2I_RECIPE, over, "--cores", "2"), log, timeout=3600)
    assert r.returncode == 0, tail(log)
    out = tmp_path / "results"
    stats = pd.read_csv(out / "gen" / "sampling" / "lantern-dynamic-d0.2-k50" / "shard0" / "stats.csv")
    assert list(stats["label"]) == [0, 1, 2, 3]  # labels cycle through the classes
    row = json.loads((out / "metrics" / "sampling" / "lantern-dynamic-d0.2-k50.json").read_text())
    assert "ImageNet-1k class names" in row["caption_source"] and row["clip_score"] >= 0
    assert row["resize_filter"] == "PIL lanczos" and row["reference_kind"] == "image folder"


@pytest.mark.parametrize("recipe", [T2I_RECIPE, C2I_RECIPE])
def test_a_recipe_without_its_files_names_the_first_missing_key(recipe):
    r = subprocess.run([sys.executable, "-m", "lantern", "check-config", str(REPO / "config" / "config.yaml"),
                        str(recipe)], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "llamagen.gpt_ckpt" in r.stderr and "does not exist" in r.stderr and "Traceback" not in r.stderr
