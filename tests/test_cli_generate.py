"""`lantern generate`: on the toy world it writes the grid of the API's images and prints tau and the speed-up over
plain AR; with tiny upstream-layout LlamaGen files it takes the config's llamagen keys as flags; bad flags are one
line before any model loads."""
import numpy as np
import pytest
from PIL import Image

import lantern
from lantern.pipeline import cli
from tiny import one_thread  # noqa: F401 (fixture)
from tiny_llamagen import SIZE, write_files


@pytest.fixture(scope="module")
def files(tmp_path_factory, one_thread):  # noqa: F811 (fixture)
    return write_files(tmp_path_factory.mktemp("llamagen"))


def test_toy_grid_tau_and_speed_up(tmp_path, capfd, one_thread):  # noqa: F811
    out = tmp_path / "grid.png"
    assert cli.main(["generate", "--classes", "ring", "star", "-n", "4", "--seed", "2", "--columns", "2",
                     "--out", str(out)]) == 0
    printed = capfd.readouterr()
    assert "lantern-chain-g4-d0.1-k3 (sampling): 4 images, tau " in printed.out
    assert "plain AR on the same seeds: " in printed.out and "x (one process" in printed.out
    progress = [line for line in printed.err.splitlines() if "images/s" in line]  # the first batch, then the last
    assert [line.split(",")[0] for line in progress] == ["lantern-chain-g4-d0.1-k3: 1/4 images",
                                                         "lantern-chain-g4-d0.1-k3: 4/4 images",
                                                         "vanilla: 1/4 images", "vanilla: 4/4 images"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.png"]  # written by rename, nothing left beside it
    want = lantern.generate(lantern.load_world("toy", device="cpu"), ["ring", "star", "ring", "star"], "lantern",
                            delta=0.1, k=3, seed=2)
    assert np.array_equal(np.asarray(Image.open(out)), np.asarray(want.grid(columns=2)))

    assert cli.main(["generate", "--classes", "0", "-n", "1", "--method", "vanilla", "--quiet",
                     "--out", str(tmp_path / "one.jpg")]) == 0
    printed = capfd.readouterr()
    assert "vanilla (sampling): 1 images, tau 1.00" in printed.out and "speed-up" not in printed.out
    assert "images/s" not in printed.err
    assert Image.open(tmp_path / "one.jpg").size == (32, 32)


def test_llamagen_files_take_the_configs_keys(files, tmp_path, capfd):
    flags = ["--gpt-ckpt", files["gpt_ckpt"], "--vq-ckpt", files["vq_ckpt"], "--gpt-size",
             "{dim: %d, n_layer: %d, n_head: %d}" % (SIZE["dim"], SIZE["n_layer"], SIZE["n_head"]),
             "--num-classes", "4", "--image-size", "64", "--device", "cpu"]
    for drafter in (["--drafter-ckpt", files["drafter_ckpt"]], ["--authors-drafter", files["authors_drafter"]]):
        out = tmp_path / "grid.png"
        assert cli.main(["generate", *flags, *drafter, "--classes", "0", "3", "-n", "2", "--delta", "0.2", "--k",
                         "5", "--batch-size", "2", "--quiet", "--out", str(out)]) == 0
        printed = capfd.readouterr().out
        assert "lantern-chain-g4-d0.2-k5 (sampling): 2 images" in printed and "speed-up" in printed
        assert Image.open(out).size == (2 * 8, 8)  # 4 x 4 tokens, the tiny VQ upsamples by 2


@pytest.mark.parametrize("argv,message", [
    (["--out", "grid.xyz"], "--out grid.xyz: unknown image type .xyz"),
    (["--out", "/nonexistent/folder/grid.png"], "folder /nonexistent/folder does not exist"),
    (["--method", "lantern", "--delta", "2", "--k", "3"], "method.delta = 2 exceeds 1"),
    (["--method", "lantern", "--delta", "0.1"], "method (lantern) needs k"),
    (["--classes", "hexagon"], "class 'hexagon' is not a class of the toy world"),
    (["--gpt-size", "GPT-B"], "--gpt-size describe a LlamaGen world: also give --gpt-ckpt and --vq-ckpt"),
    (["--gpt-ckpt", "c2i_B_256.pt"], "a LlamaGen world needs both --gpt-ckpt and --vq-ckpt"),
    (["--prompts", "a cat"], "--prompts are for text-to-image targets"),
    (["-n", "0"], "-n 0: give at least one image"),
])
def test_bad_flags_are_one_line(argv, message, tmp_path, capfd, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["generate", "--no-baseline", *argv]) == 2
    err = capfd.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err


def test_llamagen_flags_are_checked_against_the_weights(files, capfd):
    assert cli.main(["generate", "--gpt-ckpt", files["gpt_ckpt"], "--vq-ckpt", files["vq_ckpt"], "--gpt-size",
                     "GPT-B", "--device", "cpu"]) == 2
    err = capfd.readouterr().err.strip()
    assert "but llamagen.gpt_size = GPT-B; set llamagen.gpt_size: {dim: 64, n_layer: 2, n_head: <heads>}" in err


def test_out_is_checked_before_decoding_and_named_in_write_errors(tmp_path, capfd, monkeypatch):
    """Issue #61: a folder, a missing parent or an unwritable folder at --out is one line naming --out before any
    model loads; a write that fails anyway (a full disk) says --out, not the pipeline's outdir."""
    import os

    from lantern import api

    monkeypatch.chdir(tmp_path)
    (tmp_path / "grid.png").mkdir()
    loaded = []
    monkeypatch.setattr(api, "load_world", lambda *a, **k: loaded.append(1))  # nothing may load before the check
    cases = [(["--out", "grid.png"], "error: --out grid.png is a folder; give the grid's file name (e.g. --out "
              "grid.png/grid.png)"),
             (["--out", "missing/grid.png"], "error: --out missing/grid.png: folder missing does not exist")]
    for argv, message in cases:
        assert cli.main(["generate", "-n", "1", "--method", "vanilla", *argv]) == 2
        assert capfd.readouterr().err.strip().startswith(message)
    (tmp_path / "locked").mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == "locked" else real_access(p, mode))
    assert cli.main(["generate", "-n", "1", "--method", "vanilla", "--out", "locked/grid.png"]) == 2
    err = capfd.readouterr().err.strip()
    assert err.startswith("error: --out locked/grid.png: folder locked is not writable for this user") and "\n" not in err
    assert loaded == []
    monkeypatch.undo()

    from test_bad_inputs import enospc_on_write

    monkeypatch.chdir(tmp_path)
    enospc_on_write(monkeypatch)
    assert cli.main(["generate", "-n", "1", "--method", "vanilla", "--no-baseline", "--quiet", "--out",
                     "one.png"]) == 2
    err = capfd.readouterr().err.strip()
    assert "cannot write one.png: no space left on the device" in err and "give --out a disk with room" in err
    assert "outdir" not in err and "\n" not in err


