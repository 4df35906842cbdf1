"""The Chameleon recipes (config/lumina-mgpt.yaml, config/anole.yaml): their settings as the authors run them, and
a config check that names every file to place, one line each, and then says that the pipeline cannot run the world
yet, so that no recipe validates and fails in its first job."""
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lantern.errors import UserError
from lantern.pipeline.config import expand_methods, validate_config
from lantern.pipeline.config_inputs import CHAMELEON_NOT_YET, chameleon_files

ROOT = Path(__file__).resolve().parents[1]
RECIPES = {"lumina-mgpt": "lumina-mgpt.yaml", "anole": "anole.yaml"}


def recipe(family: str) -> dict:
    return yaml.safe_load((ROOT / "config" / RECIPES[family]).read_text())


def refusal(cfg: dict) -> list[str]:
    with pytest.raises(UserError) as e:
        validate_config(cfg)
    return str(e.value).splitlines()


@pytest.mark.parametrize("family", list(RECIPES))
def test_check_config_lists_exactly_the_files_to_place_then_refuses(family):
    """On a fresh clone (none of the files placed), `lantern check-config` prints one line per input and the line
    that the pipeline cannot run the world; its exit status says it failed."""
    out = subprocess.run([sys.executable, "-m", "lantern", "check-config", f"config/{RECIPES[family]}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)  # a hang guard only
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    cfg = recipe(family)
    want = [cfg["chameleon"]["target"], cfg["chameleon"]["drafter"], cfg["chameleon"]["vqgan_ckpt"],
            str(Path(cfg["chameleon"]["vqgan_ckpt"]).with_name("vqgan.yaml")), cfg["chameleon"]["tokenizer"],
            cfg["chameleon"]["prompts"]["coco_captions"], cfg["metrics"]["reference"],
            cfg["metrics"]["inception_weights"], cfg["metrics"]["vgg16_weights"], cfg["metrics"]["clip_ckpt"],
            cfg["metrics"]["hpsv2"]["weights_path"]]
    assert lines[0] == f"error: config: world chameleon ({family}): {len(want)} input(s) to place (or fix the paths):"
    assert [line.split(" ")[-4] for line in lines[1:-1]] == want
    assert lines[-1] == CHAMELEON_NOT_YET


def test_with_every_file_placed_only_the_pipeline_line_remains(tmp_path):
    cfg = recipe("lumina-mgpt")
    for key, _, kind in chameleon_files(validate_config_without_files(cfg)):
        path = tmp_path / key
        path.mkdir() if kind == "folder" else path.write_text("x")
        section, *rest = key.split(".")
        node = cfg[section]
        for part in rest[:-1]:
            node = node[part]
        if key != "chameleon.vqgan_yaml":
            node[rest[-1]] = str(path)
    cfg["chameleon"]["vqgan_yaml"] = str(tmp_path / "chameleon.vqgan_yaml")
    assert refusal(cfg) == [CHAMELEON_NOT_YET]


def validate_config_without_files(cfg: dict) -> dict:
    """The recipe with defaults filled (what chameleon_files reads), as validate_config fills them."""
    from lantern.pipeline.config import _fill_defaults, load_schema

    filled = yaml.safe_load(yaml.safe_dump(cfg))
    _fill_defaults(filled, load_schema())
    return filled


def test_a_run_without_drafted_methods_needs_no_drafter():
    cfg = recipe("anole")
    cfg["sweep"]["methods"] = [{"name": "vanilla"}, {"name": "exact", "drafting": "jacobi", "window": 16}]
    assert not any("chameleon.drafter:" in line for line in refusal(cfg))


@pytest.mark.parametrize("family", list(RECIPES))
def test_the_recipes_hold_the_authors_settings(family):
    cfg = validate_config_without_files(recipe(family))
    assert {k: cfg["sampling"][k] for k in ("cfg_scale", "top_k", "temperature")} == \
        {"cfg_scale": 3.0, "top_k": 2000, "temperature": 1.0}
    points = expand_methods(cfg)
    pp = sorted((p["k"], p["lam"]) for p in points.values() if p["name"] == "lanternpp")
    assert pp == [(5, 10), (5, 20), (10, 5)]
    assert all(p["tree"] == "mc_sim_7b_63" for p in points.values() if p["name"] == "lanternpp")
    residual = {p["residual"] for p in points.values() if p["name"] in ("lantern", "lanternpp")}
    assert residual == ({"lumina"} if family == "lumina-mgpt" else {"reference"})
    lantern = {(p["delta"], p["k"]) for p in points.values() if p["name"] == "lantern"}
    assert len(lantern) == 12 and (0.1, 1000) in lantern
    names = {p["name"] for p in points.values()}
    assert {"vanilla", "exact", "gsd", "coolsd"} <= names
    assert any(p["name"] == "exact" and p["drafting"] == "jacobi" for p in points.values())  # SJD
