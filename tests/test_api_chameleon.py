"""lantern.load_chameleon on tiny released-layout files written here (a transformers Chameleon with the real id
layout, a taming VQGAN with 8192 codes, a tokenizer.json with Chameleon's vocabulary, the authors' drafter folder):
prompts as text, each family's layout, pixels through the VQGAN, the authors' sampling defaults, and every missing
file named before any weight is read."""
import numpy as np
import pytest
import torch

import lantern
from lantern.errors import UserError
from lantern.worlds.chameleon.vqgan import decode_codes
from tiny import one_thread  # noqa: F401 (fixture)
from tiny_chameleon import write_world

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPTS = ["a red cat", "a cat on the mat , a red mat"]  # words of the test vocabulary; different lengths
PIXELS = 64  # a 4 x 4 code grid (the family's 16-px patches); the tiny VQGAN (stride 2) draws it as 8 x 8 px


@pytest.fixture(scope="module")
def world_files(tmp_path_factory):
    return write_world(tmp_path_factory.mktemp("chameleon"), positions=128)


def load(files, family, drafter=False, **kw):
    paths = {k: v for k, v in files.items() if k != "drafter" or drafter}
    return lantern.load_chameleon(family, **paths, pixels=PIXELS, prompt_tokens=32, device="cpu", dtype="fp32", **kw)


def test_anole_world_generates_from_text_prompts(world_files):
    world = load(world_files, "anole")
    assert world.layout is None and world.sampling == {"cfg_scale": 3.0, "top_k": 2000}
    assert world.target.args.uncond_prompt == (0, 8197)  # [<s>, <racm3:break>]
    out = lantern.generate(world, PROMPTS, "vanilla", seed=3)
    assert out.tokens.shape == (2, 16) and 0 <= out.tokens.min() and out.tokens.max() < 8192
    assert out.pixels.shape == (2, 8, 8, 3) and out.pixels.dtype == np.uint8
    with torch.no_grad():
        want = decode_codes(world.vq, out.tokens.reshape(2, 4, 4)).numpy()
    assert np.array_equal(out.pixels, want)
    assert [s["caption"] for s in out.stats] == PROMPTS and all(s["tau"] == 1.0 for s in out.stats)
    alone = lantern.generate(world, PROMPTS[1:], "vanilla", seed=3, first_index=1)  # padding changes nothing
    assert torch.equal(alone.tokens[0], out.tokens[1])


def test_lumina_world_forces_its_structural_tokens(world_files):
    world = load(world_files, "lumina-mgpt")
    lay = world.layout
    assert (lay.rows, lay.cols, lay.eol, lay.eoi) == (4, 4, 8192, 8193)
    assert world.target.args.extra_ids == (8803, 8196) and world.target.args.image_tokens == 21
    assert world.target.args.uncond_prompt == (8197, 8806, 8806)  # [boi, size, size] at 64 px
    out = lantern.generate(world, PROMPTS, "vanilla", seed=0)
    assert out.tokens.shape == (2, 16) and out.tokens.max() < 8192  # codes only: eol / eoi never drawn
    # one prefill + 15 code forwards + the 3 eol that a later code reads (docs/chameleon-layout.md)
    assert all(s["target_forwards"] == 19 for s in out.stats)
    ids, mask, _ = world._prompts(PROMPTS[:1])
    assert ids[0, -3:].tolist() == [8197, 8806, 8806] and int(mask.sum()) < 32


@pytest.mark.parametrize("family", ["anole", "lumina-mgpt"])
def test_greedy_chains_with_the_authors_drafter_give_greedy_ar(world_files, family):
    world = load(world_files, family, drafter=True)
    ar = lantern.generate(world, PROMPTS, "vanilla", mode="greedy")
    chain = lantern.generate(world, PROMPTS, "exact", drafting="chain", gamma=3, mode="greedy")
    assert torch.equal(chain.tokens, ar.tokens)
    relaxed = lantern.generate(world, PROMPTS, "lantern", delta=0.2, k=3, drafting="chain", gamma=3, seed=1)
    assert relaxed.tokens.shape == (2, 16) and relaxed.tau >= 1.0


def test_anole_runs_every_drafting_kind_without_a_layout(world_files):
    world = load(world_files, "anole", drafter=True)
    ar = lantern.generate(world, PROMPTS[:1], "vanilla", mode="greedy")
    for kind in ({"drafting": "static", "tree": "mc_sim_7b_63"}, {"drafting": "jacobi"}):
        got = lantern.generate(world, PROMPTS[:1], "exact", mode="greedy", **kind)
        assert torch.equal(got.tokens, ar.tokens), kind