# --- a Chameleon family (#59): tiny released-layout files (tests/tiny_chameleon.write_world), 64 px = 4 x 4 codes
CHAMELEON_PROMPTS = ["a red cat", "a cat on the mat , a red mat"]  # words of the test vocabulary


@pytest.fixture(scope="module")
def chameleon(tmp_path_factory, one_thread):  # noqa: F811 (fixture)
    from tiny_chameleon import write_world

    return {k: str(v) for k, v in write_world(tmp_path_factory.mktemp("chameleon"), positions=128).items()}


def family_flags(files: dict, family: str, drafter: bool = True) -> list[str]:
    flags = ["--family", family, "--target", files["target"], "--vqgan-ckpt", files["vqgan_ckpt"], "--tokenizer",
             files["tokenizer"], "--pixels", "64", "--prompt-tokens", "32", "--device", "cpu", "--dtype", "fp32",
             "--threads", "1"]
    return flags + (["--drafter", files["drafter"]] if drafter else [])


def test_chameleon_family_writes_the_apis_grid_with_the_authors_sampling(chameleon, tmp_path, capfd):
    """Lumina-mGPT with the authors' static tree: the grid is lantern.generate's on load_chameleon's world (CFG 3,
    top-k 2000 unless a flag says otherwise), tau printed as ours and as the authors' count, the plain-AR baseline."""
    out = tmp_path / "grid.png"
    method = ["--method", "lantern", "--delta", "0.1", "--k", "20", "--drafting", "static", "--tree", "mc_sim_7b_63",
              "--residual", "lumina"]
    assert cli.main(["generate", *family_flags(chameleon, "lumina-mgpt"), "--prompts", *CHAMELEON_PROMPTS, "-n",
                     "3", "--seed", "5", "--columns", "3", *method, "--quiet", "--out", str(out)]) == 0
    printed = capfd.readouterr().out
    world = lantern.load_chameleon("lumina-mgpt", **chameleon, pixels=64, prompt_tokens=32, device="cpu",
                                   dtype="fp32")
    want = lantern.generate(world, CHAMELEON_PROMPTS + CHAMELEON_PROMPTS[:1], "lantern", delta=0.1, k=20,
                            drafting="static", tree="mc_sim_7b_63", residual="lumina", seed=5)
    assert np.array_equal(np.asarray(Image.open(out)), np.asarray(want.grid(columns=3)))
    assert Image.open(out).size == (3 * 8, 8)  # 4 x 4 codes, the tiny VQGAN (stride 2) draws 8 x 8 px
    assert f"lantern-static-mc_sim_7b_63-d0.1-k20-lumina (sampling): 3 images, tau {want.tau:.2f} (the authors' " \
           "count, forced tokens included: " in printed
    assert "plain AR on the same seeds: " in printed and "x (one process" in printed
    other = lantern.generate(world, CHAMELEON_PROMPTS[:1], "vanilla", seed=5, sampling={"cfg_scale": 1.0})
    assert cli.main(["generate", *family_flags(chameleon, "lumina-mgpt", drafter=False), "--prompts",
                     CHAMELEON_PROMPTS[0], "-n", "1", "--seed", "5", "--method", "vanilla", "--cfg-scale", "1",
                     "--quiet", "--out", str(out)]) == 0
    assert np.array_equal(np.asarray(Image.open(out)), other.pixels[0])  # a sampling flag overrides the authors'


