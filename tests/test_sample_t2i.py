"""`lantern sample` for text-to-image targets: image i is decoded with the caption features of prompt row i."""
import csv
import json

import pandas as pd
import pytest

from fake_t5 import TINY_T5_DIM, write_tiny_t5
from lantern.engine.models.checkpoint import save_checkpoint
from lantern.engine.models.drafter import Drafter, save_drafter
from lantern.errors import UserError
from lantern.io import sha256_file
from lantern.worlds.llamagen.captions import main as encode_captions, read_captions_file
from lantern.pipeline.sample import main as sample
from tiny import one_thread, save_world, tiny_target  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("one_thread")
CAPTIONS = ["two dogs run in the park", "a red bus"]  # the second is left-padded: 6 of 16 tokens are real
T = 16  # caption positions: --max-length of the features and cls_token_num of the target
EXACT = '{"name": "exact", "drafting": "chain", "gamma": 3}'


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("t2i")
    with open(root / "prompts.csv", "w", newline="") as f:
        csv.writer(f).writerows([("id", "caption"), *[(f"coco{i}", c) for i, c in enumerate(CAPTIONS)]])
    encode_captions(["--prompts", str(root / "prompts.csv"), "--t5", str(write_tiny_t5(root / "t5")),
                     "--max-length", str(T), "--out", str(root / "captions.pt")])
    target = tiny_target("t2i", cls_token_num=T, caption_dim=TINY_T5_DIM)
    return save_world(root, target)


def run(world, out, *extra, method='{"name": "vanilla"}', start=0, end=2, target="target.pt", mode="sampling"):
    sample(["--target", str(world / target), "--vq", str(world / "vq.pt"), "--drafter", str(world / "drafter.pt"),
            "--method", method, "--sampling", '{"cfg_scale": 3.0}', "--mode", mode, "--seed", "7",
            "--start", str(start), "--end", str(end), "--out", str(out), "--device", "cpu", "--threads", "1", *extra])
    return pd.read_csv(out / "stats.csv", keep_default_na=False)


@pytest.mark.parametrize("method", ['{"name": "vanilla"}', EXACT])
def test_captions_condition_each_image_deterministically(world, tmp_path, method):
    captions = ["--captions", str(world / "captions.pt")]
    whole = run(world, tmp_path / "whole", *captions, "--target-spec", '{"model_type": "t2i"}', method=method)
    assert whole.caption.tolist() == CAPTIONS and whole.prompt_id.tolist() == ["coco0", "coco1"]
    assert "label" not in whole.columns
    assert whole.tokens[0] != whole.tokens[1]  # the caption, not only the seed, decides the image
    manifest = json.loads((tmp_path / "whole" / "manifest.json").read_text())
    assert manifest["captions"] == {"path": str(world / "captions.pt"), "sha256": sha256_file(world / "captions.pt")}
    assert manifest["target_spec"] == {"model_type": "t2i"}

    tail = run(world, tmp_path / "tail", *captions, method=method, start=1)
    assert tail.image_index.tolist() == [1] and tail.tokens[0] == whole.tokens[1]
    png = "images/000001.png"
    assert (tmp_path / "tail" / png).read_bytes() == (tmp_path / "whole" / png).read_bytes()


def test_greedy_exact_chain_equals_greedy_vanilla_under_captions(world, tmp_path):
    """Lossless greedy decoding: equal tokens show both decoders read the same features and left-padding mask."""
    assert read_captions_file(world / "captions.pt")["mask"].sum(1).tolist() == [T, 6]
    captions = ["--captions", str(world / "captions.pt")]
    vanilla = run(world, tmp_path / "v", *captions, mode="greedy")
    exact = run(world, tmp_path / "e", *captions, method=EXACT, mode="greedy")
    assert exact.tokens.tolist() == vanilla.tokens.tolist()
    assert exact.tau.min() >= 1.0


def test_greedy_relaxes_over_the_unfiltered_softmax(world, tmp_path):
    """As the authors' greedy path: filters never change an argmax, so greedy drops them (and the relaxed rules then
    see every neighbour's mass); the manifest records the parameters actually used."""
    out = tmp_path / "g"
    sample(["--target", str(world / "target.pt"), "--vq", str(world / "vq.pt"), "--captions", str(world / "captions.pt"),
            "--sampling", '{"cfg_scale": 3.0, "top_k": 2, "top_p": 0.5, "temperature": 0.5}', "--mode", "greedy",
            "--end", "1", "--out", str(out), "--device", "cpu", "--threads", "1"])
    used = json.loads((out / "manifest.json").read_text())["sampling"]
    assert used == {"cfg_scale": 3.0, "cfg_interval": -1, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "greedy": True}


