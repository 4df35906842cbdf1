"""`lantern convert`: the LANTERN authors' HF-style LlamaGen target and EAGLE drafter, built here in their layouts
(random weights, tiny widths), must convert to models computing the same functions."""
import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from lantern.engine.models.checkpoint import extract_state_dict, load_weights, read_checkpoint, save_checkpoint
from lantern.engine.models.drafter import Drafter, load_drafter, target_states
from lantern.errors import UserError
from lantern.worlds.llamagen.convert import main
from lantern.engine.models.model import GPT
from tiny import one_thread, tiny_target  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("one_thread")


# -- the HF-converted target ------------------------------------------------------------------------------------------
def upstream_to_hf(sd: dict) -> dict:
    """The authors' renaming (lantern-authors-format.md), written out independently of the converter."""
    hf = {}
    for k, v in sd.items():
        if k.startswith("cls_embedding."):
            hf["model." + k] = v
        elif k == "tok_embeddings.weight":
            hf["model.embed_tokens.weight"] = v
        elif k == "output.weight":
            hf["lm_head.weight"] = v
        elif k == "norm.weight":
            hf["model.norm.weight"] = v
        else:
            _, i, *rest = k.split(".")
            name = ".".join(rest)
            p = f"model.layers.{i}."
            if name == "attention.wqkv.weight":
                d = v.shape[1]
                hf[p + "self_attn.q_proj.weight"], hf[p + "self_attn.k_proj.weight"], hf[p + "self_attn.v_proj.weight"] = (
                    v[:d].clone(), v[d : 2 * d].clone(), v[2 * d :].clone())
            else:
                hf[p + {"attention.wo.weight": "self_attn.o_proj.weight", "feed_forward.w1.weight": "mlp.gate_proj.weight",
                        "feed_forward.w3.weight": "mlp.up_proj.weight", "feed_forward.w2.weight": "mlp.down_proj.weight",
                        "attention_norm.weight": "input_layernorm.weight",
                        "ffn_norm.weight": "post_attention_layernorm.weight"}[name]] = v
    return hf


def hf_config(target) -> dict:
    a = target.args
    return {"architectures": ["LlamaForCausalLM"], "hidden_size": a.dim, "num_attention_heads": a.n_head,
            "num_hidden_layers": a.n_layer, "vocab_size": a.vocab_size, "block_size": a.image_tokens,
            "cls_token_num": a.cls_token_num, "caption_dim": a.caption_dim, "input_type": a.model_type,
            "num_classes": a.num_classes}