def test_chameleon_family_default_point_is_the_authors(chameleon, tmp_path, capfd):
    """No --method: the authors' LANTERN defaults (delta 0.1, k 1000) with the family's drafting and residual."""
    out = tmp_path / "grid.png"
    assert cli.main(["generate", *family_flags(chameleon, "anole"), "--prompts", CHAMELEON_PROMPTS[1], "-n", "1",
                     "--no-baseline", "--quiet", "--out", str(out)]) == 0
    printed = capfd.readouterr().out
    assert "lantern-dynamic-" in printed and "-d0.1-k1000-reference (sampling): 1 images, tau " in printed
    assert "the authors' count" not in printed and "speed-up" not in printed  # Anole forces no token
    assert Image.open(out).size == (8, 8)


@pytest.mark.parametrize("argv,message", [
    (["--classes", "0", "--prompts", "a cat"], "--classes are for class-conditional worlds; a lumina-mgpt world "
     "takes --prompts as text"),
    (["--prompts", "a cat", "--gpt-ckpt", "c2i_B_256.pt", "--image-size", "256"],
     "--gpt-ckpt, --image-size describe a LlamaGen world, not a lumina-mgpt one"),
    ([], "a lumina-mgpt world draws each image for a prompt: give --prompts"),
    (["--prompts", "a cat", "--method", "lantern", "--delta", "0.1", "--k", "5"],
     "method lantern with chain drafting needs the authors' drafter folder: give --drafter"),
    (["--prompts", "a cat", "--method", "exact", "--drafting", "jacobi", "--window", "2", "--proactive", "2",
      "--proactive-depth", "3"], "proactive_depth = 3 exceeds window = 2"),
    (["--prompts", "a cat", "--method", "vanilla", "--pixels", "60"], "pixels = 60 must be a positive multiple of 16"),
    (["--prompts", "a cat", "--method", "gsd", "--drafting", "jacobi", "--k", "50", "--neighbours-k", "20"],
     "--neighbours-k 20: the method reads the 50 nearest codes of each code; give --neighbours-k >= 50"),
])
def test_chameleon_bad_combinations_are_one_line(argv, message, chameleon, capfd, monkeypatch):
    from lantern.worlds.chameleon import hf

    monkeypatch.setattr(hf, "load_target", lambda *a, **k: pytest.fail("weights read before the check"))
    assert cli.main(["generate", *family_flags(chameleon, "lumina-mgpt", drafter=False), *argv]) == 2
    err = capfd.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err


@pytest.mark.parametrize("argv,message", [
    (["--family", "parti"], "--family parti: not a Chameleon family; use one of anole, lumina-mgpt"),
    (["--family", "anole", "--target", "t"], "--family anole needs --vqgan-ckpt, --tokenizer"),
    (["--target", "t", "--pixels", "64"], "--target, --pixels describe a Chameleon world: also give --family"),
    (["--family", "anole", "--target", "no/such/folder", "--vqgan-ckpt", "no/vqgan.ckpt", "--tokenizer", "tok.json"],
     "anole target: folder no/such/folder does not exist; anole vqgan_ckpt: file no/vqgan.ckpt does not exist; "
     "anole vqgan_yaml: file no/vqgan.yaml does not exist; anole tokenizer: file or folder tok.json does not exist"),
])
def test_chameleon_flags_without_files_are_one_line(argv, message, tmp_path, capfd, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["generate", "--prompts", "a cat", "--no-baseline", "--method", "vanilla", "--device", "cpu",
                     *argv]) == 2
    err = capfd.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err
