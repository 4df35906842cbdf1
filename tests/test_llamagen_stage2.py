"""The stage-II recipe (config/llamagen-t2i-512.yaml, issue #29 item 7) on a llamagen-shaped world written from
scratch at small widths: a 32 x 32-token t2i GPT in the upstream layout and the authors' stage-II drafter layout
(input_type t2i2), planned in full and run end to end on a small sweep; check-config refuses the stage-I files in
it and the stage-II files in the stage-I recipe. (An upstream .pt does not show its token grid: stage-I and stage-II
files hold the same tensors, so only the authors' config.json files can be checked.)"""
import json
import subprocess
import sys

import pandas as pd
import pytest
import torch
from conftest import REPO, run_logged, tail

from lantern.engine.models.checkpoint import save_checkpoint
from lantern.engine.models.model import GPT, ModelArgs
from llamagen_world import GPT_SIZE, build_world, write_authors_drafter
from test_llamagen_world import T2I_RECIPE, overlay

pytestmark = pytest.mark.slow
STAGE2 = REPO / "config" / "llamagen-t2i-512.yaml"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("stage2_world")
    w = build_world(root)
    with open(root / "flan-t5-tiny" / "config.json") as f:
        d_model = json.load(f)["d_model"]
    torch.manual_seed(3)
    gpt = GPT(ModelArgs(**GPT_SIZE, vocab_size=16384, image_tokens=1024, model_type="t2i", cls_token_num=120,
                        caption_dim=d_model))
    save_checkpoint(root / "t2i_tiny_512.pt", gpt, container="model")  # upstream: weights only
    drafter = write_authors_drafter(root / "authors_drafter2", str(root / "t2i_tiny_512.pt"), seed=1)
    config = json.loads((drafter / "config.json").read_text())
    (drafter / "config.json").write_text(json.dumps({**config, "input_type": "t2i2"}))
    stage1 = json.loads((root / "authors_drafter" / "config.json").read_text())
    (root / "authors_drafter" / "config.json").write_text(json.dumps({**stage1, "input_type": "t2i"}))
    return {**w, "t2i2": str(root / "t2i_tiny_512.pt"), "authors_drafter2": str(drafter)}


def stage2_overlay(world, **llamagen) -> dict:
    over = overlay(world, "t2i")
    over["llamagen"].update(gpt_ckpt=world["t2i2"], authors_drafter=world["authors_drafter2"], **llamagen)
    over["neighbours"] = {"max_k": 51}  # the reference residual zeroes k + 1 codes
    over["sweep"].update(n_images=2, shards=1, latency_images=0, in_job_vanilla=False,
                         batch_size={"sampling": 2, "greedy": 2}, methods=[
        {"name": "vanilla"},
        {"name": "lantern", "drafting": "dynamic", "delta": 0.2, "k": 50, "residual": "reference",
         "total_tokens": 6, "depth": 2, "top_k": 2}])
    return over


def snakemake(workdir, over: dict, *args, recipes=(T2I_RECIPE, STAGE2)):
    import yaml

    path = workdir / "overlay.yaml"
    path.write_text(yaml.safe_dump(over))
    return [sys.executable, "-m", "snakemake", "--workflow-profile", "none", "--snakefile", str(REPO / "Snakefile"),
            "--directory", str(workdir), *args, "--configfile", *map(str, recipes), str(path)]


def test_stage2_recipe_plans_the_sweep_and_runs_end_to_end(world, tmp_path):
    full = overlay(world, "t2i")
    full["llamagen"].update(gpt_ckpt=world["t2i2"], authors_drafter=world["authors_drafter2"])
    del full["sweep"], full["neighbours"]  # the recipe's own sweep and k
    # the recipe's 5000 images need 5000 captions before any job starts (check-config counts them)
    coco = tmp_path / "captions_5000.json"
    coco.write_text(json.dumps({"annotations": [{"image_id": i, "id": i, "caption": f"a red shape number {i}"}
                                                for i in range(5000)]}))
    full["llamagen"]["prompts"] = {**full["llamagen"].get("prompts", {}), "coco_captions": str(coco)}
    r = subprocess.run(snakemake(tmp_path, full, "-n", "--quiet", "rules"), cwd=REPO, capture_output=True, text=True,
                       timeout=3600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for rule in ("convert_drafter", "caption_features", "generate", "evaluate", "tables"):
        assert rule in r.stdout, rule

    log = tmp_path / "stage2.log"
    r = run_logged(snakemake(tmp_path, stage2_overlay(world), "--cores", "2", "results/tables/summary.md"), log)
    assert r.returncode == 0, tail(log)
    out = tmp_path / "results"
    point = "lantern-dynamic-n6-depth2-top2-d0.2-k50-reference"
    manifest = json.loads((out / "gen" / "sampling" / point / "shard0" / "manifest.json").read_text())
    assert manifest["pad_semantics"] == "authors" and manifest["target_spec"]["image_tokens"] == 1024
    stats = pd.read_csv(out / "gen" / "sampling" / point / "shard0" / "stats.csv")
    assert [len(t.split()) for t in stats["tokens"]] == [1024, 1024]
    from PIL import Image
    assert Image.open(out / "gen" / "sampling" / point / "shard0" / "images" / "000000.png").size == (512, 512)
    row = json.loads((out / "metrics" / "sampling" / f"{point}.json").read_text())
    assert row["fid"] is not None and row["precision"] is None and "at least 4 images" in row["fidelity_skipped"]


@pytest.mark.parametrize("stage, files, message", [
    ("II", {"authors_drafter": "authors_drafter"},
     "input_type = t2i (stage I, 16 x 16 RoPE grid), but the target has 1024 image tokens (stage II, 32 x 32)"),
    ("II", {"gpt_ckpt": "hf_stage1"}, "was trained for 256 image tokens (config.json block_size), but "
     "llamagen.image_size / downsample give 1024"),
    ("I", {"authors_drafter": "authors_drafter2"},
     "input_type = t2i2 (stage II, 32 x 32 RoPE grid), but the target has 256 image tokens (stage I, 16 x 16)"),
])
def test_check_config_refuses_the_other_stage(world, tmp_path, stage, files, message):
    import yaml

    over = stage2_overlay(world) if stage == "II" else overlay(world, "t2i")
    over["llamagen"]["authors_drafter"] = over["llamagen"]["authors_drafter"] or world["authors_drafter"]
    if files.get("gpt_ckpt") == "hf_stage1":  # the authors' HF-format stage-I target: its config.json says 256
        from test_authors_files import hf_target
        world = {**world, "hf_stage1": str(hf_target(world, tmp_path / "hf_stage1"))}
    over["llamagen"].update({k: world[v] for k, v in files.items()})
    (tmp_path / "over.yaml").write_text(yaml.safe_dump(over))
    recipes = [T2I_RECIPE, STAGE2] if stage == "II" else [T2I_RECIPE]
    r = subprocess.run([sys.executable, "-m", "lantern", "check-config", str(REPO / "config" / "config.yaml"),
                        *map(str, recipes), str(tmp_path / "over.yaml")], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
