"""`lantern convert` reads what the authors' config.json states (issue #29, item 5): input_type / block_size (the
token grid: stage I 16 x 16, stage II 32 x 32), rms_norm_eps and the RoPE base. A drafter whose grid, condition kind
or RoPE base disagrees with its target, or a target spec that contradicts config.json's grid, is one line; a
target's eps and RoPE base are carried into the converted file, never replaced by upstream's."""
import json

import pytest
import torch

from lantern.engine.models.checkpoint import read_checkpoint, save_checkpoint
from lantern.worlds.llamagen.upstream import load_gpt
from lantern.engine.models.drafter import load_drafter
from lantern.errors import UserError
from lantern.worlds.llamagen.convert import main
from test_convert import authors_drafter, hf_config, upstream_to_hf, write_hf_folder
from tiny import one_thread, tiny_target  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("one_thread")


def drafter_folder(folder, target, **config):
    folder.mkdir()
    a = target.args
    (folder / "config.json").write_text(json.dumps({
        "hidden_size": a.dim, "intermediate_size": a.ffn_dim, "num_attention_heads": a.n_head, "num_hidden_layers": 1,
        "vocab_size": a.vocab_size, "rms_norm_eps": 1e-6, "torch_dtype": "float16", **config}))
    torch.save(authors_drafter(target), folder / "pytorch_model.bin")
    return folder


def convert_drafter(tmp_path, target, **config):
    save_checkpoint(tmp_path / "gpt.pt", target, args=target.args.to_dict())
    src = drafter_folder(tmp_path / "eagle", target, **config)
    main(["--kind", "drafter", "--src", str(src), "--out", str(tmp_path / "d.pt"), "--target", str(tmp_path / "gpt.pt")])
    return tmp_path / "d.pt"


STAGE_I = dict(image_tokens=256)  # a tiny-width stage-I t2i target: 16 x 16 tokens


def test_stage_i_drafter_converts_for_a_stage_i_target(tmp_path):
    target = tiny_target("t2i", **STAGE_I)
    out = convert_drafter(tmp_path, target, input_type="t2i")
    assert load_drafter(out, target).args.image_tokens == 256


@pytest.mark.parametrize("target_kw, config, message", [
    (STAGE_I, {"input_type": "t2i2"},
     "--src drafter config.json input_type = t2i2 (stage II, 32 x 32 RoPE grid), but --target has 256 image tokens "
     "(stage I, 16 x 16); use the drafter released for the target's stage (llamagen_drafter: t2i, stage I; "
     "llamagen2_drafter: t2i2, stage II)"),
    ({"image_tokens": 1024}, {"input_type": "t2i"},
     "--src drafter config.json input_type = t2i (stage I, 16 x 16 RoPE grid), but --target has 1024 image tokens "
     "(stage II, 32 x 32); use the drafter released for the target's stage (llamagen_drafter: t2i, stage I; "
     "llamagen2_drafter: t2i2, stage II)"),
    (STAGE_I, {"input_type": "c2i"},
     "--src drafter config.json input_type = c2i, but --target is a t2i model; use the drafter released for this target"),
    (STAGE_I, {"input_type": "t2v"},
     "--src drafter config.json input_type = 't2v' is none of c2i, t2i, t2i2; is it the authors' LlamaGen drafter?"),
    ({}, {"block_size": 256},
     "--src drafter config.json block_size = 256 (stage I, 16 x 16 RoPE grid), but --target has 16 image tokens "
     "(16 tokens); use the drafter released for the target's stage (llamagen_drafter: t2i, stage I; "
     "llamagen2_drafter: t2i2, stage II)"),
    ({}, {"rope_theta": 500000.0},
     "--src drafter config.json rope base 500000 differs from the target's 10000; the drafter must rotate as its "
     "target does"),
])
def test_drafter_config_mismatch_is_one_line(tmp_path, target_kw, config, message):
    target = tiny_target("t2i", **target_kw)
    with pytest.raises(UserError) as e:
        convert_drafter(tmp_path, target, **config)
    assert str(e.value) == message
    assert not (tmp_path / "d.pt").exists()


