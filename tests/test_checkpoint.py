import pytest
import torch

from lantern.engine.models.checkpoint import (
    Found, extract_state_dict, load_weights, parse_spec, read_checkpoint, resolve_spec, save_checkpoint,
)
from lantern.worlds.llamagen.upstream import load_gpt
from lantern.errors import UserError
from lantern.engine.decoding.generate import generate
from lantern.engine.decoding.sampling import SamplingParams, image_generator
from lantern.engine.models.model import GPT, ModelArgs, named_args


def meta_gpt(args):
    with torch.device("meta"):
        return GPT(args)


def upstream_gpt_keys(n_layer, dim, ffn, vocab, cond):
    keys = {"tok_embeddings.weight": (vocab, dim), "norm.weight": (dim,), "output.weight": (vocab, dim)}
    keys.update(cond)
    for i in range(n_layer):
        keys.update({
            f"layers.{i}.attention.wqkv.weight": (3 * dim, dim),
            f"layers.{i}.attention.wo.weight": (dim, dim),
            f"layers.{i}.feed_forward.w1.weight": (ffn, dim),
            f"layers.{i}.feed_forward.w3.weight": (ffn, dim),
            f"layers.{i}.feed_forward.w2.weight": (dim, ffn),
            f"layers.{i}.attention_norm.weight": (dim,),
            f"layers.{i}.ffn_norm.weight": (dim,),
        })
    return keys


def shapes(model):
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def test_gpt_b_c2i_state_dict_equals_upstream():
    model = meta_gpt(named_args("GPT-B"))
    expected = upstream_gpt_keys(12, 768, 2048, 16384, {"cls_embedding.embedding_table.weight": (1001, 768)})
    assert shapes(model) == expected


def test_gpt_xl_t2i_state_dict_equals_upstream():
    model = meta_gpt(named_args("GPT-XL", model_type="t2i", cls_token_num=120))
    cond = {
        "cls_embedding.cap_proj.fc1.weight": (1280, 2048),
        "cls_embedding.cap_proj.fc2.weight": (1280, 1280),
        "cls_embedding.uncond_embedding": (120, 2048),
    }
    assert shapes(model) == upstream_gpt_keys(36, 1280, 3584, 16384, cond)


def test_ffn_sizes_of_named_models():
    assert [named_args(s).ffn_dim for s in ("GPT-L", "GPT-XXL", "GPT-3B")] == [2816, 4096, 8704]
    assert named_args("GPT-3B").head_dim == 100


SMALL = ModelArgs(dim=32, n_layer=1, n_head=2, vocab_size=11, num_classes=3, image_tokens=4, multiple_of=16)


@pytest.mark.parametrize("container", ["model", "module", "state_dict", "raw"])
def test_save_load_round_trip_every_container(tmp_path, container):
    torch.manual_seed(0)
    model = GPT(SMALL).eval()
    path = tmp_path / "ckpt.pt"
    extra = {} if container == "raw" else {"args": SMALL.to_dict()}
    save_checkpoint(path, model, container=container, **extra)
    loaded = load_gpt(path, SMALL if container == "raw" else None)
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    cond, toks = torch.tensor([1]), torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(loaded(cond, toks)[0], model(cond, toks)[0])


def test_stray_freqs_cis_key_is_ignored(tmp_path):
    model = GPT(SMALL)
    sd = dict(model.state_dict(), freqs_cis=torch.zeros(3))
    torch.save({"model": sd}, tmp_path / "c.pt")
    load_gpt(tmp_path / "c.pt", spec=SMALL)


def test_truncated_checkpoint_is_a_clear_error(tmp_path):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, GPT(SMALL), args=SMALL.to_dict())
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match="unreadable"):
        load_gpt(path)


