"""The LANTERN authors' released files in a recipe (issue #29, items 4 and 7): their HF-format target as
llamagen.gpt_ckpt (converted by the convert_target rule, or a one-line pointer to `lantern convert --kind target`),
and check-config refusing a drafter or target of the other LlamaGen stage before any job."""
import json
from pathlib import Path

import pytest
import torch
import yaml
from conftest import REPO, run_logged, tail

from lantern.engine.models.checkpoint import extract_state_dict, read_checkpoint
from lantern.errors import UserError
from lantern.pipeline.config import merge_config, validate_config
from llamagen_world import GPT_SIZE, build_world
from test_convert import upstream_to_hf, write_hf_folder
from test_llamagen_world import T2I_RECIPE, overlay, snakemake


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("authors_world"))


def hf_target(world, folder, **config):
    """The world's t2i GPT as the authors saved theirs (HF keys, config.json with their attributes)."""
    sd = extract_state_dict(read_checkpoint(world["t2i"]))
    stated = {"architectures": ["LlamaForCausalLM"], "hidden_size": GPT_SIZE["dim"],
              "num_attention_heads": GPT_SIZE["n_head"], "num_hidden_layers": GPT_SIZE["n_layer"],
              "vocab_size": 16384, "block_size": 256, "cls_token_num": 120, "input_type": "t2i",
              "rms_norm_eps": 1e-5, "rope_base": 10000, **config}
    return write_hf_folder(folder, upstream_to_hf(sd), stated)


def recipe(world, **llamagen) -> dict:
    cfg = {}
    for layer in (yaml.safe_load((REPO / "config" / "config.yaml").read_text()), yaml.safe_load(T2I_RECIPE.read_text()),
                  overlay(world, "t2i"), {"llamagen": llamagen}):
        merge_config(cfg, layer)
    return cfg


def test_hf_target_folder_is_converted_by_a_rule(world, tmp_path):
    folder = hf_target(world, tmp_path / "hf_target")
    validate_config(recipe(world, gpt_ckpt=str(folder)))
    log = tmp_path / "convert.log"
    over = overlay(world, "t2i")
    over["llamagen"]["gpt_ckpt"] = str(folder)
    r = run_logged(snakemake(tmp_path, T2I_RECIPE, over, "--cores", "1", "results/llamagen/target/converted.pt"), log)
    assert r.returncode == 0, tail(log)
    converted = extract_state_dict(read_checkpoint(tmp_path / "results" / "llamagen" / "target" / "converted.pt"))
    upstream = extract_state_dict(read_checkpoint(world["t2i"]))
    assert converted.keys() == upstream.keys() and all(torch.equal(converted[k], upstream[k]) for k in upstream)
    # every job that loads the target reads the converted file
    r = run_logged(snakemake(tmp_path, T2I_RECIPE, over, "-n", "--quiet", "rules"), log)
    assert r.returncode == 0 and "generate" in log.read_text(), tail(log)
    plan = run_logged(snakemake(tmp_path, T2I_RECIPE, over, "-n", "-p", "results/gen/sampling/vanilla/shard0"), log)
    assert plan.returncode == 0 and "--target results/llamagen/target/converted.pt" in log.read_text(), tail(log)


def test_hf_weights_file_as_upstream_names_lantern_convert(world, tmp_path):
    """Their pytorch_model.bin without its config.json beside it: one line naming `lantern convert --kind target`."""
    folder = hf_target(world, tmp_path / "hf_target")
    lone = tmp_path / "lone"
    lone.mkdir()
    from safetensors.torch import load_file
    torch.save(load_file(folder / "model.safetensors"), lone / "pytorch_model.bin")
    with pytest.raises(UserError) as e:
        validate_config(recipe(world, gpt_ckpt=str(lone / "pytorch_model.bin")))
    assert "lantern convert --kind target" in str(e.value) and "\n" not in str(e.value)
    assert str(e.value).startswith(f"config: llamagen.gpt_ckpt: checkpoint {lone / 'pytorch_model.bin'} is the LANTERN "
                                   "authors' HF-format LlamaGen")
    # beside its config.json the weights file is taken as the folder
    validate_config(recipe(world, gpt_ckpt=str(folder / "model.safetensors")))


