"""The one place Chameleon HF state dicts become models: transformers' Chameleon names (the released target folders,
the LANTERN authors' drafter files) checked key by key and shape by shape against ChameleonArgs, un-permuted from
HF's rotate-half RoPE layout to apply_rope's interleaved pairs, fused (q, k, v) and built. The readers of the
folders are in worlds/chameleon/hf.py; every failure is one line naming the file and the key.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn
from torch import Tensor

from lantern.engine.models.chameleon import Chameleon, ChameleonArgs, ChameleonDrafter
from lantern.engine.models.checkpoint import no_init
from lantern.errors import UserError


def args_from_hf_config(cfg: dict, path, **layout) -> ChameleonArgs:
    """ChameleonArgs from a transformers Chameleon config.json (`layout`: the ChameleonArgs fields the world sets);
    anything this engine does not implement is one line naming the config key."""
    def need(key, default=None):
        value = cfg.get(key, default)
        if value is None:
            raise UserError(f"{path}: config.json has no {key}; is this a Chameleon checkpoint folder?")
        return value

    heads = need("num_attention_heads")
    if cfg.get("num_key_value_heads", heads) != heads:
        raise UserError(f"{path}: config.json num_key_value_heads {cfg['num_key_value_heads']} != "
                        f"num_attention_heads {heads}; grouped-query Chameleon models are not supported")
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key):
            raise UserError(f"{path}: config.json sets {key}: true; Chameleon 7B has no biases and none are supported")
    if cfg.get("hidden_act", "silu") != "silu":
        raise UserError(f"{path}: config.json hidden_act {cfg['hidden_act']!r}; only silu (SwiGLU) is supported")
    rope = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
    if scaling:
        raise UserError(f"{path}: config.json asks for RoPE scaling {scaling}; only plain RoPE is supported")
    theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
    args = ChameleonArgs(dim=need("hidden_size"), n_layer=need("num_hidden_layers"), n_head=heads,
                         ffn_dim=need("intermediate_size"), text_vocab=need("vocab_size"),
                         norm_eps=float(cfg.get("rms_norm_eps", 1e-5)), rope_base=float(theta),
                         swin_norm=bool(cfg.get("swin_norm", False)), **layout)
    limit = cfg.get("max_position_embeddings")
    if limit is not None and args.max_seq_len > limit:
        raise UserError(f"{path}: {args.cls_token_num} prompt slots + {args.image_tokens} image tokens exceed "
                        f"config.json max_position_embeddings {limit}; shorten the prompt slots")
    return args



def rotate_half_to_pairs(head_dim: int) -> Tensor:
    """new dim 2j <- HF dim j, 2j + 1 <- HF dim j + head_dim / 2."""
    half = head_dim // 2
    return torch.stack([torch.arange(half), torch.arange(half) + half], dim=-1).flatten()


LAYER_KEYS = {  # HF name under a layer prefix -> (ours, shape as a function of args)
    "self_attn.q_proj.weight": lambda a: (a.dim, a.dim), "self_attn.k_proj.weight": lambda a: (a.dim, a.dim),
    "self_attn.v_proj.weight": lambda a: (a.dim, a.dim), "self_attn.o_proj.weight": lambda a: (a.dim, a.dim),
    "self_attn.q_norm.weight": None, "self_attn.q_norm.bias": None,
    "self_attn.k_norm.weight": None, "self_attn.k_norm.bias": None,
    "mlp.gate_proj.weight": lambda a: (a.ffn_dim, a.dim), "mlp.up_proj.weight": lambda a: (a.ffn_dim, a.dim),
    "mlp.down_proj.weight": lambda a: (a.dim, a.ffn_dim),
    "input_layernorm.weight": lambda a: (a.dim,), "post_attention_layernorm.weight": lambda a: (a.dim,),
}


class StateCheck:
    """Strict key and shape checks of an HF-named state dict; every failure one line naming the file and the key."""

    def __init__(self, sd: dict[str, Tensor], path, where: dict[str, str] | None = None):
        self.sd, self.path, self.where, self.used = sd, path, where or {}, set()

    def file(self, key: str) -> str:
        return self.where.get(key, str(self.path))

    def take(self, key: str, shape: tuple[int, ...] | None = None) -> Tensor:
        if key not in self.sd:
            raise UserError(f"{self.path}: missing tensor {key}; the checkpoint does not match its config.json")
        t = self.sd[key]
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise UserError(f"{self.file(key)}: {key} has shape {tuple(t.shape)}, expected {tuple(shape)} from "
                            "config.json")
        self.used.add(key)
        return t

    def head_norm(self, key: str, args: ChameleonArgs) -> Tensor:
        """q/k-norm gamma or beta: [n_head, hd] (transformers' converter) or [m, hd] repeated over heads (Lumina's
        model-parallel shards, m = 1 for 7B), un-permuted to interleaved pairs."""
        t = self.take(key)
        H, hd = args.n_head, args.head_dim
        if t.ndim != 2 or t.shape[1] != hd or H % t.shape[0]:
            raise UserError(f"{self.file(key)}: {key} has shape {tuple(t.shape)}, expected ({H}, {hd}) or (1, {hd})")
        return t.repeat_interleave(H // t.shape[0], dim=0)[:, rotate_half_to_pairs(hd)]

    def finish(self, ignored: tuple[str, ...] = ()) -> None:
        extra = sorted(k for k in self.sd if k not in self.used and not k.startswith(ignored)
                       and not k.endswith("rotary_emb.inv_freq"))
        if extra:
            raise UserError(f"{self.file(extra[0])}: unexpected tensor {extra[0]}"
                            + (f" (+{len(extra) - 1} more)" if len(extra) > 1 else "") + "; not a Chameleon checkpoint "
                            "of this config")


def layer_state(check: StateCheck, prefix: str, ours: str, args: ChameleonArgs) -> dict[str, Tensor]:
    """One HF Chameleon decoder layer (`prefix`, e.g. "model.layers.3.") as our TransformerBlock's keys (`ours`)."""
    t = {k: (check.head_norm(prefix + k, args) if shape is None else check.take(prefix + k, shape(args)))
         for k, shape in LAYER_KEYS.items()}
    perm, H, hd = rotate_half_to_pairs(args.head_dim), args.n_head, args.head_dim
    pairs = lambda w: w.reshape(H, hd, -1)[:, perm].reshape(H * hd, -1)  # noqa: E731
    return {
        f"{ours}attention.wqkv.weight": torch.cat([pairs(t["self_attn.q_proj.weight"]),
                                                   pairs(t["self_attn.k_proj.weight"]), t["self_attn.v_proj.weight"]]),
        f"{ours}attention.wo.weight": t["self_attn.o_proj.weight"],
        **{f"{ours}attention.{n}_norm.{p}": t[f"self_attn.{n}_norm.{p}"] for n in "qk" for p in ("weight", "bias")},
        f"{ours}feed_forward.w1.weight": t["mlp.gate_proj.weight"],
        f"{ours}feed_forward.w3.weight": t["mlp.up_proj.weight"],
        f"{ours}feed_forward.w2.weight": t["mlp.down_proj.weight"],
        f"{ours}attention_norm.weight": t["input_layernorm.weight"],
        f"{ours}ffn_norm.weight": t["post_attention_layernorm.weight"],
    }


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def build(cls, args: ChameleonArgs, state: dict[str, Tensor], dtype: torch.dtype, device) -> nn.Module:
    """cls(args) allocated in `dtype` (never initialised) and loaded strictly from our key names."""
    with no_init(), default_dtype(dtype):
        model = cls(args)
    model.load_state_dict(state, strict=True)
    return model.to(device=device)