def test_foreign_checkpoint_lists_keys(tmp_path):
    torch.save({"model": {"encoder.conv_in.weight": torch.zeros(1)}}, tmp_path / "vq.pt")
    with pytest.raises(UserError, match=r"missing \d+ keys: .*unexpected 1 keys: encoder.conv_in.weight"):
        load_gpt(tmp_path / "vq.pt", spec=SMALL)
    with pytest.raises(UserError, match="does not exist"):
        read_checkpoint(tmp_path / "nope.pt")
    with pytest.raises(UserError, match="no state dict"):
        extract_state_dict({"optimizer": 1, "steps": 3})


def test_wrong_shape_is_named(tmp_path):
    bigger = ModelArgs(**{**SMALL.to_dict(), "vocab_size": 12})
    with pytest.raises(UserError, match="wrong shape.*tok_embeddings"):
        load_weights(GPT(SMALL), GPT(bigger).state_dict())


# -- upstream files (weights only) loaded from a target spec ------------------------------------------------------
TINY = {"dim": 32, "n_layer": 2, "n_head": 4}
TINY_FFN = 256  # upstream rounding: int(8 * 32 / 3) = 85 -> a multiple of 256
KINDS = {
    "c2i": {"cls_embedding.embedding_table.weight": (6, 32)},  # 5 classes + the CFG null row
    "c2i_no_null": {"cls_embedding.embedding_table.weight": (5, 32)},  # trained without class dropout
    "t2i": {"cls_embedding.cap_proj.fc1.weight": (32, 24), "cls_embedding.cap_proj.fc2.weight": (32, 32),
            "cls_embedding.uncond_embedding": (120, 24)},
}
MATCHING = {
    "c2i": {"model_type": "c2i", "gpt_size": TINY, "num_classes": 5, "image_tokens": 16},
    "c2i_no_null": {"model_type": "c2i", "gpt_size": TINY, "num_classes": 5, "image_tokens": 16},
    "t2i": {"model_type": "t2i", "gpt_size": TINY, "cls_token_num": 120, "image_tokens": 16},
}


def upstream_file(tmp_path, kind, container="model"):
    """A tiny GPT written by hand in the upstream layout: random tensors, no config inside."""
    gen = torch.Generator().manual_seed(0)
    shapes_ = upstream_gpt_keys(2, 32, TINY_FFN, 16, KINDS[kind])
    sd = {k: torch.randn(s, generator=gen) * 0.05 for k, s in shapes_.items()}
    path = tmp_path / f"{kind}_{container}.pt"
    torch.save(sd if container == "raw" else {"model": sd}, path)
    return path, sd


