"""The public Python API (`import lantern`, docs/python.md): its names, its one-line errors (the config's own for a
method), its images against `lantern sample`'s for the same settings, and an upstream-style LlamaGen `Transformer`
object giving the same logits and greedy tokens through lantern as through its own forward and sampling loop."""
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from PIL import Image
from torch import nn

import lantern
from lantern.engine.models.vq import VQModel
from lantern.errors import UserError
from lantern.pipeline import cli
from tiny import one_thread  # noqa: F401 (fixture)
from tiny_llamagen import TINY_VQ, UpstreamVQ, tiny_vq, upstream_gpt
from upstream_llamagen import generate as upstream_generate

REPO = Path(__file__).resolve().parents[1]
TOY = REPO / "models" / "toy" / "default"
@pytest.fixture(scope="module")
def toy(one_thread):  # noqa: F811 (fixture)
    return lantern.load_world("toy", device="cpu")


def one_line(fn) -> str:
    with pytest.raises(UserError) as e:
        fn()
    message = str(e.value)
    assert message and "\n" not in message
    return message


def test_public_names_are_documented_and_import_lantern_stays_light():
    for name in lantern.__all__:
        obj = getattr(lantern, name)
        assert obj.__doc__ and len(obj.__doc__.strip()) > 40, name
    code = "import sys, lantern; assert 'torch' not in sys.modules; print(sorted(lantern.__all__))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "generate" in out.stdout


def test_methods_lists_the_registry_as_lantern_methods(capsys):
    assert cli.main(["methods"]) == 0
    assert lantern.methods() == capsys.readouterr().out.rstrip("\n")


