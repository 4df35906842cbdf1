import pytest
import torch

from lantern.checkpoint import load_gpt, load_weights, read_checkpoint, extract_state_dict, save_checkpoint
from lantern.errors import UserError
from lantern.model import GPT, ModelArgs, named_args


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
    loaded = load_gpt(path, args=SMALL if container == "raw" else None)
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    cond, toks = torch.tensor([1]), torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(loaded(cond, toks)[0], model(cond, toks)[0])


def test_stray_freqs_cis_key_is_ignored(tmp_path):
    model = GPT(SMALL)
    sd = dict(model.state_dict(), freqs_cis=torch.zeros(3))
    torch.save({"model": sd}, tmp_path / "c.pt")
    load_gpt(tmp_path / "c.pt", args=SMALL)


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
        load_gpt(tmp_path / "vq.pt", args=SMALL)
    with pytest.raises(UserError, match="does not exist"):
        read_checkpoint(tmp_path / "nope.pt")
    with pytest.raises(UserError, match="no state dict"):
        extract_state_dict({"optimizer": 1, "steps": 3})


def test_wrong_shape_is_named(tmp_path):
    bigger = ModelArgs(**{**SMALL.to_dict(), "vocab_size": 12})
    with pytest.raises(UserError, match="wrong shape.*tok_embeddings"):
        load_weights(GPT(SMALL), GPT(bigger).state_dict())