@pytest.mark.parametrize("container", ["model", "raw"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_upstream_file_loads_with_a_matching_spec(tmp_path, kind, container):
    path, sd = upstream_file(tmp_path, kind, container)
    model = load_gpt(path, MATCHING[kind])
    a = model.args
    assert (a.dim, a.n_layer, a.n_head, a.vocab_size, a.multiple_of, a.image_tokens) == (32, 2, 4, 16, 256, 16)
    if kind == "t2i":
        assert (a.model_type, a.cls_token_num, a.caption_dim, a.null_class) == ("t2i", 120, 24, True)
        cond = torch.randn(1, 120, 24)
    else:
        assert (a.model_type, a.num_classes, a.cls_token_num) == ("c2i", 5, 1)
        assert a.null_class == (kind == "c2i") and a.class_dropout_prob == (0.1 if kind == "c2i" else 0.0)
        cond = torch.tensor([4])
    for k, v in sd.items():
        assert torch.equal(model.state_dict()[k], v), k
    logits, _ = model(cond, torch.tensor([[1, 2, 3]]))
    assert logits.shape == (1, 4, 16) and torch.isfinite(logits).all()


def test_spec_keys_left_out_take_the_file_and_upstream_defaults(tmp_path):
    path, _ = upstream_file(tmp_path, "t2i")
    a = load_gpt(path, {"gpt_size": TINY}).args  # model_type from the tensors, 120 caption tokens, 256 image tokens
    assert (a.model_type, a.cls_token_num, a.image_tokens) == ("t2i", 120, 256)
    path, _ = upstream_file(tmp_path, "c2i")
    a = load_gpt(path, {"gpt_size": TINY, "num_classes": 6}).args  # 6 rows = 6 classes, no null row
    assert (a.num_classes, a.null_class) == (6, False)


MISMATCHES = [
    ("c2i", {"gpt_size": {"dim": 32, "n_layer": 3, "n_head": 4}},
     r"has 2 layers of width 32 \(no named LlamaGen size\), "
     r"but llamagen.gpt_size = \{dim: 32, n_layer: 3, n_head: 4\}; "
     r"set llamagen.gpt_size: \{dim: 32, n_layer: 2, n_head: <heads>\}$"),
    ("c2i", {"gpt_size": "GPT-B"}, r"has 2 layers of width 32 .*but llamagen.gpt_size = GPT-B; set llamagen.gpt_size"),
    ("c2i", {"model_type": "t2i"}, r"is a c2i model .*but llamagen.model_type = t2i; set llamagen.model_type: c2i$"),
    ("t2i", {"model_type": "c2i"}, r"is a t2i model .*but llamagen.model_type = c2i; set llamagen.model_type: t2i$"),
    ("c2i", {"num_classes": 7},
     r"class table of 6 rows, but llamagen.num_classes = 7; set llamagen.num_classes: 5 \(if its last row is the "
     r"CFG null class\) or 6 \(if not\)$"),
    ("c2i", {"num_classes": None},  # None counts as left out
     r"class table of 6 rows, but llamagen.num_classes = 1000 \(the default\); set llamagen.num_classes: 5"),
    ("t2i", {"cls_token_num": 77},
     r"has 120 caption positions \(uncond_embedding rows\), but llamagen.cls_token_num = 77; "
     r"set llamagen.cls_token_num: 120$"),
    ("c2i", {"cls_token_num": 120}, r"^llamagen.cls_token_num = 120, but a c2i model has one condition token"),
    ("c2i", {"image_tokens": 20}, r"^llamagen.image_tokens = 20 is not a square token grid"),
    ("c2i", {"gpt_size": "GPT-Q"}, r"^llamagen.gpt_size = 'GPT-Q' is not a LlamaGen size"),
    ("c2i", {"gpt_size": {"dim": 32, "n_layer": 2, "n_head": 3}}, r"^llamagen.gpt_size: dim 32 does not split"),
    ("c2i", {"model_type": "i2i"}, r"^llamagen.model_type = 'i2i' is not a model type"),
    ("c2i", {"num_classes": 0}, r"^llamagen.num_classes = 0 must be a positive integer"),
    ("c2i", {"gpt_ckpt": "x.pt"}, r"^target spec has unknown keys gpt_ckpt"),
]


@pytest.mark.parametrize("kind,change,message", MISMATCHES)
def test_every_spec_mismatch_is_one_line_naming_the_key(tmp_path, kind, change, message):
    path, _ = upstream_file(tmp_path, kind)
    spec = {"gpt_size": TINY, "num_classes": 5, **change}
    with pytest.raises(UserError, match=message) as err:
        load_gpt(path, spec)
    assert "\n" not in str(err.value)


def test_t2i_caption_length_defaults_to_upstreams_120(tmp_path):
    gen = torch.Generator().manual_seed(0)
    cond = dict(KINDS["t2i"], **{"cls_embedding.uncond_embedding": (8, 24)})
    sd = {k: torch.randn(s, generator=gen) for k, s in upstream_gpt_keys(2, 32, TINY_FFN, 16, cond).items()}
    torch.save({"model": sd}, tmp_path / "t.pt")
    default = r"llamagen.cls_token_num = 120 \(the default\); set llamagen.cls_token_num: 8$"
    with pytest.raises(UserError, match=default):
        load_gpt(tmp_path / "t.pt", {"gpt_size": TINY})
    assert load_gpt(tmp_path / "t.pt", {"gpt_size": TINY, "cls_token_num": 8}).args.cls_token_num == 8


def test_image_tokens_only_set_the_rope_grid(tmp_path):
    """No weight shows the image size: any square token count loads the same weights on a different RoPE grid."""
    path, _ = upstream_file(tmp_path, "c2i")
    small, large = (load_gpt(path, dict(MATCHING["c2i"], image_tokens=n)) for n in (16, 64))
    assert small.rope.shape[0] == 1 + 16 and large.rope.shape[0] == 1 + 64
    assert small.args.grid == 4 and large.args.grid == 8
    for k, v in small.state_dict().items():
        assert torch.equal(large.state_dict()[k], v)


def test_head_count_comes_from_a_named_size_or_the_spec(tmp_path):
    def found(dim, n_layer, **kw):
        return Found(model_type="c2i", dim=dim, n_layer=n_layer, cond_rows=1001, vocab_size=16384, caption_dim=None,
                     multiple_of=256, **kw)

    assert resolve_spec({}, found(1024, 24), "c.pt")["n_head"] == 16  # GPT-L
    assert resolve_spec({}, found(3200, 24), "c.pt")["n_head"] == 32  # GPT-3B: same depth, other width
    with pytest.raises(UserError, match=r"^checkpoint c.pt has 24 layers of width 1024 \(GPT-L\), but "
                                        r"llamagen.gpt_size = GPT-B; set llamagen.gpt_size: GPT-L$"):
        resolve_spec(parse_spec({"gpt_size": "GPT-B"}), found(1024, 24), "c.pt")
    path, _ = upstream_file(tmp_path, "c2i")
    with pytest.raises(UserError, match=r"head count is not in the weights; "
                                        r"set llamagen.gpt_size: \{dim: 32, n_layer: 2, n_head: <heads>\}$"):
        load_gpt(path, {"num_classes": 5})


def test_our_checkpoint_is_checked_against_a_spec(tmp_path):
    path = tmp_path / "ours.pt"
    save_checkpoint(path, GPT(SMALL), args=SMALL.to_dict())
    assert load_gpt(path).args == SMALL
    same = {"model_type": "c2i", "gpt_size": {"dim": 32, "n_layer": 1, "n_head": 2}, "num_classes": 3,
            "image_tokens": 4}
    assert load_gpt(path, same).args == SMALL
    wrong = [({"gpt_size": "GPT-B"}, r"set llamagen.gpt_size: \{dim: 32, n_layer: 1, n_head: 2\}$"),
             ({"gpt_size": {"dim": 32, "n_layer": 1, "n_head": 4}}, r"2 heads .*llamagen.gpt_size"),
             ({"num_classes": 1000}, r"has 3 classes, but llamagen.num_classes = 1000; set llamagen.num_classes: 3$"),
             ({"image_tokens": 256}, r"trained for 4 image tokens, but llamagen.image_tokens = 256"),
             ({"model_type": "t2i"}, r"llamagen.model_type: c2i$")]
    for change, message in wrong:
        with pytest.raises(UserError, match=message):
            load_gpt(path, dict(same, **change))


def test_a_model_without_null_row_refuses_cfg_and_condition_dropout(tmp_path):
    path, _ = upstream_file(tmp_path, "c2i_no_null")
    model = load_gpt(path, MATCHING["c2i_no_null"])
    cond = torch.tensor([0, 4])
    with pytest.raises(UserError, match=r"no null class row .*; set sampling.cfg_scale: 1$"):
        generate(model, cond, SamplingParams(cfg_scale=1.5), [image_generator(0, i) for i in range(2)])
    tokens, _ = generate(model, cond, SamplingParams(cfg_scale=1.0), [image_generator(0, i) for i in range(2)])
    assert tokens.shape == (2, 16)
    with pytest.raises(UserError, match=r"needs a null class row.*class_dropout_prob: 0$"):
        model.drop_cond(cond, 0.1)
    assert torch.equal(model.drop_cond(cond, model.args.class_dropout_prob), cond)
