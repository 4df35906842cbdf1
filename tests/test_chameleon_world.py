"""The Chameleon recipes (config/anole.yaml, config/lumina-mgpt.yaml) through the whole Snakemake DAG on a tiny fake
world written here (tests/chameleon_world.py: released-layout files at small widths, a COCO captions file, reference
images, random Inception weights): prompts -> neighbours from the VQGAN codebook -> sweeps -> metrics -> tables ->
figures, the recipe scaled down by an overlay that only points at the fakes and shrinks the sweep."""
import json
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import REPO, run_logged, tail

from chameleon_world import CAPTIONS, build_chameleon_world
from lantern.engine.rules.neighbours import nearest_neighbours
from lantern.worlds.chameleon.vqgan import read_codebook
from test_llamagen_world import snakemake

pytestmark = pytest.mark.slow
RECIPES = {"anole": REPO / "config" / "anole.yaml", "lumina-mgpt": REPO / "config" / "lumina-mgpt.yaml"}
CHAINS = [{"name": "vanilla"},
          {"name": "exact", "drafting": "chain", "gamma": 3},
          {"name": "lantern", "drafting": "chain", "gamma": 3, "delta": 0.2, "k": 20},
          {"name": "lanternpp", "drafting": "chain", "gamma": 3, "k": 10, "lam": 5}]
# the authors' static tree and the Jacobi peers: under Lumina's forced tokens as under Anole's plain grid
TREES_AND_WINDOWS = [{"name": "lanternpp", "drafting": "static", "tree": "mc_sim_7b_63", "k": 10, "lam": 5},
                     {"name": "exact", "drafting": "jacobi", "window": 4, "coupling": ["independent", "maximal"]}]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_chameleon_world(tmp_path_factory.mktemp("chameleon_world"))


def overlay(world: dict, family: str) -> dict:
    """What a user with the real files changes in a recipe (paths), plus a sweep small enough for a CPU: 64 px is a
    4 x 4 code grid (the tiny VQGAN draws it as 8 x 8 px)."""
    residual = "lumina" if family == "lumina-mgpt" else "reference"
    methods = [dict(m, residual=residual) if m["name"] in ("lantern", "lanternpp") else m
               for m in CHAINS + TREES_AND_WINDOWS]
    return {
        "outdir": "results", "device": "cpu", "dtype": "fp32", "threads": 1,
        "chameleon": {"family": family, "target": world["target"], "drafter": world["drafter"],
                      "vqgan_ckpt": world["vqgan_ckpt"], "tokenizer": world["tokenizer"], "pixels": 64,
                      "prompt_tokens": 32, "prompts": {"coco_captions": world["coco"]}},
        "neighbours": {"max_k": 21},
        # the proximity check on the vanilla point's tokens through the VQGAN, at the smallest size that shows a shift
        "proximity": {"fractions": [0.0, 0.5], "ranks": [1, "random"]},
        "sweep": {"n_images": 4, "shards": 2, "in_job_vanilla": True, "modes": ["sampling"],
                  "batch_size": {"sampling": 2, "greedy": 2}, "latency_images": 2,
                  "methods": methods},
        "metrics": {"reference": world["reference"], "inception_weights": world["inception"], "vgg16_weights": "",
                    "clip_model": "toy", "clip_ckpt": "",
                    "hpsv2": {"enabled": True, "model": "", "weights_path": world["hpsv2"]}},
    }


