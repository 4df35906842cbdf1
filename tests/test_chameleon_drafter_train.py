"""`lantern train-drafter --family`: the authors' Chameleon drafter trained on a tiny released-layout world's own
generations (tests/tiny_chameleon.write_world, 64 px, 32 prompt slots): the loss falls on its training data, the
folder loads strictly through worlds/chameleon/hf.load_drafter and decodes greedy = greedy AR in both families,
dropped rows carry the family's uncond prompt, training's uncached pass equals cached drafting on padded prompts, a
resumed run equals an uninterrupted one, and bad arguments are one line."""
import json

import pytest
import torch

import lantern
from lantern.engine.models.chameleon import ChameleonDrafter
from lantern.engine.models.chameleon_load import drafter_from_authors, drafter_to_authors
from lantern.engine.models.drafter import drafter_mask, target_states
from lantern.errors import UserError
from lantern.hparams import DrafterParams
from lantern.pipeline import train_drafter as module
from lantern.pipeline.train_drafter import chameleon_self_data, evaluate, main, new_drafter, train_drafter
from lantern.worlds.chameleon.hf import load_drafter
from tiny import one_thread  # noqa: F401 (fixture)
from tiny_chameleon import write_world

pytestmark = pytest.mark.usefixtures("one_thread")
PIXELS, SLOTS = 64, 32
CAPTIONS = ["a red cat", "a cat on the mat , a red mat", "the mat", "a red cat on a red mat"]
PARAMS = dict(data="self", n_self=24, epochs=3, batch_size=8, lr=3e-3, val_frac=0.2, checkpoint_every=2)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("chameleon")
    out = write_world(root, positions=128)
    (root / "prompts.json").write_text(json.dumps(CAPTIONS))
    return {**out, "prompts": root / "prompts.json"}


def world_of(files, family, drafter=None):
    return lantern.load_chameleon(family, target=files["target"], vqgan_ckpt=files["vqgan_ckpt"],
                                  tokenizer=files["tokenizer"], drafter=drafter, pixels=PIXELS,
                                  prompt_tokens=SLOTS, device="cpu", dtype="fp32")


def cli(files, family, out, params=PARAMS, *extra):
    main(["--family", family, "--target", str(files["target"]), "--tokenizer", str(files["tokenizer"]),
          "--vqgan-ckpt", str(files["vqgan_ckpt"]), "--prompts", str(files["prompts"]), "--pixels", str(PIXELS),
          "--prompt-tokens", str(SLOTS), "--device", "cpu", "--params", json.dumps(params), "--out", str(out), *extra])


@pytest.fixture(scope="module")
def trained(files, tmp_path_factory):
    """Each family's drafter folder, written by the CLI."""
    root = tmp_path_factory.mktemp("drafters")
    for family in ("anole", "lumina-mgpt"):
        cli(files, family, root / family)
    return root


@pytest.mark.parametrize("family", ["anole", "lumina-mgpt"])
def test_training_lowers_the_loss_on_its_training_data(files, tmp_path, family):
    world = world_of(files, family)
    params = DrafterParams(**{**PARAMS, "epochs": 20, "checkpoint_every": 0})
    tokens, cond, mask = chameleon_self_data(world, CAPTIONS, params, tmp_path / "self.pt", batch=8)
    steps = world.target.args.image_tokens
    assert tokens.shape == (24, steps) and cond.shape == (24, SLOTS)
    if family == "lumina-mgpt":  # the generated steps carry the forced eol (column 8192) and eoi (8193)
        assert steps == 21 and (tokens[:, 4::5] == 8192).all() and (tokens[:, -1] == 8193).all()
        assert tokens[:, [i for i in range(20) if i % 5 != 4]].max() < 8192
    else:
        assert tokens.max() < 8192
    batches = lambda: [(cond[i : i + 8], tokens[i : i + 8, :-1], mask[i : i + 8]) for i in (0, 8, 16)]  # noqa: E731
    torch.manual_seed(params.seed)
    before = evaluate(new_drafter(world.target, params), world.target, batches(), params.ce_weight)["val_loss"]
    drafter, log = train_drafter(world.target, tokens, cond, params, mask)
    after = evaluate(drafter, world.target, batches(), params.ce_weight)["val_loss"]
    assert after < 0.8 * before, (before, after)
    assert log["history"][-1]["train_loss"] < log["history"][0]["train_loss"]


@pytest.mark.parametrize("family", ["anole", "lumina-mgpt"])
def test_the_folder_loads_strictly_and_greedy_chains_give_greedy_ar(files, trained, family):
    folder = trained / family
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 1 and cfg["bias"] is True
    sd = torch.load(folder / "pytorch_model.bin", weights_only=True)
    assert {"embed_tokens.weight", "fc.weight", "fc.bias", "layers.0.self_attn.q_norm.bias"} <= set(sd)
    assert not any(k.startswith(("output.", "lm_head.", "layer.")) for k in sd)
    world = world_of(files, family, drafter=folder)
    assert isinstance(world.drafter, ChameleonDrafter)
    assert torch.equal(load_drafter(folder, world.target).fc.weight, world.drafter.fc.weight)
    record = json.loads((folder / "training.json").read_text())
    assert record["sequences"] == 24 and len(record["history"]) == 3
    prompts = CAPTIONS[:2]
    ar = lantern.generate(world, prompts, "vanilla", mode="greedy")
    chain = lantern.generate(world, prompts, "exact", drafting="chain", gamma=3, mode="greedy")
    assert torch.equal(chain.tokens, ar.tokens)
    sampled = lantern.generate(world, prompts, "lantern", delta=0.2, k=3, drafting="chain", gamma=3, seed=1)
    assert sampled.tau >= 1.0