def chameleon_from_hf(args: ChameleonArgs, sd: dict[str, Tensor], path, where: dict[str, str] | None = None,
                      dtype: torch.dtype = torch.bfloat16, device="cpu") -> Chameleon:
    """A Chameleon target from an HF state dict (`where`: each key's shard file, for the error lines): every key
    and shape checked against `args`, the VQ (model.vqmodel.*) ignored."""
    check = StateCheck(sd, path, where)
    state = {"tok_embeddings.weight": check.take("model.embed_tokens.weight", (args.text_vocab, args.dim)),
             "norm.weight": check.take("model.norm.weight", (args.dim,)),
             "output.weight": check.take("lm_head.weight", (args.text_vocab, args.dim))}
    for i in range(args.n_layer):
        state.update(layer_state(check, f"model.layers.{i}.", f"layers.{i}.", args))
    check.finish(ignored=("model.vqmodel.",))
    return build(Chameleon, args, state, dtype, device).eval()


def drafter_from_authors(sd: dict[str, Tensor], path, target: Chameleon, where: dict[str, str] | None = None
                         ) -> ChameleonDrafter:
    """The authors' released drafter state dict (keys of reference section 5) for `target`, loaded strictly; its
    embedding must be the target's (they froze it as a copy), since over the prompt the drafter reads the
    target's."""
    args, w = target.args, target.output.weight
    check = StateCheck(sd, path, where)
    state = {"tok_embeddings.weight": check.take("embed_tokens.weight", (args.text_vocab, args.dim)),
             "fc.weight": check.take("fc.weight", (args.dim, 2 * args.dim)),
             "fc.bias": check.take("fc.bias", (args.dim,)),
             **layer_state(check, "layers.0.", "layer.", args)}
    check.finish()
    emb = state["tok_embeddings.weight"].to(device=w.device, dtype=w.dtype)
    if not torch.equal(emb, target.tok_embeddings.weight.detach()):
        raise UserError(f"{check.file('embed_tokens.weight')}: embed_tokens.weight is not the target's "
                        "model.embed_tokens.weight; this drafter was trained for another target")
    drafter = build(ChameleonDrafter, args, state, w.dtype, w.device)
    drafter.copy_frozen(target)
    return drafter.eval().requires_grad_(False)