def test_check_config_refuses_an_hf_target_of_the_other_stage(world, tmp_path):
    folder = hf_target(world, tmp_path / "stage2", block_size=1024)
    with pytest.raises(UserError) as e:
        validate_config(recipe(world, gpt_ckpt=str(folder)))
    assert str(e.value) == (f"config: llamagen.gpt_ckpt {folder} was trained for 1024 image tokens (config.json "
                            "block_size), but llamagen.image_size / downsample give 256; set the image size it was "
                            "trained for (stage I: 256, stage II: 512)")


@pytest.mark.parametrize("input_type", ["t2i2", "t2i"])
def test_check_config_refuses_a_drafter_of_the_other_stage(world, tmp_path, input_type):
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    for f in ("pytorch_model.bin",):
        (drafter / f).write_bytes((Path(world["authors_drafter"]) / f).read_bytes())
    config = json.loads((Path(world["authors_drafter"]) / "config.json").read_text())
    (drafter / "config.json").write_text(json.dumps({**config, "input_type": input_type}))
    cfg = recipe(world, authors_drafter=str(drafter))
    if input_type == "t2i":
        validate_config(cfg)
        return
    with pytest.raises(UserError) as e:
        validate_config(cfg)
    assert str(e.value) == (f"config: llamagen.authors_drafter {drafter}: its config.json input_type = t2i2 (stage II, "
                            "32 x 32 RoPE grid), but the target has 256 image tokens (stage I, 16 x 16); use the "
                            "drafter released for the target's stage (llamagen_drafter: t2i, stage I; "
                            "llamagen2_drafter: t2i2, stage II)")


def test_t2i_recipe_runs_the_authors_rule_beside_ours():
    """The paper's points use the authors' residual (named -reference); the bounded residual runs beside them."""
    from lantern.engine.methods import expand

    methods = yaml.safe_load(T2I_RECIPE.read_text())["sweep"]["methods"]
    points = expand(methods, 0, 1, {"max_k": 1000})
    paper = points["lantern-dynamic-d0.2-k1000-reference"]
    assert paper["residual"] == "reference" and (paper["delta"], paper["k"]) == (0.2, 1000)
    assert points["lantern-dynamic-d0.2-k1000"]["residual"] == "bounded"
    relaxed = [p for p in points.values() if p["name"] in ("lantern", "lanternpp")]
    reference = {(p["name"], p.get("delta"), p.get("lam"), p["k"]) for p in relaxed if p["residual"] == "reference"}
    bounded = {(p["name"], p.get("delta"), p.get("lam"), p["k"]) for p in relaxed if p["residual"] == "bounded"}
    assert bounded and bounded <= reference  # every bounded point has its authors' twin


def test_snakemake_lint_is_clean_in_the_llamagen_world(world, tmp_path):
    """The llamagen-only rules (train_drafter, convert_target, ...) lint clean too, with the authors' files."""
    over = overlay(world, "t2i")
    over["llamagen"]["authors_drafter"] = world["authors_drafter"]
    log = tmp_path / "lint.log"
    r = run_logged(snakemake(tmp_path, T2I_RECIPE, over, "--lint"), log)
    assert r.returncode == 0 and "Lints for" not in log.read_text(), tail(log)
    over["llamagen"]["authors_drafter"] = ""  # the training branch
    r = run_logged(snakemake(tmp_path, T2I_RECIPE, over, "--lint"), log)
    assert r.returncode == 0 and "Lints for" not in log.read_text(), tail(log)


def test_reference_residual_needs_k_plus_one_neighbours():
    """The reference residual zeroes the k + 1 nearest codes: check-config asks for that many before any job (the
    t2i recipe's k = 1000 points need neighbours.max_k 1001)."""
    point = {"name": "lantern", "drafting": "dynamic", "delta": 0.2, "k": 50, "residual": "reference"}
    with pytest.raises(UserError) as e:
        validate_config({"sweep": {"methods": [point]}, "neighbours": {"max_k": 50}})
    assert str(e.value) == ("config: sweep point lantern-dynamic-d0.2-k50-reference reads the 51 nearest codes (the "
                            "reference residual zeroes k + 1 = 51), but neighbours.max_k = 50; set neighbours.max_k: 51")
    validate_config({"sweep": {"methods": [point]}, "neighbours": {"max_k": 51}})
    validate_config({"sweep": {"methods": [{**point, "residual": "bounded"}]}, "neighbours": {"max_k": 50}})
    assert yaml.safe_load(T2I_RECIPE.read_text())["neighbours"]["max_k"] == 1001
