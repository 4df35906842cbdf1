"""Every random draw with a generator happens on the generator's device (tests/draw_check.py), checked on a CPU
over every decoder and every trainer: the class of crash that only CUDA raises ("Expected a 'cuda' device type for
generator but found 'cpu'", SJD's window refill before the fix)."""

import json

import pytest
import torch

from draw_check import DrawOffGenerator, generator_device_check
from lantern.engine import methods
from lantern.engine.decoding.sampling import SamplingParams, image_generator
from tiny import one_thread, save_world, tiny_target  # noqa: F401 (fixture)

SPECS = [
    {"name": "exact", "drafting": "chain", "gamma": 3},
    {"name": "lantern", "drafting": "chain", "gamma": 3, "delta": 0.2, "k": 4},
    {"name": "lanternpp", "drafting": "static", "tree": "twin_chain_8", "lam": 2.0, "k": 4},
    {"name": "lanterntv", "drafting": "chain", "gamma": 3, "delta": 0.3, "k": 4},
    {"name": "lanterntv", "drafting": "dynamic", "total_tokens": 8, "depth": 3, "top_k": 3, "delta": 0.3, "k": 4},
    {"name": "coolsd", "drafting": "static", "tree": "twin_chain_8", "scale": 2.0, "nu": 0.2},
    {"name": "coolsd", "drafting": "chain", "gamma": 3, "scale": 2.0, "nu": 0.2},
    {"name": "exact", "drafting": "dynamic", "total_tokens": 8, "depth": 3, "top_k": 3},
    {"name": "exact", "drafting": "jacobi", "window": 4},  # SJD
    {"name": "gsd", "drafting": "jacobi", "window": 4, "group": 4, "k": 4},  # GSD
    {"name": "exact", "drafting": "jacobi", "window": 4, "coupling": "maximal"},  # SCD, SJD-PAC's continuation
    {"name": "exact", "drafting": "jacobi", "window": 4, "coupling": "gumbel"},  # SCD's Gumbel noise
    {"name": "exact", "drafting": "jacobi", "window": 4, "coupling": "maximal", "proactive": 3},  # SJD-PAC
    {"name": "gsd", "drafting": "chain", "gamma": 3, "group": 4, "k": 4},
]


@pytest.fixture(scope="module")
def world(tmp_path_factory, one_thread):
    from lantern.engine.rules.neighbours import NeighbourParams, build_table, read_codebook
    from lantern.io import save_torch

    root = save_world(tmp_path_factory.mktemp("world"), tiny_target())
    save_torch(build_table(read_codebook(root / "vq.pt"), NeighbourParams(k=8)), root / "neighbours.pt")
    return root


def decode(world, spec, params, n_images):
    target = tiny_target()
    run = methods.build_decoder(spec, params, target, str(world / "drafter.pt"), str(world / "neighbours.pt"),
                                str(world / "vq.pt"), "cpu")
    return run(torch.arange(n_images) % 4, [image_generator(3, i) for i in range(n_images)])


@pytest.mark.parametrize("spec", SPECS, ids=methods.point_name)
@pytest.mark.parametrize("n_images", [1, 3], ids=["one", "batch"])
def test_speculative_decoders_draw_on_the_generators_device(world, spec, n_images):
    params = SamplingParams(cfg_scale=2.0)
    want, _ = decode(world, spec, params, n_images)
    with generator_device_check() as mode:
        got, _ = decode(world, spec, params, n_images)
    assert mode.draws > 0 and torch.equal(got, want)  # the check saw draws and changed nothing


def test_jacobi_greedy_refill_draws_on_the_generators_device(world):
    with generator_device_check() as mode:
        decode(world, {"name": "exact", "drafting": "jacobi", "window": 4}, SamplingParams(greedy=True), 2)
    assert mode.draws > 0


def test_plain_ar_draws_on_the_generators_device(one_thread):
    from lantern.engine.decoding.generate import generate

    with generator_device_check() as mode:
        gens = [image_generator(0, i) for i in range(3)]
        generate(tiny_target(), torch.arange(3), SamplingParams(cfg_scale=2.0), gens)
    assert mode.draws > 0


def test_the_old_jacobi_refill_is_caught():
    """The line SJD had before the fix (a CPU generator drawing on the window's device): the check fails on a CPU."""
    uniform = torch.full((16,), 1 / 16)
    with generator_device_check():
        g = torch.Generator().manual_seed(0)
        with pytest.raises(DrawOffGenerator, match="Expected a 'cuda' device type"):
            torch.randint(len(uniform), (3,), generator=g, device=uniform.device)
        torch.randint(len(uniform), (3,), generator=g, device=g.device)  # the fix passes
        torch.randint(len(uniform), (3,), generator=g)  # so does a draw on the default (CPU) device


