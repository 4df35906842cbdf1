"""The LANTERN authors' files, the combination the stage-II recipe advertises (issue #52): their HF target folder as
llamagen.gpt_ckpt together with their drafter as llamagen.authors_drafter passes check-config (the drafter is checked
against the target read from its HF folder), and a target converted by `lantern convert` without --target-spec
carries its token grid, so a spec of another grid is refused at load instead of decoding with logits off."""
import json
import shutil

import pytest
import torch

from lantern.worlds.llamagen.upstream import load_gpt
from lantern.errors import UserError
from lantern.pipeline.config import validate_config
from lantern.worlds.llamagen.convert import main as convert
from llamagen_world import build_world
from test_authors_files import hf_target, recipe
from test_convert import hf_config, upstream_to_hf, write_hf_folder
from tiny import tiny_target


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("authors_checks"))


def test_the_authors_target_folder_and_drafter_pass_together(world, tmp_path):
    """Before: "config: llamagen.authors_drafter: checkpoint <folder> is a folder, not a file" (the drafter check
    loaded gpt_ckpt as a torch file)."""
    folder = hf_target(world, tmp_path / "hf_target")
    cfg = validate_config(recipe(world, gpt_ckpt=str(folder), authors_drafter=world["authors_drafter"]))
    assert cfg["llamagen"]["authors_drafter"] == world["authors_drafter"]


def test_an_authors_drafter_of_another_width_is_refused_against_their_target_folder(world, tmp_path):
    """The check is real with their target too: a drafter whose weights fit another width stops before any job."""
    folder = hf_target(world, tmp_path / "hf_target")
    drafter = tmp_path / "drafter"
    shutil.copytree(world["authors_drafter"], drafter)
    weights = torch.load(drafter / "pytorch_model.bin", weights_only=True)
    weights["fc.weight"] = torch.zeros(32, 64, dtype=torch.float16)
    torch.save(weights, drafter / "pytorch_model.bin")
    with pytest.raises(UserError) as e:
        validate_config(recipe(world, gpt_ckpt=str(folder), authors_drafter=str(drafter)))
    line = str(e.value)
    assert line.startswith("config: llamagen.authors_drafter: ") and "fc.weight" in line and "\n" not in line


@pytest.mark.parametrize("kind", ["c2i", "t2i"])
def test_a_converted_target_refuses_a_spec_of_another_grid(kind, tmp_path, capsys):
    """Before: converted without --target-spec, the file held weights only, and `--target-spec` image_tokens 64
    loaded it on an 8 x 8 grid (its 16 tokens were trained on 4 x 4) without a word."""
    upstream = tiny_target(kind, seed=3)
    src = write_hf_folder(tmp_path / "hf", upstream_to_hf({k: v.clone() for k, v in upstream.state_dict().items()}),
                          hf_config(upstream))
    convert(["--kind", "target", "--src", str(src), "--out", str(tmp_path / "gpt.pt")])
    spec = json.loads(capsys.readouterr().out.split("--target-spec ")[1].strip().strip("'"))
    assert load_gpt(tmp_path / "gpt.pt", spec=spec).args.image_tokens == 16
    with pytest.raises(UserError) as e:
        load_gpt(tmp_path / "gpt.pt", spec={**spec, "image_tokens": 64})
    assert "was trained for 16 image tokens, but llamagen.image_tokens = 64" in str(e.value)
