"""The LANTERN authors' HF-format LlamaGen folders, read as released: their target (LlamaForCausalLM-style keys) and
their one-layer EAGLE drafter, each a folder with config.json and model.safetensors / pytorch_model.bin (maybe
sharded behind an *.index.json), or one weights file with config.json beside it.

The two readers, `read_authors_target` and `read_authors_drafter`, return (spec, state dict) in the engine's key
names; the engine builds the model (`checkpoint.build`, `drafter.build_drafter`). Every key is mapped by name; an
unmapped, missing or wrongly shaped key is refused, naming it. config.json's input_type / block_size (the token
grid), rms_norm_eps and RoPE base are read, and a drafter whose grid or RoPE base differs from its target's is
refused. `lantern convert`, `lantern.load_llamagen` and `lantern check-config` all read these folders here.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import torch
from torch import Tensor

from lantern.engine.models.checkpoint import short_list
from lantern.errors import UserError

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
INDEX_FILES = tuple(f"{name}.index.json" for name in WEIGHT_FILES)
# HF rotary caches are derived from the config, carry no weights and have no upstream counterpart
DERIVED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")


# -- reading their files --------------------------------------------------------------------------------------------
def _read_weights(path: Path, shapes_only: bool = False) -> dict[str, Tensor]:
    """A weights file's tensors; with shapes_only, tensors on the meta device (only the file's header is read)."""
    from lantern.engine.models.checkpoint import extract_state_dict
    from lantern.io import load_torch

    if path.suffix == ".safetensors":
        from safetensors import SafetensorError, safe_open
        from safetensors.torch import load_file

        try:
            if not shapes_only:
                return load_file(path)
            with safe_open(path, framework="pt") as f:
                return {k: torch.empty(f.get_slice(k).get_shape(), device="meta") for k in f.keys()}
        except (SafetensorError, OSError) as e:
            raise UserError(f"--src weights {path} are unreadable (truncated or not safetensors): {e}") from None
    return dict(extract_state_dict(load_torch(path, "checkpoint", mmap=shapes_only), path))


def read_hf(src: str | Path, shapes_only: bool = False) -> tuple[dict[str, Tensor], dict]:
    """(state dict, config.json or {}) of an HF-style model folder or weights file (config.json beside it); with
    shapes_only the tensors are on the meta device (a config check reads only the files' headers)."""
    src = Path(src)
    if not src.exists():
        raise UserError(f"--src {src} does not exist; give the authors' model folder or weights file")
    folder = src if src.is_dir() else src.parent
    config = {}
    if (folder / "config.json").is_file():
        try:
            config = json.loads((folder / "config.json").read_text())
        except json.JSONDecodeError as e:
            raise UserError(f"{folder / 'config.json'} is not valid JSON: {e}") from None
    if src.is_file():
        return _read_weights(src, shapes_only), config
    for index in INDEX_FILES:
        if (src / index).is_file():
            try:
                weight_map = json.loads((src / index).read_text()).get("weight_map", {})
            except (json.JSONDecodeError, AttributeError) as e:
                raise UserError(f"{src / index} is not a valid shard index ({type(e).__name__}); download it again") from None
            sd = {}
            for shard in sorted(set(weight_map.values())):
                if not (src / shard).is_file():
                    raise UserError(f"--src {src}: shard {shard} named in {index} is missing; download every shard")
                sd.update(_read_weights(src / shard, shapes_only))
            return sd, config
    for name in WEIGHT_FILES:
        if (src / name).is_file():
            return _read_weights(src / name, shapes_only), config
    raise UserError(f"--src {src} holds none of {', '.join(WEIGHT_FILES + INDEX_FILES)}; point it at the model folder")


# -- target -----------------------------------------------------------------------------------------------------------
LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
LAYER_RENAMES = {
    "self_attn.o_proj.weight": "attention.wo.weight",
    "mlp.gate_proj.weight": "feed_forward.w1.weight",  # the SiLU branch
    "mlp.up_proj.weight": "feed_forward.w3.weight",
    "mlp.down_proj.weight": "feed_forward.w2.weight",
    "input_layernorm.weight": "attention_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
}
QKV = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight")
TOP_RENAMES = {"model.embed_tokens.weight": "tok_embeddings.weight", "lm_head.weight": "output.weight",
               "model.norm.weight": "norm.weight"}
COND_PREFIX = "model.cls_embedding."


def target_state_dict(hf: dict[str, Tensor]) -> dict[str, Tensor]:
    """Upstream LlamaGen keys from the authors' HF keys: fused wqkv = cat(q, k, v) rows, the rest renamed."""
    out, unmapped, qkv = {}, [], {}
    for key, value in hf.items():
        m = LAYER.match(key)
        if DERIVED.search(key):
            continue
        if key in TOP_RENAMES:
            out[TOP_RENAMES[key]] = value
        elif key.startswith(COND_PREFIX):
            out["cls_embedding." + key[len(COND_PREFIX):]] = value
        elif m and m[2] in LAYER_RENAMES:
            out[f"layers.{m[1]}.{LAYER_RENAMES[m[2]]}"] = value
        elif m and m[2] in QKV:
            qkv.setdefault(m[1], {})[m[2]] = value
        else:
            unmapped.append(key)
    if unmapped:
        raise UserError(f"--src has {len(unmapped)} keys with no upstream LlamaGen counterpart: {short_list(unmapped)}; "
                        "is it the authors' HF-converted LlamaGen?")
    missing = [f"model.layers.{i}.{p}" for i, parts in qkv.items() for p in QKV if p not in parts]
    if missing:
        raise UserError(f"--src lacks {len(missing)} attention projections: {short_list(missing)}")
    for i, parts in qkv.items():
        out[f"layers.{i}.attention.wqkv.weight"] = torch.cat([parts[p] for p in QKV])
    return out


# Their input_type fixes the image token grid (cnets_llamagen.Model sets block_size from it, and rope_base 10000):
# t2i = stage I (16 x 16), t2i2 = stage II (32 x 32), c2i = 24 x 24.
INPUT_TYPE_TOKENS = {"c2i": 576, "t2i": 256, "t2i2": 1024}
STAGES = {256: "stage I, 16 x 16", 1024: "stage II, 32 x 32"}


def _grid(tokens: int) -> str:
    return STAGES.get(tokens, f"{tokens} tokens")


def _input_type(config: dict, what: str) -> str | None:
    kind = config.get("input_type")
    if kind is not None and kind not in INPUT_TYPE_TOKENS:
        raise UserError(f"--src {what} config.json input_type = {kind!r} is none of {', '.join(INPUT_TYPE_TOKENS)}; "
                        "is it the authors' LlamaGen file?")
    return kind


def config_spec(config: dict, sd: dict[str, Tensor]) -> dict:
    """The target spec config.json states (heads, image tokens, condition tokens, classes); the weights say the rest.
    Their target reads its grid from block_size and its kind from input_type (c2i, t2i); t2i2, the drafters' tag
    for stage II, means a t2i target of 1024 tokens and must agree with block_size."""
    kind = _input_type(config, "target")
    tokens = config.get("block_size")
    if kind == "t2i2" and tokens is not None and tokens != INPUT_TYPE_TOKENS[kind]:
        raise UserError(f"--src target config.json says input_type {kind} ({_grid(INPUT_TYPE_TOKENS[kind])}) but "
                        f"block_size {tokens}; fix config.json to the stage the weights were trained for")
    if kind == "t2i2" and tokens is None:
        tokens = INPUT_TYPE_TOKENS[kind]
    spec = {"model_type": {"t2i2": "t2i"}.get(kind, kind), "image_tokens": tokens,
            "cls_token_num": config.get("cls_token_num"), "num_classes": config.get("num_classes")}
    if "num_attention_heads" in config and "tok_embeddings.weight" in sd:
        layers = {int(k.split(".")[1]) for k in sd if k.startswith("layers.")}
        spec["gpt_size"] = {"dim": sd["tok_embeddings.weight"].shape[1], "n_layer": max(layers, default=-1) + 1,
                            "n_head": config["num_attention_heads"]}
    return {k: v for k, v in spec.items() if v is not None}


def config_numerics(config: dict) -> dict:
    """ModelArgs overrides for what config.json states about the arithmetic: rms_norm_eps, and the RoPE base (their
    target reads rope_base; HF configs name it rope_theta)."""
    out = {}
    if config.get("rms_norm_eps") is not None:
        out["norm_eps"] = float(config["rms_norm_eps"])
    base = config.get("rope_base", config.get("rope_theta"))
    if base is not None:
        out["rope_base"] = float(base)
    return out


def check_stated_tokens(stated: dict, user: dict) -> None:
    """A --target-spec that contradicts config.json's token grid is refused: a stage-II target run as stage I
    decodes 256 tokens on a 16 x 16 grid (the authors' issue #5)."""
    said, wanted = stated.get("image_tokens"), user.get("image_tokens")
    if said is not None and wanted is not None and said != wanted:
        raise UserError(f"--src target config.json states {said} image tokens ({_grid(said)}) but --target-spec "
                        f"image_tokens = {wanted} ({_grid(wanted)}); set the image size the target was trained for")


def check_drafter_config(config: dict, a, where: str = "--src drafter config.json", target: str = "--target") -> None:
    """The authors' drafter config.json against the target it will serve (ModelArgs a): input_type (their RoPE grid
    and condition kind), block_size and the RoPE base where input_type does not fix them."""
    kind = config.get("input_type")
    if kind is not None and kind not in INPUT_TYPE_TOKENS:
        raise UserError(f"{where} input_type = {kind!r} is none of {', '.join(INPUT_TYPE_TOKENS)}; is it the "
                        "authors' LlamaGen drafter?")
    if kind is not None:
        if ("c2i" if kind == "c2i" else "t2i") != a.model_type:
            raise UserError(f"{where} input_type = {kind}, but {target} is a {a.model_type} model; use the drafter "
                            "released for this target")
        tokens, base, said = INPUT_TYPE_TOKENS[kind], 10000.0, f"input_type = {kind}"
    else:
        tokens, base = config.get("block_size"), config.get("rope_base", config.get("rope_theta"))
        said = f"block_size = {tokens}"
    if tokens is not None and tokens != a.image_tokens:
        raise UserError(f"{where} {said} ({_grid(tokens)} RoPE grid), but {target} has {a.image_tokens} image "
                        f"tokens ({_grid(a.image_tokens)}); use the drafter released for the target's stage "
                        "(llamagen_drafter: t2i, stage I; llamagen2_drafter: t2i2, stage II)")
    if base is not None and float(base) != a.rope_base:
        raise UserError(f"{where} rope base {float(base):g} differs from the target's {a.rope_base:g}; the drafter "
                        "must rotate as its target does")


def check_target(sd: dict[str, Tensor], args) -> None:
    """Every upstream key present once with the upstream shape (compared with a GPT on the meta device)."""
    from lantern.engine.models.model import GPT

    with torch.device("meta"):
        want = {k: v.shape for k, v in GPT(args).state_dict().items()}
    missing, extra = sorted(set(want) - set(sd)), sorted(set(sd) - set(want))
    wrong = [f"{k} {tuple(sd[k].shape)} vs {tuple(want[k])}" for k in want if k in sd and sd[k].shape != want[k]]
    if missing or extra or wrong:
        parts = [f"{what} {short_list(keys)}" for what, keys in
                 (("missing", missing), ("unexpected", extra), ("wrong shape (file vs LlamaGen)", wrong)) if keys]
        raise UserError(f"--src does not convert to a LlamaGen {args.model_type} target of width {args.dim} "
                        f"and {args.n_layer} layers: {'; '.join(parts)}")


# -- drafter ----------------------------------------------------------------------------------------------------------
# their drafter key -> ours; q/k/v become the fused wqkv
DRAFTER_KEYS = {
    "embed_tokens.weight": "tok_embeddings.weight",
    "fc.weight": "fc.weight",
    "fc.bias": "fc.bias",
    "layers.0.self_attn.o_proj.weight": "layer.attention.wo.weight",
    "layers.0.mlp.gate_proj.weight": "layer.feed_forward.w1.weight",
    "layers.0.mlp.up_proj.weight": "layer.feed_forward.w3.weight",
    "layers.0.mlp.down_proj.weight": "layer.feed_forward.w2.weight",
    "layers.0.post_attention_layernorm.weight": "layer.ffn_norm.weight",
}
DRAFTER_QKV = tuple(f"layers.0.{p}" for p in QKV)


def check_authors_drafter(theirs: dict[str, Tensor], config: dict, a):
    """The DrafterOptions of the authors' drafter (state dict, config.json) for a target of ModelArgs `a`, after
    checking its keys and shapes (meta tensors suffice: `lantern check-config` reads only the files' headers)."""
    from lantern.engine.models.drafter import AUTHORS_LLAMAGEN, Drafter

    heads, layers = config.get("num_attention_heads", a.n_head), config.get("num_hidden_layers", 1)
    if heads != a.n_head or layers != 1:
        raise UserError(f"--src drafter config has {layers} layers and {heads} heads; a LlamaGen drafter for this target "
                        f"has 1 layer and the target's {a.n_head} heads")
    check_drafter_config(config, a)
    options = replace(AUTHORS_LLAMAGEN, norm_eps=float(config.get("rms_norm_eps", AUTHORS_LLAMAGEN.norm_eps)))
    with torch.device("meta"):  # the shapes only
        want = Drafter(a, options).state_dict()
    expected = set(DRAFTER_KEYS) | set(DRAFTER_QKV)
    unmapped, missing = sorted(set(theirs) - expected), sorted(expected - set(theirs))
    if unmapped or missing:
        parts = ([f"unmapped {short_list(unmapped)}"] if unmapped else []) + ([f"missing {short_list(missing)}"] if missing else [])
        raise UserError(f"--src is not the authors' one-layer LlamaGen drafter ({'; '.join(parts)})")
    wrong = [f"{k} {tuple(theirs[k].shape)} vs {(a.dim, a.dim)}" for k in DRAFTER_QKV if theirs[k].shape != (a.dim, a.dim)]
    wrong += [f"{k} {tuple(theirs[k].shape)} vs {tuple(want[DRAFTER_KEYS[k]].shape)}"
              for k in DRAFTER_KEYS if theirs[k].shape != want[DRAFTER_KEYS[k]].shape]
    if wrong:
        raise UserError(f"--src drafter tensors do not fit this target (dim {a.dim}, ffn {a.ffn_dim}, vocab "
                        f"{a.vocab_size}): {short_list(wrong)}")
    return options


# -- the readers ------------------------------------------------------------------------------------------------------
def read_authors_target(src: str | Path, spec: dict | None = None, shapes_only: bool = False):
    """(ModelArgs, state dict in upstream LlamaGen's keys) of the authors' HF target: config.json's spec under the
    user's `spec` (which has the last word, but may not contradict its token grid), every key and shape checked,
    config.json's norm eps and RoPE base kept. shapes_only: tensors on the meta device (headers only)."""
    from lantern.engine.models.checkpoint import parse_spec, target_args

    spec = spec or {}
    hf, config = read_hf(src, shapes_only)
    sd = target_state_dict(hf)
    stated = config_spec(config, sd)
    check_stated_tokens(stated, spec)
    args = target_args({}, sd, parse_spec({**stated, **spec}), src)
    check_target(sd, args)
    return replace(args, **config_numerics(config)), sd


def read_authors_drafter(src: str | Path, a, shapes_only: bool = False):
    """(DrafterOptions, state dict in our drafter's keys) of the authors' drafter for a target of ModelArgs `a`:
    its keys and shapes checked against that target, q / k / v fused into wqkv. The embedding is its own; the head
    is the target's, copied when the engine builds it (`drafter.build_drafter`)."""
    theirs, config = read_hf(src, shapes_only)
    options = check_authors_drafter(theirs, config, a)
    ours = {DRAFTER_KEYS[k]: v for k, v in theirs.items() if k in DRAFTER_KEYS}
    ours["layer.attention.wqkv.weight"] = torch.cat([theirs[k] for k in DRAFTER_QKV])
    return options, ours


def is_authors_target(path: str | Path) -> bool:
    """Whether a llamagen.gpt_ckpt path is in the authors' HF layout: a folder, or one of their weight files beside
    its config.json (anything else is read as an upstream-layout .pt)."""
    path = Path(path)
    return path.is_dir() or (path.name in WEIGHT_FILES + INDEX_FILES and (path.parent / "config.json").is_file())