def test_the_old_drop_cond_and_tensor_draws_are_caught():
    cond = torch.arange(4)
    with generator_device_check():
        g = torch.Generator().manual_seed(0)
        with pytest.raises(DrawOffGenerator, match="device="):
            torch.rand(cond.shape[0], device=cond.device, generator=g)  # model.drop_cond before the fix
        with pytest.raises(DrawOffGenerator, match="into or from a tensor"):
            torch.empty(3).uniform_(generator=g)
        with pytest.raises(DrawOffGenerator, match="into or from a tensor"):
            torch.multinomial(torch.ones(3), 1, generator=g)
    outside = torch.Generator().manual_seed(0)
    with generator_device_check(), pytest.raises(DrawOffGenerator, match="made before"):
        torch.rand(2, generator=outside)


def test_drop_cond_draws_on_the_generators_device():
    target = tiny_target()
    with generator_device_check() as mode:
        out = target.drop_cond(torch.arange(4), 0.5, generator=torch.Generator().manual_seed(1))
    assert mode.draws == 1 and out.shape == (4,)


# -- trainers at tiny size ---------------------------------------------------------------------------------------
def test_toy_vq_and_gpt_training_draw_on_the_generators_device(tmp_path, one_thread):
    from lantern.worlds.toy import data, tokenize, train_gpt, train_vq

    data.main(["--out", str(tmp_path / "train.pt"), "--n", "32", "--seed", "0"])
    data.main(["--out", str(tmp_path / "val.pt"), "--n", "16", "--seed", "0", "--start", "32"])
    vq = {"steps": 3, "batch_size": 8, "ch": 16, "z_channels": 32, "codebook_size": 64, "restart_every": 2,
          "eval_batch": 16}
    gpt = {"dim": 32, "n_layer": 1, "n_head": 2, "steps": 2, "batch_size": 4, "eval_every": 2, "warmup_steps": 1}
    with generator_device_check() as mode:
        train_vq.main(["--data", str(tmp_path / "train.pt"), "--val", str(tmp_path / "val.pt"),
                       "--out", str(tmp_path / "vq.pt"), "--params", json.dumps(vq)])
        vq_draws = mode.draws
        for split in ("train", "val"):
            tokenize.main(["--data", str(tmp_path / f"{split}.pt"), "--vq", str(tmp_path / "vq.pt"),
                           "--out", str(tmp_path / f"tok_{split}.pt")])
        train_gpt.main(["--tokens", str(tmp_path / "tok_train.pt"), "--val", str(tmp_path / "tok_val.pt"),
                        "--out", str(tmp_path / "gpt.pt"), "--params", json.dumps(gpt)])
    assert vq_draws > 0 and mode.draws > vq_draws


def test_drafter_training_draws_on_the_generators_device(one_thread):
    from lantern.pipeline.train_drafter import DrafterParams, self_generate, train_drafter

    target = tiny_target()
    with generator_device_check() as mode:
        labels = torch.arange(12) % 4
        tokens = self_generate(target, labels, {"temperature": 1.0}, seed=0)
        train_drafter(target, tokens, labels, DrafterParams(epochs=1, batch_size=4))
    assert mode.draws > 0


def test_clip_training_draws_on_the_generators_device(one_thread):
    from lantern.metrics import train_clip
    from lantern.worlds.toy.data import make_dataset

    data = make_dataset(24, seed=0)
    p = train_clip.TrainClipParams(image_tower="vit", patch_size=8, vision_width=32, vision_layers=1, text_layers=1,
                                   steps=2, batch_size=8, warmup_steps=1, n_val=8)
    net, tok = train_clip.build(train_clip.model_config(p, 32), "toyclip")
    with generator_device_check() as mode:
        train_clip.train(net, tok, data["images"], data["captions"], data["labels"], p, recon=data["images"],
                         progress=False)
    assert mode.draws == 3 * p.steps


@pytest.mark.parametrize("spec", [SPECS[1], SPECS[8]], ids=methods.point_name)
def test_graph_rounds_draw_on_the_generators_device(world, spec, monkeypatch):
    """compile=True's rounds (graph.GraphLoop: each image's stream drawn in the prefill, the generators advanced at
    the end), their static shapes without inductor."""
    from lantern.engine.decoding import compiled

    monkeypatch.setattr(compiled, "compiled_step", lambda fn, device: fn)
    params = SamplingParams(cfg_scale=2.0)
    target = tiny_target()
    run = methods.build_decoder(spec, params, target, str(world / "drafter.pt"), str(world / "neighbours.pt"),
                                str(world / "vq.pt"), "cpu", True)
    with generator_device_check() as mode:
        run(torch.arange(3) % 4, [image_generator(3, i) for i in range(3)])
    assert mode.draws > 0