@pytest.mark.parametrize("family", list(RECIPES))
def test_recipe_runs_the_whole_dag(world, tmp_path, family):
    log = tmp_path / "run.log"
    r = run_logged(snakemake(tmp_path, RECIPES[family], overlay(world, family), "--cores", "2"), log, timeout=3600)
    assert r.returncode == 0, tail(log)
    out = tmp_path / "results"
    prompts = pd.read_csv(out / "chameleon" / "prompts.csv")
    assert list(prompts["caption"]) == CAPTIONS[:4]  # each image's longest caption, images in annotation order
    table = torch.load(out / "neighbours" / "l2_K21.pt")
    codebook = read_codebook(world["vqgan_ckpt"])  # through the VQGAN's own reader
    assert torch.equal(table["neighbours"].long(), nearest_neighbours(codebook, 21, "l2").long())
    sweep = pd.read_csv(out / "tables" / "sweep.csv").set_index("point")
    points = sorted(p.name for p in (out / "gen" / "sampling").iterdir())
    assert len(points) == len(CHAINS) + 3 + 1  # the Jacobi point's two couplings, vanilla's control point
    assert set(points) <= set(sweep.index)
    for point in points:
        shards = sorted((out / "gen" / "sampling" / point).glob("shard*"))
        stats = pd.concat(pd.read_csv(s / "stats.csv", dtype={"tokens": str}) for s in shards)
        assert list(stats["caption"]) == list(prompts["caption"]), point  # image i carries prompt row i
        tokens = np.array([[int(t) for t in row.split()] for row in stats["tokens"]])
        # codes only, never a forced id (8803 / 8196 sit at columns 8192 / 8193 of Lumina's head)
        assert tokens.shape == (4, 16) and tokens.min() >= 0 and tokens.max() < 8192, point
        manifest = json.loads((shards[0] / "manifest.json").read_text())
        assert manifest["chameleon"]["family"] == family and (manifest["layout"] is None) == (family == "anole")
    assert np.isfinite(sweep["fid"]).all() and np.isfinite(sweep["clip_score"]).all()
    assert np.isfinite(sweep["hpsv2"]).all()  # HPS v2.1 from a tiny random OpenCLIP, each image against its caption
    if family == "lumina-mgpt":
        drafted = sweep[sweep["name"] != "vanilla"]
        # (21 generated steps - 1) / (target forwards - 1), beside ours (16 codes / target forwards)
        want = 20 / (drafted["target_forwards_per_image"] - 1)
        assert np.allclose(drafted["tau_authors"], want) and sweep.loc["vanilla", "tau_authors"] != \
            sweep.loc["vanilla", "tau_authors"]
    else:
        assert "tau_authors" not in sweep
    for name in ("tradeoff", "round_anatomy", "samples_sampling", "proximity"):
        assert (out / "figures" / f"{name}.png").stat().st_size > 1000, name
    proximity = pd.read_csv(out / "proximity" / f"{family}.csv", dtype={"m": str})  # the vanilla point's 4 grids
    assert (proximity["world"] == family).all() and (proximity["n_images"] == 4).all() and len(proximity) == 4
    assert (proximity[proximity["fraction"] == 0]["mae"] == 0).all() and (proximity["mae"] > 0).sum() == 2


def test_a_chameleon_run_plans_proximity_on_its_vanilla_samples_through_the_vqgan(world, tmp_path):
    """The latent-proximity check of a Chameleon world: the vanilla point's tokens, the sweep's neighbour table
    (built from the VQGAN's codebook), the VQGAN read with its vqgan.yaml."""
    r = subprocess.run(snakemake(tmp_path, RECIPES["lumina-mgpt"], overlay(world, "lumina-mgpt"), "-n", "-p",
                                 "--cores", "1"), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    command = next(line for line in r.stdout.splitlines() if "lantern proximity" in line)
    yaml_path = str(Path(world["vqgan_ckpt"]).with_name("vqgan.yaml"))
    for part in (f"--vq {world['vqgan_ckpt']} --vqgan-yaml {yaml_path} --neighbours results/neighbours/l2_K21.pt",
                 "--tokens results/gen/sampling/vanilla/shard0/stats.csv results/gen/sampling/vanilla/shard1/stats.csv",
                 '"extractor": "inception-v3-compat"', "--world lumina-mgpt", "--out results/proximity/lumina-mgpt.csv"):
        assert part in command, (part, command)
    assert "lantern figure proximity" in r.stdout


def sample_args(world: dict, tmp_path, method: dict, compile: str = "auto") -> list[str]:
    from lantern.worlds.llamagen.prompts import write_prompts

    write_prompts([(str(i), c) for i, c in enumerate(CAPTIONS)], tmp_path / "prompts.csv")
    return ["--family", "lumina-mgpt", "--target", world["target"], "--vq", world["vqgan_ckpt"], "--tokenizer",
            world["tokenizer"], "--drafter", world["drafter"], "--pixels", "64", "--prompt-tokens", "32", "--prompts",
            str(tmp_path / "prompts.csv"), "--method", json.dumps(method), "--end", "1", "--device", "cpu",
            "--compile", compile, "--quiet", "--out", str(tmp_path / "out")]


def test_sample_under_luminas_layout_runs_eager_under_auto(world, tmp_path, monkeypatch):
    """As on CUDA (compile auto would compile): a chain, a static tree, SJD-PAC's proactive tree and VVS's skipped
    verifies under the layout run eager, recorded in the manifest."""
    from lantern.engine.decoding import compiled
    from lantern.pipeline import sample

    monkeypatch.setattr(compiled, "resolve", lambda option, device: option in ("auto", None, True))
    for method in ({"name": "exact", "drafting": "chain", "gamma": 3}, {"name": "exact", "drafting": "static"},
                   {"name": "exact", "drafting": "jacobi", "window": 4, "proactive": 2},
                   {"name": "exact", "drafting": "chain", "gamma": 3, "skip": "every", "skip_every": 2}):
        sample.main(sample_args(world, tmp_path, method))
        manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
        assert manifest["compile"] is False and manifest["layout"]["eol"] == 8192
        stats = pd.read_csv(tmp_path / "out" / "stats.csv")
        assert stats["caption"].tolist() == CAPTIONS[:1]
        assert (stats["skipped_rounds"] > 0).all() == bool(method.get("skip")), method