def test_every_missing_file_is_named_before_loading(tmp_path):
    with pytest.raises(UserError) as e:
        lantern.load_chameleon("lumina-mgpt", target=tmp_path / "t", vqgan_ckpt=tmp_path / "v.ckpt",
                               tokenizer=tmp_path / "tok.json", drafter=tmp_path / "d")
    msg = str(e.value)
    assert "\n" not in msg and msg.count("does not exist") == 5
    for name in ("t", "d", "v.ckpt", "vqgan.yaml", "tok.json"):
        assert str(tmp_path / name) in msg
    with pytest.raises(UserError, match="is not a Chameleon family; use one of anole, lumina-mgpt"):
        lantern.load_chameleon("llamagen", target=tmp_path, vqgan_ckpt=tmp_path, tokenizer=tmp_path)


def test_bad_prompts_are_one_line(world_files):
    world = load(world_files, "anole")
    with pytest.raises(UserError, match="takes prompts as text"):
        lantern.generate(world, [0, 1])
    with pytest.raises(UserError, match="over the world's 32 prompt slots"):
        lantern.generate(world, [" ".join(["cat"] * 40)])


@pytest.mark.parametrize("kind", [{"drafting": "chain", "gamma": 5}, {"drafting": "static", "tree": "mc_sim_7b_63"},
                                  {"drafting": "dynamic", "total_tokens": 12, "depth": 3, "top_k": 3},
                                  {"drafting": "jacobi", "window": 6}])
def test_lumina_rounds_at_static_widths_equal_eager(world_files, monkeypatch, kind):
    """compile=True's one-call rounds on the Lumina world (the Chameleon target, eol in its head's columns; inductor
    left out, the static widths and kept buffers alone): each image's codes and stats as the eager rounds'."""
    from lantern.engine.decoding import compiled

    world = load(world_files, "lumina-mgpt", drafter=True)
    asked = []
    monkeypatch.setattr(compiled, "compiled_step", lambda fn, device: asked.append(fn.__name__) or fn)
    eager = lantern.generate(world, PROMPTS, "lantern", seed=1, batch_size=2, compile=False, delta=0.9, k=200, **kind)
    graph = lantern.generate(world, PROMPTS, "lantern", seed=1, batch_size=2, compile=True, delta=0.9, k=200, **kind)
    assert set(asked) == {{"chain": "chain_round", "jacobi": "jacobi_round"}.get(kind["drafting"], "tree_round")}
    assert torch.equal(graph.tokens, eager.tokens) and not torch.equal(eager.tokens[0], eager.tokens[1])
    assert [s["tau"] for s in graph.stats] == [s["tau"] for s in eager.stats]
    assert max(s["tau"] for s in eager.stats) > 1  # some drafts accepted (the tiny drafter is random)


def test_lumina_runs_every_drafting_kind_eager_under_compile_auto(world_files, monkeypatch):
    """compile auto would compile on CUDA, where rounds with forced tokens are checked on CPU only so far: a layout
    world's speculative rounds run eager; chains, trees, Jacobi windows, SJD-PAC's proactive tree and VVS's skipped
    verifies all decode it, the exact ones giving greedy AR's tokens."""
    from lantern.engine.decoding import compiled

    world = load(world_files, "lumina-mgpt", drafter=True)
    monkeypatch.setattr(compiled, "resolve", lambda option, device: option in ("auto", None, True))  # as on CUDA
    asked = []  # the compiled steps, run without inductor
    monkeypatch.setattr(compiled, "compiled_step", lambda fn, device: asked.append(fn.__name__) or fn)
    ar = lantern.generate(world, PROMPTS[:1], "vanilla", mode="greedy", compile=False)
    chain = lantern.generate(world, PROMPTS[:1], "exact", mode="greedy", compile="auto")
    tree = lantern.generate(world, PROMPTS[:1], "exact", mode="greedy", compile="auto", drafting="static",
                            tree="mc_sim_7b_63")
    sjd = lantern.generate(world, PROMPTS[:1], "exact", mode="greedy", compile="auto", drafting="jacobi", window=6)
    assert torch.equal(chain.tokens, ar.tokens) and torch.equal(tree.tokens, ar.tokens)
    pac = lantern.generate(world, PROMPTS[:1], "exact", mode="greedy", compile="auto", drafting="jacobi", window=6,
                           proactive=2)
    assert torch.equal(sjd.tokens, ar.tokens) and torch.equal(pac.tokens, ar.tokens) and not asked
    vvs = lantern.generate(world, PROMPTS[:1], "exact", compile="auto", drafting="chain", skip="every", skip_every=2)
    assert vvs.tokens.shape == ar.tokens.shape and vvs.tokens.max() < 8192 and not asked
