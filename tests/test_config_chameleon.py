"""The Chameleon recipes (config/lumina-mgpt.yaml, config/anole.yaml): their settings as the authors run them, a
config check that names every file to place, one line each, refuses only when one is missing, and then refuses, in
one line, a sweep point the engine cannot run under the family's layout (asking engine/decoding/kinds.py)."""
import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lantern.errors import UserError
from lantern.pipeline.config import expand_methods, validate_config
from lantern.pipeline.config_inputs import chameleon_files

ROOT = Path(__file__).resolve().parents[1]
RECIPES = {"lumina-mgpt": "lumina-mgpt.yaml", "anole": "anole.yaml"}


def recipe(family: str) -> dict:
    return yaml.safe_load((ROOT / "config" / RECIPES[family]).read_text())


def refusal(cfg: dict) -> list[str]:
    with pytest.raises(UserError) as e:
        validate_config(cfg)
    return str(e.value).splitlines()


@pytest.mark.parametrize("family", list(RECIPES))
def test_check_config_lists_exactly_the_files_to_place(family):
    """On a fresh clone (none of the files placed), `lantern check-config` prints one line per input to place and
    nothing else; its exit status says it failed."""
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
    assert [line.split(" ")[-4] for line in lines[1:]] == want


def placed(family: str, tmp_path: Path, n_captions: int = 5000) -> dict:
    """The recipe with every input it names placed under tmp_path: folders, files, and a COCO captions file with
    `n_captions` images."""
    cfg = recipe(family)
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
    annotations = [{"image_id": i, "id": i, "caption": f"caption {i}"} for i in range(n_captions)]
    Path(cfg["chameleon"]["prompts"]["coco_captions"]).write_text(json.dumps({"annotations": annotations}))
    return cfg


def test_with_every_file_placed_anole_validates(tmp_path):
    cfg = validate_config(placed("anole", tmp_path))
    assert {p.get("drafting") for p in expand_methods(cfg).values()} >= {"static", "dynamic", "jacobi", "chain"}


def test_lumina_validates_its_recipe_and_every_drafting_kind(tmp_path):
    """The authors' recipe (static trees, Jacobi windows, chains) validates with its files placed, compiled too; so do
    VVS's skipped verifies and SJD-PAC's proactive tree, which also run under Lumina's forced tokens."""
    base = placed("lumina-mgpt", tmp_path)
    assert len(expand_methods(validate_config(copy.deepcopy(base)))) > 10
    vvs = copy.deepcopy(base)  # skipped verifies run under the layout (eager)
    vvs["sweep"]["methods"] = [{"name": "lantern", "drafting": "chain", "gamma": 4, "delta": 0.1, "k": 3,
                                "skip": "every", "skip_every": 5}]
    assert len(expand_methods(validate_config(vvs))) == 1
    cfg = copy.deepcopy(base)
    cfg["sweep"]["methods"] = [{"name": "vanilla"}, {"name": "exact", "drafting": "jacobi", "window": 16,
                                                     "coupling": "maximal", "proactive": 4}]
    assert "exact-jacobi-w16-maximal-pk4-pd2" in expand_methods(validate_config(cfg))
    cfg = copy.deepcopy(base)
    cfg["compile"] = True
    assert validate_config(cfg)["compile"] is True


def test_the_config_check_follows_the_engine(tmp_path, monkeypatch):
    """The refusal is the engine's own condition: were the engine to refuse static trees under a layout
    (kinds.layout_supported), the authors' recipe would be refused at its first tree point."""
    from lantern.engine.decoding import kinds

    cfg = placed("lumina-mgpt", tmp_path)
    monkeypatch.setattr(kinds, "layout_supported", lambda drafting, compile=False: drafting is None or
                        type(drafting).__name__ != "StaticTree")
    (line,) = refusal(cfg)
    assert "exact-static-mc_sim_7b_63 does not run under Lumina-mGPT's layout" in line


def test_fewer_prompts_than_images_is_one_line(tmp_path):
    (line,) = refusal(placed("anole", tmp_path, n_captions=10))
    assert "sweep.n_images = 5000 asks for more prompts than chameleon.prompts.coco_captions" in line and \
        "(10)" in line


def test_one_prompt_set_at_a_time(tmp_path):
    cfg = placed("anole", tmp_path)
    cfg["chameleon"]["prompts"]["sjd"] = True
    (line,) = refusal(cfg)
    assert "chameleon.prompts sets coco_captions and sjd; keep one prompt set" in line


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


def test_chameleon_prompts_writes_each_set_as_a_prompt_table(tmp_path):
    """`lantern chameleon-prompts` (the chameleon_prompts rule): row i of the table captions image i."""
    from lantern.pipeline.cli import main
    from lantern.worlds.chameleon.prompts import SJD_PROMPTS
    from lantern.worlds.llamagen.prompts import read_prompts

    (tmp_path / "parti.tsv").write_text("Prompt\tCategory\na red cat\tAnimals\ntwo dogs\tAnimals\nthe moon\tWorld\n")
    (tmp_path / "longest.json").write_text(json.dumps(["first caption", "second caption"]))
    for args, want in ((["--tsv", str(tmp_path / "parti.tsv"), "--n", "2"], ["a red cat", "two dogs"]),
                       (["--caption-list", str(tmp_path / "longest.json")], ["first caption", "second caption"]),
                       (["--sjd", "--n", "3"], list(SJD_PROMPTS[:3]))):
        out = tmp_path / "prompts.csv"
        assert main(["chameleon-prompts", *args, "--out", str(out)]) == 0
        rows = read_prompts(out)
        assert [c for _, c in rows] == want and [i for i, _ in rows] == [str(j) for j in range(len(want))]
    assert main(["chameleon-prompts", "--tsv", str(tmp_path / "parti.tsv"), "--n", "4", "--out", str(out)]) == 2