@pytest.mark.parametrize("call,expected", [
    (lambda w: lantern.generate(w, [0], "lanturn"), "method.name = 'lanturn' is not a method; use one of vanilla"),
    (lambda w: lantern.generate(w, [0], "lantern", delta=-0.1, k=3), "method.delta = -0.1 must be >= 0"),
    (lambda w: lantern.generate(w, [0], "lantern", delta=0.1, k=201),
     "method.k = 201 is larger than neighbours.max_k = 200; lower k or raise neighbours.max_k"),
    (lambda w: lantern.generate(w, [0], "lantern", delta=0.1), "method (lantern) needs k"),
    (lambda w: lantern.generate(w, [0], "lantern", delta=0.1, k=3, lam=2), "method.lam does not apply to lantern"),
    (lambda w: lantern.generate(w, ["ring", "hexagon"]), "class 'hexagon' is not a class of the toy world; use one "
                                                         "of circle, triangle, star, ring, L-shape, frame"),
    (lambda w: lantern.generate(w, [6]), "class 6 is not a class id of this target; use 0..5"),
    (lambda w: lantern.generate(w, []), "must be a non-empty list of class ids"),
    (lambda w: lantern.generate(w, [0], mode="beam"), "mode = 'beam' is not a decoding mode"),
    (lambda w: lantern.generate(w, [0], sampling={"cfg_scale": 0.5}), "cfg_scale=0.5 must be >= 1"),
    (lambda w: lantern.generate(w, [0], sampling={"top_q": 0.5}), "top_q"),
    (lambda w: lantern.generate(w, [0], batch_size=0), "batch_size = 0 must be an integer >= 1"),
    (lambda w: lantern.generate("toy", [0]), "world = str object; load one with lantern.load_world('toy')"),
    (lambda w: lantern.load_world("imagenet"), "world 'imagenet' is not shipped"),
    (lambda w: lantern.load_world("toy", neighbours_k=5000), "neighbours_k = 5000 must be between 1 and 2047"),
    (lambda w: lantern.load_llamagen(gpt_ckpt=nn.Linear(2, 2), vq_ckpt=tiny_vq(), device="cpu"),
     "gpt_ckpt (a Linear object) is not a LlamaGen GPT: it has no tok_embeddings.weight"),
    (lambda w: lantern.load_llamagen(gpt_ckpt=upstream_gpt(), vq_ckpt=upstream_gpt(), device="cpu"),
     "vq_ckpt (a Transformer object) is not a LlamaGen VQ tokenizer"),
    (lambda w: lantern.load_llamagen(gpt_ckpt=upstream_gpt(), vq_ckpt=tiny_vq(), num_classes=7, device="cpu"),
     "states num_classes = 4 in its config, but llamagen.num_classes = 7; leave num_classes out"),
    (lambda w: lantern.load_llamagen(gpt_ckpt="/nonexistent/c2i_B_256.pt", vq_ckpt=tiny_vq(), device="cpu"),
     "gpt_ckpt"),
    (lambda w: lantern.load_llamagen(gpt_ckpt=upstream_gpt(), vq_ckpt=tiny_vq(), authors_drafter="/nonexistent",
                                     device="cpu"), "authors_drafter: --src /nonexistent does not exist"),
    (lambda w: lantern.load_llamagen(gpt_ckpt=upstream_gpt(), vq_ckpt=tiny_vq(), image_size=100, device="cpu"),
     "llamagen.image_size = 100 is not a multiple of llamagen.downsample = 16"),
    (lambda w: lantern.load_llamagen(gpt_ckpt=upstream_gpt(), vq_ckpt=tiny_vq(), metric="l1", device="cpu"),
     "neighbours metric must be 'l2' or 'cosine'"),
    (lambda w: lantern.load_llamagen(gpt_ckpt=upstream_gpt(), vq_ckpt=tiny_vq(), image_size=128, device="cpu"),
     "states image_tokens = 16 in its config, but llamagen.image_tokens = 64"),
    (lambda w: lantern.load_llamagen(gpt_ckpt=upstream_gpt(), vq_ckpt=tiny_vq(), gpt_size="GPT-B", device="cpu"),
     "states gpt_size = {dim: 64, n_layer: 2, n_head: 2} in its config, but llamagen.gpt_size = GPT-B"),
    (lambda w: lantern.generate(lantern.load_llamagen(gpt_ckpt=upstream_gpt(), vq_ckpt=tiny_vq(), device="cpu"), [0],
                                "lantern", delta=0.1, k=3), "needs a drafter; load the world with drafter_ckpt"),
    (lambda w: lantern.load_llamagen(gpt_ckpt=upstream_gpt(), vq_ckpt=VQModel(dataclasses.replace(
        TINY_VQ, codebook_size=2 * TINY_VQ.codebook_size)), device="cpu"),
     f"vq_ckpt's codebook holds {2 * TINY_VQ.codebook_size} codes, but gpt_ckpt's vocabulary is "
     f"{TINY_VQ.codebook_size}; give the VQ the GPT was trained with"),
    (lambda w: lantern.generate(w, [np.float64(1.0)]), "class np.float64(1.0) is not a class id of this target"),
    (lambda w: lantern.generate(w, [torch.tensor([1, 2])]), "is not a class id of this target"),
    (lambda w: lantern.generate(w, [0], seed=np.float32(2)), "seed = np.float32(2.0) must be an integer >= 0"),
])
def test_bad_inputs_raise_one_clear_line(toy, call, expected):
    assert expected in one_line(lambda: call(toy))


def check_config_error(tmp_path, method: dict) -> str:
    """What `lantern check-config` says about a sweep holding `method` (after vanilla)."""
    override = tmp_path / "bad.yaml"
    override.write_text(yaml.safe_dump({"sweep": {"methods": [{"name": "vanilla"}, method]}}))
    return one_line(lambda: __import__("lantern.pipeline.config").pipeline.config.main(
        [str(REPO / "config" / "config.yaml"), str(override)]))