def test_the_authors_keys_round_trip_exactly(files):
    """drafter_to_authors is drafter_from_authors' inverse (the rotate-half permutation of q / k and their norms)."""
    world = world_of(files, "anole")
    torch.manual_seed(3)
    drafter = ChameleonDrafter.from_target(world.target)
    for p in drafter.layer.parameters():
        torch.nn.init.normal_(p)
    back = drafter_from_authors(drafter_to_authors(drafter, world.target, torch.float32), "mem", world.target)
    for key, value in drafter.state_dict().items():
        assert torch.equal(back.state_dict()[key], value), key


def test_dropped_rows_carry_the_family_uncond_prompt(files):
    world = world_of(files, "lumina-mgpt")
    target = world.target
    cond, mask, _ = world._prompts(CAPTIONS * 100)
    gen = torch.Generator().manual_seed(0)
    c, m = target.drop_conditions(cond, mask, 0.25, gen)
    dropped = (c != cond).any(-1)
    assert 60 <= int(dropped.sum()) <= 140  # 400 rows at p 0.25: 100 +- 4 sd
    null = [1] * (SLOTS - 3) + [8197, 8806, 8806]  # [boi, size, size], left-padded
    assert (c[dropped] == torch.tensor(null)).all() and (m[dropped].sum(-1) == 3).all()
    assert m[dropped][:, -3:].all() and torch.equal(m[~dropped], mask[~dropped])
    kept = target.drop_conditions(cond, mask, 0.0)
    assert kept[0] is cond and kept[1] is mask
    with pytest.raises(UserError, match="null prompt"):  # a target without CFG null prompt has nothing to drop to
        from dataclasses import replace

        from lantern.engine.models.chameleon import Chameleon

        bare = Chameleon(replace(target.args, uncond_prompt=()))
        bare.drop_conditions(cond, mask, 0.5)


@torch.no_grad()
def test_the_training_pass_equals_cached_drafting_on_padded_prompts(files):
    """The uncached pass training runs (its padding mask and per-row positions) computes what cached drafting
    computes for left-padded prompts of different lengths."""
    world = world_of(files, "anole")
    target = world.target
    cond, mask, _ = world._prompts(CAPTIONS[:3])
    torch.manual_seed(0)
    d = ChameleonDrafter.from_target(target).eval()
    torch.nn.init.normal_(d.layer.attention.wo.weight, std=0.5)  # make attention matter
    tokens = torch.randint(0, 8192, (3, 15))
    x, h, _ = target_states(target, cond, tokens, mask)
    S, T = x.shape[1] - 1, SLOTS
    emb = d.inputs(x[:, :T], tokens)
    full = d(emb, h[:, :-1], d.padding_mask(mask, S), d.uncached_positions(mask, S))
    d.setup_cache(3, cond_mask=mask)
    parts, s = [], 0
    for n in (T, 3, 1, 4, 2, 4):
        parts.append(d.step(emb[:, s : s + n], h[:, s : s + n], s))
        s += n
    d.clear_cache()
    cached = torch.cat(parts, 1)
    torch.testing.assert_close(cached[:, T - 1 :], full[:, T - 1 :], atol=1e-5, rtol=1e-5)
    shifted = d(emb, h[:, :-1], drafter_mask(mask, S))  # LlamaGen's shifted mask would differ
    assert not torch.allclose(shifted[:, T - 1 :], full[:, T - 1 :], atol=1e-4)


class Killed(Exception):
    pass


def test_a_resumed_run_ends_with_the_uninterrupted_weights_and_reuses_its_data(files, tmp_path, monkeypatch, capsys):
    cli(files, "anole", tmp_path / "whole")
    real, calls = module.drafter_losses, []

    def dies(drafter, target, c, t, noise, m, unroll):
        if noise > 0:
            calls.append(1)
            if len(calls) == 5:  # after the checkpoint at step 4
                raise Killed
        return real(drafter, target, c, t, noise, m, unroll)

    with monkeypatch.context() as mp:
        mp.setattr(module, "drafter_losses", dies)
        with pytest.raises(Killed):
            cli(files, "anole", tmp_path / "cut")
    assert (tmp_path / "cut.resume.pt").is_file() and (tmp_path / "cut.self.pt").is_file()
    assert not (tmp_path / "cut" / "config.json").exists()
    capsys.readouterr()
    cli(files, "anole", tmp_path / "cut")
    err, out = capsys.readouterr()
    assert "24 of 24 self-generated sequences read from" in err + out and "resuming from" in err + out
    assert not (tmp_path / "cut.resume.pt").exists()
    whole = torch.load(tmp_path / "whole" / "pytorch_model.bin", weights_only=True)
    cut = torch.load(tmp_path / "cut" / "pytorch_model.bin", weights_only=True)
    assert whole.keys() == cut.keys() and all(torch.equal(whole[k], cut[k]) for k in whole)
    other = dict(PARAMS, seed=1)  # another seed: other sequences, other weights
    cli(files, "anole", tmp_path / "seed1", other)
    assert not torch.equal(torch.load(tmp_path / "seed1" / "pytorch_model.bin", weights_only=True)["fc.weight"],
                           whole["fc.weight"])


