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
