"""The Python API on a text-to-image target: prompts (through a T5 loaded with the world) and caption features give
`lantern sample --captions`'s tokens for the same settings; caption problems are one line."""
import csv

import pandas as pd
import pytest
import torch

import lantern
from fake_t5 import TINY_T5_DIM, write_tiny_t5
from lantern.errors import UserError
from lantern.pipeline.sample import main as sample
from lantern.worlds.llamagen.captions import main as encode_captions, read_captions_file
from tiny import one_thread, save_world, tiny_target  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("one_thread")
CAPTIONS = ["two dogs run in the park", "a red bus"]  # the second is left-padded
T = 16
METHOD = {"name": "exact", "drafting": "chain", "gamma": 3}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("t2i_api")
    with open(root / "prompts.csv", "w", newline="") as f:
        csv.writer(f).writerows([("id", "caption"), *[(f"p{i}", c) for i, c in enumerate(CAPTIONS)]])
    encode_captions(["--prompts", str(root / "prompts.csv"), "--t5", str(write_tiny_t5(root / "t5")),
                     "--max-length", str(T), "--out", str(root / "captions.pt")])
    return save_world(root, tiny_target("t2i", cls_token_num=T, caption_dim=TINY_T5_DIM))


def test_prompts_and_features_give_lantern_samples_tokens(files, tmp_path):
    sample(["--target", str(files / "target.pt"), "--vq", str(files / "vq.pt"), "--drafter", str(files / "drafter.pt"),
            "--method", str(METHOD).replace("'", '"'), "--sampling", '{"cfg_scale": 3.0}', "--seed", "7", "--end", "2",
            "--captions", str(files / "captions.pt"), "--out", str(tmp_path / "job"), "--device", "cpu", "--quiet"])
    want = pd.read_csv(tmp_path / "job" / "stats.csv")["tokens"].tolist()

    world = lantern.load_llamagen(gpt_ckpt=files / "target.pt", vq_ckpt=files / "vq.pt",
                                  drafter_ckpt=files / "drafter.pt", t5=str(files / "t5"), device="cpu")
    by_prompt = lantern.generate(world, CAPTIONS, METHOD, sampling={"cfg_scale": 3.0}, seed=7)
    data = read_captions_file(files / "captions.pt")
    by_features = lantern.generate(world, (data["features"], data["mask"]), METHOD, sampling={"cfg_scale": 3.0},
                                   seed=7, batch_size=2)
    for got in (by_prompt, by_features):
        assert [" ".join(map(str, t.tolist())) for t in got.tokens] == want
    assert [s["caption"] for s in by_prompt.stats] == CAPTIONS and by_prompt.tau > 1


def test_caption_problems_are_one_line(files):
    world = lantern.load_llamagen(gpt_ckpt=files / "target.pt", vq_ckpt=files / "vq.pt", device="cpu")
    cases = [
        (lambda: lantern.generate(world, ["a cat"]), "prompts as text need a T5 encoder"),
        (lambda: lantern.generate(world, [0, 1]), "a text-to-image world takes prompts"),
        (lambda: lantern.generate(world, (torch.zeros(1, T, 3), torch.ones(1, T))),
         f"the target reads [B, {T}, {TINY_T5_DIM}] with a [B, {T}] mask"),
        (lambda: lantern.load_llamagen(gpt_ckpt=files / "target.pt", vq_ckpt=files / "vq.pt", t5=str(files),
                                       device="cpu"), "is not a T5 model folder"),
    ]
    for call, message in cases:
        with pytest.raises(UserError) as e:
            call()
        assert message in str(e.value) and "\n" not in str(e.value)


def test_lantern_generate_takes_prompts(files, tmp_path, capfd):
    from PIL import Image

    from lantern.pipeline import cli

    out = tmp_path / "grid.png"
    assert cli.main(["generate", "--gpt-ckpt", str(files / "target.pt"), "--vq-ckpt", str(files / "vq.pt"),
                     "--drafter-ckpt", str(files / "drafter.pt"), "--t5", str(files / "t5"), "--prompts", *CAPTIONS,
                     "-n", "3", "--method", "exact", "--gamma", "3", "--cfg-scale", "3", "--seed", "7", "--device",
                     "cpu", "--quiet", "--out", str(out)]) == 0
    printed = capfd.readouterr().out
    assert "exact-chain-g3 (sampling): 3 images, tau " in printed and "speed-up" in printed
    assert Image.open(out).size == (3 * 8, 8)