@pytest.mark.parametrize("change, message", [
    ({"extra": ["--tokens", "x.pt"]}, "--tokens is for LlamaGen targets"),
    ({"params": dict(PARAMS, data="real")}, "set data: self and n_self"),
    ({"params": dict(PARAMS, feature_layers=[0])}, "reads the last hidden state only"),
    ({"params": dict(PARAMS, cond_dropout=1.5)}, "cond_dropout=1.5 must lie in"),
    ({"drop": "--prompts"}, "needs --prompts"),
    ({"extra": ["--gen-batch", "0"]}, "--gen-batch 0 must be a positive"),
    ({"prompts": "missing.json"}, "does not exist"),
])
def test_bad_arguments_are_one_line(files, tmp_path, change, message):
    args = ["--family", "anole", "--target", str(files["target"]), "--tokenizer", str(files["tokenizer"]),
            "--vqgan-ckpt", str(files["vqgan_ckpt"]), "--prompts", str(change.get("prompts", files["prompts"])),
            "--params", json.dumps(change.get("params", PARAMS)), "--out", str(tmp_path / "d"),
            *change.get("extra", [])]
    if "drop" in change:
        i = args.index(change["drop"])
        del args[i : i + 2]
    with pytest.raises(UserError) as e:
        main(args)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "d").exists()


def test_chameleon_flags_need_a_family_and_out_must_be_a_folder(files, tmp_path):
    with pytest.raises(UserError, match="--prompts is for Chameleon targets; give --family"):
        main(["--target", "t.pt", "--out", str(tmp_path / "d.pt"), "--prompts", str(files["prompts"])])
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="is a file; a Chameleon drafter is a folder"):
        cli(files, "anole", tmp_path / "file")


def test_prompt_files_of_each_kind_and_the_api_refuses_feature_layers(files, tmp_path):
    from lantern.pipeline.train_drafter_chameleon import read_prompt_set
    from lantern.worlds.llamagen.prompts import write_prompts

    (tmp_path / "p.tsv").write_text("Prompt\tCategory\na red cat\tAnimals\nthe mat\tThings\n")
    write_prompts([("7", "a red cat"), ("8", "the mat")], tmp_path / "p.csv")
    for name in ("p.tsv", "p.csv"):
        assert read_prompt_set(tmp_path / name) == ["a red cat", "the mat"], name
    assert read_prompt_set(files["prompts"]) == CAPTIONS
    (tmp_path / "empty.json").write_text("[]")
    with pytest.raises(UserError, match="holds no prompts"):
        read_prompt_set(tmp_path / "empty.json")
    world = world_of(files, "anole")
    with pytest.raises(UserError, match="reads the last hidden state only"):
        new_drafter(world.target, DrafterParams(feature_layers=[0]))


def test_a_killed_data_step_goes_on_from_its_stored_sequences(files, tmp_path, monkeypatch, capsys):
    """Self-generation killed after its second batch (stored every 8 sequences) goes on from the 16 stored, and
    ends with the sequences of an uninterrupted step."""
    import lantern.engine.decoding.generate as gen_module
    from lantern.pipeline import train_drafter_chameleon as cham

    world = world_of(files, "lumina-mgpt")
    params = DrafterParams(**PARAMS)
    want, cond, _ = chameleon_self_data(world, CAPTIONS, params, tmp_path / "whole.pt", batch=8)
    monkeypatch.setattr(cham, "SAVE_EVERY", 8)
    real, calls = gen_module.generate, []

    def dies(*a, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise Killed
        return real(*a, **kw)

    with monkeypatch.context() as mp:
        mp.setattr(gen_module, "generate", dies)
        with pytest.raises(Killed):
            chameleon_self_data(world, CAPTIONS, params, tmp_path / "cut.pt", batch=8)
    assert len(torch.load(tmp_path / "cut.pt", weights_only=True)["tokens"]) == 16
    capsys.readouterr()
    got, got_cond, _ = chameleon_self_data(world, CAPTIONS, params, tmp_path / "cut.pt", batch=4)
    assert "16 of 24 self-generated sequences read from" in capsys.readouterr().out
    assert torch.equal(got, want) and torch.equal(got_cond, cond)
    other = chameleon_self_data(world, CAPTIONS, DrafterParams(**dict(PARAMS, n_self=20)), tmp_path / "cut.pt", 8)
    assert "another data step's sequences" in capsys.readouterr().out and len(other[0]) == 20