def test_caption_problems_are_one_line_errors(world, tmp_path):
    captions = ["--captions", str(world / "captions.pt")]
    with pytest.raises(UserError, match="t2i.* --captions"):
        run(world, tmp_path / "a")
    with pytest.raises(UserError, match=r"covers prompt rows 0\.\.1, not image index 2 of \[1, 3\)"):
        run(world, tmp_path / "b", *captions, start=1, end=3)
    narrow = tiny_target("t2i", cls_token_num=T, caption_dim=12)
    save_checkpoint(tmp_path / "narrow.pt", narrow, args=narrow.args.to_dict())
    with pytest.raises(UserError, match=rf"features \[{T}, {TINY_T5_DIM}\] .* reads \[{T}, 12\]"):
        run(world, tmp_path / "c", *captions, target=tmp_path / "narrow.pt")
    c2i = tiny_target("c2i")
    save_checkpoint(tmp_path / "c2i.pt", c2i, args=c2i.args.to_dict())
    with pytest.raises(UserError, match="--captions .* class-conditional"):
        run(world, tmp_path / "d", *captions, target=tmp_path / "c2i.pt")
    with pytest.raises(UserError, match="t2i"):  # the spec reaches load_gpt
        run(world, tmp_path / "e", *captions, "--target-spec", '{"model_type": "c2i"}')
    assert not any((tmp_path / x).exists() for x in "abcde")


def test_class_conditional_targets_keep_labels(world, tmp_path):
    c2i = tiny_target("c2i")
    save_checkpoint(tmp_path / "c2i.pt", c2i, args=c2i.args.to_dict())
    save_drafter(tmp_path / "drafter.pt", Drafter.from_target(c2i))
    sample(["--target", str(tmp_path / "c2i.pt"), "--vq", str(world / "vq.pt"),
            "--drafter", str(tmp_path / "drafter.pt"), "--method", EXACT, "--start", "3", "--end", "5",
            "--out", str(tmp_path / "out"), "--device", "cpu", "--threads", "1", "--no-warmup"])
    stats = pd.read_csv(tmp_path / "out" / "stats.csv")
    assert stats.label.tolist() == [3, 0] and "caption" not in stats.columns  # cycle: i mod 4 classes
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["captions"] is None
    for bad in ("x", "4", "-1"):  # 4 classes: ids 0..3
        with pytest.raises(UserError, match=rf"--labels '{bad}' must be 'cycle' or a class id in 0\.\.3"):
            sample(["--target", str(tmp_path / "c2i.pt"), "--vq", str(world / "vq.pt"), "--labels", bad,
                    "--end", "1", "--out", str(tmp_path / "bad"), "--device", "cpu"])
    assert not (tmp_path / "bad").exists() and not (tmp_path / "bad.partial").exists()


def test_a_resumed_shard_holds_exactly_its_own_range(world, tmp_path, monkeypatch):
    """A job killed while drawing [0, 3) leaves 0 and 1 in out.partial; rerun as [1, 3) (the shard count changed),
    it keeps image 1, drops image 0, and the finished folder holds images 1 and 2 only."""
    import lantern.pipeline.sample as sample_module

    c2i = tiny_target("c2i")
    save_checkpoint(tmp_path / "c2i.pt", c2i, args=c2i.args.to_dict())
    real_save, saved = sample_module.save_png, []

    def save_then_die(array, path):
        if len(saved) == 2:
            raise KeyboardInterrupt  # killed mid-shard
        saved.append(path)
        return real_save(array, path)  # the digest its row records

    def draw(start, end):
        sample(["--target", str(tmp_path / "c2i.pt"), "--vq", str(world / "vq.pt"), "--start", str(start),
                "--end", str(end), "--out", str(tmp_path / "out"), "--device", "cpu", "--threads", "1", "--no-warmup"])

    with monkeypatch.context() as m:
        m.setattr(sample_module, "save_png", save_then_die)
        with pytest.raises(KeyboardInterrupt):
            draw(0, 3)
    assert sorted(p.name for p in (tmp_path / "out.partial" / "rows").iterdir()) == ["000000.json", "000001.json"]
    draw(1, 3)
    assert pd.read_csv(tmp_path / "out" / "stats.csv").image_index.tolist() == [1, 2]
    assert sorted(p.name for p in (tmp_path / "out" / "images").iterdir()) == ["000001.png", "000002.png"]