def hf_target(tmp_path, upstream, **config):
    hf = upstream_to_hf({k: v.clone() for k, v in upstream.state_dict().items()})
    return write_hf_folder(tmp_path / "hf", hf, {**hf_config(upstream), **config})


def test_target_eps_and_rope_base_travel_into_the_converted_file(tmp_path, capsys):
    """An HF target computing with eps 1e-6 and RoPE base 5000 converts to a file that computes the same."""
    upstream = tiny_target("t2i", seed=3, norm_eps=1e-6, rope_base=5000.0)
    src = hf_target(tmp_path, upstream, rms_norm_eps=1e-6, rope_base=5000.0)
    main(["--kind", "target", "--src", str(src), "--out", str(tmp_path / "gpt.pt")])
    assert "carries norm_eps 1e-06, rope_base 5000 from config.json" in capsys.readouterr().out
    model = load_gpt(tmp_path / "gpt.pt", {"model_type": "t2i", "image_tokens": 16})
    assert (model.args.norm_eps, model.args.rope_base) == (1e-6, 5000.0)
    cond, tokens = torch.randn(1, 5, 12), torch.randint(0, 16, (1, 15))
    with torch.no_grad():
        assert torch.equal(model(cond, tokens)[0], upstream(cond, tokens)[0])
    # upstream values: upstream's container (its loaders read "model"), beside the args every converted file
    # records (its token grid, so that a spec of another grid is refused), here with upstream's eps and RoPE base
    (tmp_path / "b").mkdir()
    src = hf_target(tmp_path / "b", tiny_target("t2i"), rms_norm_eps=1e-5, rope_theta=10000.0)
    main(["--kind", "target", "--src", str(src), "--out", str(tmp_path / "b.pt")])
    obj = read_checkpoint(tmp_path / "b.pt")
    assert set(obj) == {"model", "args"}
    assert (obj["args"]["norm_eps"], obj["args"]["rope_base"]) == (1e-5, 10000.0)


@pytest.mark.parametrize("config, spec, message", [
    ({"block_size": 1024}, {"image_tokens": 256},
     "--src target config.json states 1024 image tokens (stage II, 32 x 32) but --target-spec image_tokens = 256 "
     "(stage I, 16 x 16); set the image size the target was trained for"),
    ({"input_type": "t2i2", "block_size": 256}, None,
     "--src target config.json says input_type t2i2 (stage II, 32 x 32) but block_size 256; fix config.json to the "
     "stage the weights were trained for"),
])
def test_target_grid_contradictions_are_one_line(tmp_path, config, spec, message):
    src = hf_target(tmp_path, tiny_target("t2i", image_tokens=1024 if config.get("block_size") == 1024 else 256),
                    **config)
    args = ["--target-spec", json.dumps(spec)] if spec else []
    with pytest.raises(UserError) as e:
        main(["--kind", "target", "--src", str(src), "--out", str(tmp_path / "gpt.pt"), *args])
    assert str(e.value) == message
    assert not (tmp_path / "gpt.pt").exists()


def test_stage_ii_target_reads_its_grid_from_input_type(tmp_path, capsys):
    upstream = tiny_target("t2i", image_tokens=1024)
    config = {k: v for k, v in hf_config(upstream).items() if k != "block_size"}
    src = write_hf_folder(tmp_path / "hf", upstream_to_hf(dict(upstream.state_dict())), {**config, "input_type": "t2i2"})
    main(["--kind", "target", "--src", str(src), "--out", str(tmp_path / "gpt.pt")])
    spec = json.loads(capsys.readouterr().out.split("--target-spec ")[1].strip().strip("'"))
    assert spec["model_type"] == "t2i" and spec["image_tokens"] == 1024