@pytest.mark.parametrize("method", [{"name": "lantern", "delta": -0.1, "k": 3}, {"name": "lantern", "delta": 0.1,
                                    "k": 500}, {"name": "lanternpp", "lam": 1, "k": 3}, {"name": "lanturn"},
                                    {"name": "exact", "drafting": "chain", "gamma": 0}])
def test_a_bad_method_gets_check_configs_message(toy, tmp_path, method):
    config = check_config_error(tmp_path, method)
    assert config.startswith("config: sweep.methods[1]")
    api = one_line(lambda: lantern.generate(toy, [0], method))
    assert api == "method" + config.removeprefix("config: sweep.methods[1]")
    name = method.pop("name")
    assert one_line(lambda: lantern.generate(toy, [0], name, **method)) == api


def test_images_equal_lantern_samples_and_sample_shows_progress_unless_quiet(toy, tmp_path, capfd):
    """Images 1..3 of a LANTERN point at seed 5, batch 2: `lantern sample` and the API give the same pixels, tokens
    and tau; the job's log holds progress lines with rate, ETA and tau, and --quiet removes them."""
    table = tmp_path / "l2_K200.pt"
    assert cli.main(["neighbours", "--vq", str(TOY / "vq.pt"), "--out", str(table), "--params", '{"k": 200}']) == 0
    method = {"name": "lantern", "delta": 0.1, "k": 3}
    job = ["sample", "--target", str(TOY / "target.pt"), "--vq", str(TOY / "vq.pt"), "--drafter",
           str(TOY / "drafter.pt"), "--neighbours", str(table), "--method", json.dumps(method), "--sampling",
           '{"cfg_scale": 2.0}', "--seed", "5", "--start", "1", "--end", "4", "--batch-size", "2", "--device", "cpu",
           "--no-warmup"]
    capfd.readouterr()
    assert cli.main(job + ["--out", str(tmp_path / "loud")]) == 0
    log = capfd.readouterr().err
    lines = [ln for ln in log.splitlines() if "images/s" in ln]
    assert lines and lines[-1].startswith("lantern-chain-g4-d0.1-k3 (sampling): 3/3 images, ")
    assert all("ETA" in ln and "tau" in ln for ln in lines)
    assert cli.main(job + ["--out", str(tmp_path / "quiet"), "--quiet"]) == 0
    captured = capfd.readouterr()
    assert "images/s" not in captured.err + captured.out

    out = lantern.generate(toy, [1, 2, 3], "lantern", delta=0.1, k=3, seed=5, first_index=1, batch_size=2)
    stats = pd.read_csv(tmp_path / "loud" / "stats.csv")
    for row, i in enumerate(range(1, 4)):
        png = np.asarray(Image.open(tmp_path / "loud" / "images" / f"{i:06d}.png"))
        assert np.array_equal(png, out.pixels[row])
        assert stats["tokens"][row] == " ".join(map(str, out.tokens[row].tolist()))
        assert stats["tau"][row] == out.stats[row]["tau"] and stats["seed"][row] == out.stats[row]["seed"]
    assert out.point == "lantern-chain-g4-d0.1-k3" and out.tau > 1


def test_two_methods_share_seeds_and_names_match_ids(toy):
    by_name = lantern.generate(toy, ["ring", "star"], seed=3, batch_size=2)
    by_id = lantern.generate(toy, [3, 2], seed=3, batch_size=2)
    assert torch.equal(by_name.tokens, by_id.tokens) and [s["label"] for s in by_name.stats] == [3, 2]
    assert by_name.tau == 1.0 and len(by_name.images) == 2 and by_name.grid(columns=2).size == (64, 32)
    again = lantern.generate(toy, ["ring"], seed=3, first_index=0)
    assert torch.equal(again.tokens[0], by_name.tokens[0])