def authors_layer_state(state: dict[str, Tensor], ours: str, prefix: str, args: ChameleonArgs) -> dict[str, Tensor]:
    """layer_state's inverse: our TransformerBlock keys under `ours` as transformers' Chameleon layer keys under
    `prefix`, back in HF's rotate-half layout (q / k rows and q / k-norm params per head)."""
    back = torch.argsort(rotate_half_to_pairs(args.head_dim))
    H, hd = args.n_head, args.head_dim
    halves = lambda w: w.reshape(H, hd, -1)[:, back].reshape(H * hd, -1)  # noqa: E731
    q, k, v = state[f"{ours}attention.wqkv.weight"].split(args.dim)
    return {
        f"{prefix}self_attn.q_proj.weight": halves(q), f"{prefix}self_attn.k_proj.weight": halves(k),
        f"{prefix}self_attn.v_proj.weight": v, f"{prefix}self_attn.o_proj.weight": state[f"{ours}attention.wo.weight"],
        **{f"{prefix}self_attn.{n}_norm.{p}": state[f"{ours}attention.{n}_norm.{p}"][:, back]
           for n in "qk" for p in ("weight", "bias")},
        f"{prefix}mlp.gate_proj.weight": state[f"{ours}feed_forward.w1.weight"],
        f"{prefix}mlp.up_proj.weight": state[f"{ours}feed_forward.w3.weight"],
        f"{prefix}mlp.down_proj.weight": state[f"{ours}feed_forward.w2.weight"],
        f"{prefix}input_layernorm.weight": state[f"{ours}attention_norm.weight"],
        f"{prefix}post_attention_layernorm.weight": state[f"{ours}ffn_norm.weight"],
    }


def drafter_to_authors(drafter: ChameleonDrafter, target: Chameleon, dtype: torch.dtype) -> dict[str, Tensor]:
    """A ChameleonDrafter as the authors' state dict (the keys drafter_from_authors reads), in `dtype` on the CPU;
    its embed_tokens is the target's own model.embed_tokens (frozen in training), bit for bit."""
    state = {k: v.detach().to("cpu", dtype) for k, v in drafter.state_dict().items() if k.startswith(("fc.", "layer."))}
    return {"embed_tokens.weight": target.tok_embeddings.weight.detach().to("cpu").clone(),
            "fc.weight": state["fc.weight"], "fc.bias": state["fc.bias"],
            **{k: v.contiguous() for k, v in authors_layer_state(state, "layer.", "layers.0.", drafter.args).items()}}