def write_hf_folder(folder, hf: dict, config: dict, shards: int = 1):
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    if shards == 1:
        save_file(hf, folder / "model.safetensors")
        return folder
    keys, weight_map = sorted(hf), {}
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = keys[s::shards]
        save_file({k: hf[k] for k in part}, folder / name)
        weight_map.update({k: name for k in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return folder


@pytest.mark.parametrize("kind, shards", [("t2i", 1), ("t2i", 2), ("c2i", 1)])
def test_hf_target_converts_to_the_same_logits(tmp_path, capsys, kind, shards):
    upstream = tiny_target(kind, seed=3)
    sd = {k: v.clone() for k, v in upstream.state_dict().items()}
    src = write_hf_folder(tmp_path / "hf", upstream_to_hf(sd), hf_config(upstream), shards)
    main(["--kind", "target", "--src", str(src), "--out", str(tmp_path / "gpt.pt")])
    spec = json.loads(capsys.readouterr().out.split("--target-spec ")[1].strip().strip("'"))
    assert spec["model_type"] == kind and spec["image_tokens"] == 16 and spec["cls_token_num"] == upstream.args.cls_token_num
    obj = read_checkpoint(tmp_path / "gpt.pt")
    assert set(obj) == {"model", "args"} and set(obj["model"]) == set(sd)
    assert obj["args"]["image_tokens"] == 16  # the grid travels with the weights, which do not show it
    model = load_weights(GPT(upstream.args), extract_state_dict(obj)).eval()
    T = upstream.args.cls_token_num
    cond = torch.tensor([1, 3]) if kind == "c2i" else torch.randn(2, T, 12)
    mask = None if kind == "c2i" else torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)
    tokens = torch.randint(0, 16, (2, 15))
    with torch.no_grad():
        got, want = model(cond, tokens, cond_mask=mask)[0], upstream(cond, tokens, cond_mask=mask)[0]
    assert torch.equal(got, want)


@pytest.mark.parametrize("edit, needle", [
    (lambda hf: hf.update({"model.layers.0.self_attn.q_proj.bias": torch.zeros(32)}), "no upstream LlamaGen counterpart"),
    (lambda hf: hf.pop("model.layers.1.self_attn.k_proj.weight"), "model.layers.1.self_attn.k_proj.weight"),
    (lambda hf: hf.pop("model.layers.1.mlp.up_proj.weight"), "missing layers.1.feed_forward.w3.weight"),
    (lambda hf: hf.pop("lm_head.weight"), "output.weight"),
    (lambda hf: hf.update({"model.layers.1.mlp.gate_proj.weight": torch.zeros(64, 32)}), "wrong shape"),
])
def test_hf_target_refusals(tmp_path, edit, needle):
    upstream = tiny_target("t2i")
    hf = upstream_to_hf({k: v.clone() for k, v in upstream.state_dict().items()})
    edit(hf)
    src = write_hf_folder(tmp_path / "hf", hf, hf_config(upstream))
    with pytest.raises(UserError, match=needle) as e:
        main(["--kind", "target", "--src", str(src), "--out", str(tmp_path / "gpt.pt")])
    assert "\n" not in str(e.value)
    assert not (tmp_path / "gpt.pt").exists()


# -- the authors' EAGLE drafter ---------------------------------------------------------------------------------------
def authors_drafter(target, seed=0) -> dict:
    """Their key list (lantern-authors-format.md) at the target's width, random fp16 weights."""
    g = torch.Generator().manual_seed(seed)
    d, ffn, V = target.args.dim, target.args.ffn_dim, target.args.vocab_size
    shapes = {"embed_tokens.weight": (V, d), "fc.weight": (d, 2 * d), "fc.bias": (d,),
              **{f"layers.0.self_attn.{p}_proj.weight": (d, d) for p in "qkvo"},
              "layers.0.mlp.gate_proj.weight": (ffn, d), "layers.0.mlp.up_proj.weight": (ffn, d),
              "layers.0.mlp.down_proj.weight": (d, ffn)}
    w = {k: (torch.randn(s, generator=g) * 0.3).half() for k, s in shapes.items()}
    w["layers.0.post_attention_layernorm.weight"] = (1 + 0.2 * torch.randn(d, generator=g)).half()
    return w


def write_drafter_folder(folder, weights: dict, target):
    folder.mkdir()
    a = target.args
    (folder / "config.json").write_text(json.dumps({
        "hidden_size": a.dim, "intermediate_size": a.ffn_dim, "num_attention_heads": a.n_head, "num_hidden_layers": 1,
        "vocab_size": a.vocab_size, "rms_norm_eps": 1e-6, "caption_dim": a.caption_dim, "torch_dtype": "float16"}))
    torch.save(weights, folder / "pytorch_model.bin")
    return folder


def rope_rows(n_zero: int, grid: int, head_dim: int) -> torch.Tensor:
    """[n_zero + grid^2, head_dim / 2, 2] (cos, sin): zero rows, then cell (r, c) -> angles cat(r f, c f)."""
    f = 1.0 / 10000 ** (torch.arange(head_dim // 4).float() * 2 / (head_dim // 2))
    rows = []
    for j in range(grid * grid):
        ang = torch.cat([(j // grid) * f, (j % grid) * f])
        rows.append(torch.stack([ang.cos(), ang.sin()], -1))
    return torch.cat([torch.zeros(n_zero, head_dim // 2, 2), torch.stack(rows)])


def reference_logits(w: dict, target, h: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Their drafter by the facts: position p reads (embed(id[p + 1]), h[p]) with ids zero-padded over the
    condition; x = fc(cat(emb, h)); attention on raw x with RoPE row p of a table with T - 1 zero rows, causal, no
    padding mask; post-attention RMSNorm (eps 1e-6) + SwiGLU; no final norm; the target's lm_head."""
    w = {k: v.float() for k, v in w.items()}
    a = target.args
    B, T, H, hd = h.shape[0], a.cls_token_num, a.n_head, a.head_dim
    ids = torch.cat([torch.zeros(B, T - 1, dtype=torch.long), tokens], 1)
    S = ids.shape[1]
    x = F.linear(torch.cat([w["embed_tokens.weight"][ids], h[:, :S]], -1), w["fc.weight"], w["fc.bias"])
    rope = rope_rows(T - 1, a.grid, hd)[:S]

    def rotate(t):
        t = t.view(B, S, H, hd // 2, 2)
        c, s = rope[None, :, None, :, 0], rope[None, :, None, :, 1]
        return torch.stack([t[..., 0] * c - t[..., 1] * s, t[..., 1] * c + t[..., 0] * s], -1).view(B, S, H, hd)

    q = rotate(x @ w["layers.0.self_attn.q_proj.weight"].T).transpose(1, 2)
    k = rotate(x @ w["layers.0.self_attn.k_proj.weight"].T).transpose(1, 2)
    v = (x @ w["layers.0.self_attn.v_proj.weight"].T).view(B, S, H, hd).transpose(1, 2)
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
    scores = scores.masked_fill(~torch.ones(S, S, dtype=torch.bool).tril(), float("-inf"))
    attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, S, -1)
    h1 = x + attn @ w["layers.0.self_attn.o_proj.weight"].T
    n = h1 * torch.rsqrt(h1.pow(2).mean(-1, keepdim=True) + 1e-6) * w["layers.0.post_attention_layernorm.weight"]
    out = h1 + (F.silu(n @ w["layers.0.mlp.gate_proj.weight"].T) * (n @ w["layers.0.mlp.up_proj.weight"].T)) \
        @ w["layers.0.mlp.down_proj.weight"].T
    return out @ target.output.weight.T


@pytest.fixture
def converted(tmp_path):
    target = tiny_target("t2i", seed=1)
    save_checkpoint(tmp_path / "gpt.pt", target, args=target.args.to_dict())
    weights = authors_drafter(target)
    src = write_drafter_folder(tmp_path / "eagle", weights, target)
    main(["--kind", "drafter", "--src", str(src), "--out", str(tmp_path / "d.pt"), "--target", str(tmp_path / "gpt.pt")])
    return target, weights, load_drafter(tmp_path / "d.pt", target)


@torch.no_grad()
def test_converted_drafter_computes_the_authors_function(converted):
    target, weights, drafter = converted
    T = target.args.cls_token_num
    cond = torch.randn(2, T, 12)
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)  # padding the authors' drafter sees
    tokens = torch.randint(0, 16, (2, 15))
    x, h, _ = target_states(target, cond, tokens, mask)
    want = reference_logits(weights, target, h, tokens)

    emb = drafter.inputs(x[:, :T], tokens)
    S = emb.shape[1]
    got = drafter.head(drafter(emb, h[:, :-1], drafter.padding_mask(mask, S)))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)

    drafter.setup_cache(2, cond_mask=mask)  # the cached path speculative decoding uses
    parts, s = [], 0
    for n in (T, 3, 1, 5, S - T - 9):
        parts.append(drafter.head(drafter.step(emb[:, s : s + n], h[:, s : s + n], s)))
        s += n
    drafter.clear_cache()
    torch.testing.assert_close(torch.cat(parts, 1), want, atol=1e-4, rtol=1e-4)


def test_converted_drafter_keeps_its_own_embedding(converted, tmp_path):
    target, weights, drafter = converted
    theirs = weights["embed_tokens.weight"].float()
    assert torch.equal(drafter.tok_embeddings.weight, theirs)
    assert not torch.equal(drafter.tok_embeddings.weight, target.tok_embeddings.weight)
    assert torch.equal(drafter.output.weight, target.output.weight)
    assert drafter.layer.ffn_norm.eps == 1e-6 and drafter.options.cond_inputs == "code0"
    ours = Drafter.from_target(target)  # our own drafters still tie to the target and mask padding
    assert torch.equal(ours.tok_embeddings.weight, target.tok_embeddings.weight) and ours.options.mask_padding
    assert "tok_embeddings.weight" in torch.load(tmp_path / "d.pt", weights_only=True)["drafter"]


@pytest.mark.parametrize("edit, needle", [
    (lambda w: w.update({"layers.0.input_layernorm.weight": torch.ones(32).half()}), "unmapped layers.0.input_layernorm"),
    (lambda w: w.update({"layers.1.fc.weight": torch.ones(32).half()}), "unmapped layers.1.fc.weight"),
    (lambda w: w.pop("fc.bias"), "missing fc.bias"),
    (lambda w: w.pop("embed_tokens.weight"), "missing embed_tokens.weight"),
    (lambda w: w.update({"layers.0.mlp.gate_proj.weight": torch.ones(80, 32).half()}), "layers.0.mlp.gate_proj.weight"),
    (lambda w: w.update({"layers.0.self_attn.k_proj.weight": torch.ones(32, 16).half()}), "k_proj.weight"),
    (lambda w: w.update({"embed_tokens.weight": torch.ones(20, 32).half()}), "vocab 16"),
])
def test_drafter_refusals(tmp_path, edit, needle):
    target = tiny_target("t2i")
    save_checkpoint(tmp_path / "gpt.pt", target, args=target.args.to_dict())
    weights = authors_drafter(target)
    edit(weights)
    src = write_drafter_folder(tmp_path / "eagle", weights, target)
    with pytest.raises(UserError, match=needle) as e:
        main(["--kind", "drafter", "--src", str(src), "--out", str(tmp_path / "d.pt"), "--target", str(tmp_path / "gpt.pt")])
    assert "\n" not in str(e.value)
    assert not (tmp_path / "d.pt").exists()


def test_cli_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        main(["--kind", "target", "--src", str(tmp_path / "nope"), "--out", str(tmp_path / "o.pt")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="model.safetensors"):
        main(["--kind", "target", "--src", str(tmp_path / "empty"), "--out", str(tmp_path / "o.pt")])
    with pytest.raises(UserError, match="needs --target"):
        main(["--kind", "drafter", "--src", str(tmp_path / "empty"), "--out", str(tmp_path / "o.pt")])