@torch.no_grad()
def test_an_upstream_transformer_object_gives_its_own_logits_and_greedy_tokens(one_thread):  # noqa: F811
    model = upstream_gpt()
    vq = tiny_vq()
    world = lantern.load_llamagen(gpt_ckpt=model, vq_ckpt=UpstreamVQ(vq), device="cpu")
    assert world.vq.args == TINY_VQ and world.target.args.num_classes == 4 and world.target.args.image_tokens == 16
    cond, tokens = torch.arange(4), torch.randint(0, 64, (4, 15), generator=torch.Generator().manual_seed(0))
    ours, theirs = world.target(cond, tokens)[0], model(tokens, cond)[0]
    assert ours.shape == theirs.shape == (4, 16, 64)
    assert torch.equal(ours, theirs)

    want = upstream_generate(model, cond, 16, cfg_scale=4.0, top_k=1)
    assert len({tuple(t.tolist()) for t in want}) == 4  # the classes lead to different images
    greedy = lantern.generate(world, [0, 1, 2, 3], mode="greedy", sampling={"cfg_scale": 4.0}, batch_size=4)
    assert torch.equal(greedy.tokens, want)
    # speculative greedy decoding on the same object (Jacobi windows need no drafter) keeps greedy AR's tokens
    jacobi = lantern.generate(world, [0, 1, 2, 3], "exact", drafting="jacobi", window=4, mode="greedy",
                              sampling={"cfg_scale": 4.0}, batch_size=2)
    assert torch.equal(jacobi.tokens, want) and jacobi.tau > 1
    assert np.array_equal(greedy.pixels[0], world.vq.decode_code(want[:1]).add(1).mul(127.5).clamp(0, 255).round()
                          .to(torch.uint8).permute(0, 2, 3, 1)[0].numpy())


@torch.no_grad()
def test_the_authors_hf_target_folder_converts_in_memory(tmp_path, one_thread):  # noqa: F811
    from test_convert import hf_config, upstream_to_hf, write_hf_folder

    model = upstream_gpt(seed=4)
    ours = lantern.load_llamagen(gpt_ckpt=model, vq_ckpt=tiny_vq(), device="cpu").target
    folder = write_hf_folder(tmp_path / "hf", upstream_to_hf(dict(ours.state_dict())), hf_config(ours))
    world = lantern.load_llamagen(gpt_ckpt=folder, vq_ckpt=tiny_vq(), device="cpu")
    cond, tokens = torch.arange(4), torch.randint(0, 64, (4, 15), generator=torch.Generator().manual_seed(1))
    assert torch.equal(world.target(cond, tokens)[0], model(tokens, cond)[0])
    assert "llamagen.num_classes = 9" in one_line(lambda: lantern.load_llamagen(
        gpt_ckpt=folder, vq_ckpt=tiny_vq(), num_classes=9, device="cpu"))
    (tmp_path / "empty").mkdir()
    assert "is a folder without config.json" in one_line(lambda: lantern.load_llamagen(
        gpt_ckpt=tmp_path / "empty", vq_ckpt=tiny_vq(), device="cpu"))


def test_numpy_and_torch_integers_are_class_ids_and_seeds(toy):
    """What users pass (issue #61): list(np.arange(2)), numpy and torch scalars, 0-d tensors and arrays; the images
    are those of plain ints."""
    want = lantern.generate(toy, [0, 1], "vanilla", seed=3)
    for conditions, seed in ((list(np.arange(2)), np.int64(3)), (np.arange(2), torch.tensor(3)),
                             ([torch.tensor(0), np.array(1)], np.uint8(3)), (torch.arange(2), 3)):
        got = lantern.generate(toy, conditions, "vanilla", seed=seed)
        assert np.array_equal(got.pixels, want.pixels) and [s["label"] for s in got.stats] == [0, 1]
        assert all(type(s["label"]) is int and type(s["seed"]) is int for s in got.stats)
    one = lantern.generate(toy, np.int32(1), "vanilla", seed=3, first_index=np.int64(1), batch_size=torch.tensor(1))
    assert np.array_equal(one.pixels[0], want.pixels[1])
