"""Upstream LlamaGen's released GPTs and VQs, read as released: the `.pt` container (c2i_B_256.pt, t2i_XL_*.pt,
vq_ds16_c2i.pt ...; the project's own files are the same container with their config under "args"), and the
`Transformer` / `VQModel` objects of upstream's code already in memory.

Each reader returns (spec, state dict): ModelArgs or VQArgs, and the tensors in the engine's key names. An upstream
file carries no config: the GPT's comes from a target spec (the llamagen world's config as data) checked against
the shapes the file shows (`checkpoint.target_args`), the VQ's from its encoder's levels (`vq.file_args`). The engine
then builds the model (`checkpoint.build`); `load_gpt` / `load_vq` are the two steps in one call.
"""

from __future__ import annotations

import os

from torch import nn

from lantern.errors import UserError


# -- files ------------------------------------------------------------------------------------------------------------
def read_gpt(path: str | os.PathLike, spec=None, mmap: bool = False):
    """(ModelArgs, state dict) of a LlamaGen GPT file, upstream's (spec plus shapes) or ours (args inside).

    spec: a target spec dict (checkpoint.parse_spec), checked against the file; or a ModelArgs, taken as given.
    mmap: the tensors stay on disk (a config check reads only what it needs)."""
    from lantern.engine.models.checkpoint import extract_state_dict, parse_spec, target_args, wrong_kind
    from lantern.engine.models.model import ModelArgs
    from lantern.io import load_torch

    parsed = None if isinstance(spec, ModelArgs) else parse_spec(spec)
    obj = load_torch(path, "checkpoint", mmap=mmap)
    error = wrong_kind(obj, path, "LlamaGen GPT")  # before the state dict: a drafter file has none
    if error:
        raise error
    sd = extract_state_dict(obj, path)
    return (spec if parsed is None else target_args(obj, sd, parsed, path)), sd


def read_vq(path: str | os.PathLike, mmap: bool = False):
    """(VQArgs, state dict) of a LlamaGen VQ file: ours carry their VQArgs; upstream's are read from its tensors."""
    from lantern.engine.models.checkpoint import extract_state_dict, wrong_kind
    from lantern.engine.models.vq import file_args
    from lantern.io import load_torch

    obj = load_torch(path, "checkpoint", mmap=mmap)
    error = wrong_kind(obj, path, "VQ tokenizer")
    if error:
        raise error
    sd = extract_state_dict(obj, path)
    return file_args(obj, sd, path), sd


def load_gpt(path: str | os.PathLike, spec=None, dtype: str = "fp32", device: str = "cpu"):
    """A LlamaGen GPT from a file (read_gpt), built by the engine, on `device` in `dtype`, in eval mode."""
    from lantern.engine.models.checkpoint import build, parse_device, parse_dtype
    from lantern.engine.models.model import GPT

    parse_dtype(dtype), parse_device(device)  # a wrong flag is named before the file is read
    args, sd = read_gpt(path, spec)
    return build(GPT, args, sd, path, dtype, device)


def load_vq(path: str | os.PathLike, args=None, device: str = "cpu"):
    """A LlamaGen VQ from a file (read_vq; `args` replaces the file's VQArgs), built by the engine, in fp32."""
    from lantern.engine.models.checkpoint import build
    from lantern.engine.models.vq import VQModel

    found, sd = read_vq(path)
    return build(VQModel, args or found, sd, path, None, device)


# -- objects in memory ------------------------------------------------------------------------------------------------
def _object_spec(model: nn.Module) -> dict:
    """The target spec an upstream `Transformer` states in its attributes (its `config`, a ModelArgs)."""
    config = getattr(model, "config", None)
    if config is None:
        return {}
    for key, want in (("n_kv_head", None), ("ffn_dim_multiplier", None)):
        if getattr(config, key, want) != want:
            raise UserError(f"gpt_ckpt: the model's config sets {key} = {getattr(config, key)}; LlamaGen's released "
                            "GPTs leave it None, and lantern's GPT implements only that")
    spec = {"model_type": getattr(config, "model_type", None), "image_tokens": getattr(config, "block_size", None),
            "cls_token_num": getattr(config, "cls_token_num", None)}
    if all(isinstance(getattr(config, k, None), int) for k in ("dim", "n_layer", "n_head")):
        spec["gpt_size"] = {k: getattr(config, k) for k in ("dim", "n_layer", "n_head")}
    if spec["model_type"] == "c2i":
        spec["num_classes"] = getattr(config, "num_classes", None)
        spec["cls_token_num"] = None  # upstream keeps its default 1 or 120 here; c2i has one condition token
    return spec


def read_gpt_object(model: nn.Module, spec: dict | None, what: str):
    """(ModelArgs, state dict) of a GPT object: upstream's `Transformer` (its config has the last word; the spec
    must agree with it) or ours; its state dict goes through the same shape checks as a file (no file round trip)."""
    from dataclasses import replace

    from lantern.engine.models.checkpoint import parse_spec, target_args
    from lantern.engine.models.model import GPT

    sd = {k: v.detach() for k, v in model.state_dict().items()}
    if "tok_embeddings.weight" not in sd:
        raise UserError(f"{what} is not a LlamaGen GPT: it has no tok_embeddings.weight; pass upstream's "
                        "Transformer (GPT_models[...]) as gpt_ckpt and its VQModel as vq_ckpt")
    if isinstance(model, GPT):
        return target_args({"args": model.args.to_dict()}, sd, parse_spec(spec), what), sd
    stated = parse_spec({k: v for k, v in _object_spec(model).items() if v is not None})
    for key, value in parse_spec(spec).items():  # the object's own config has the last word: agree with it
        theirs = stated.get(key)
        if key == "gpt_size" and theirs is not None:  # a name or {dim, n_layer, n_head}: compare the numbers
            same = all(value[k] == theirs[k] for k in ("dim", "n_layer", "n_head"))
            value, theirs = value["text"], value["text"] if same else theirs["text"]
        if theirs is not None and value != theirs:
            raise UserError(f"{what} states {key} = {theirs} in its config, but llamagen.{key} = {value}; "
                            f"leave {key} out (the object's config says it)")
    args = target_args({}, sd, stated, what)
    config = getattr(model, "config", None)
    numerics = {k: float(getattr(config, k)) for k in ("norm_eps", "rope_base") if hasattr(config, k)}
    return replace(args, **numerics), sd


def read_vq_object(model: nn.Module, what: str):
    """(VQArgs, state dict) of upstream's `VQModel` object: its config read from its tensors' shapes and its
    GroupNorm layers."""
    from lantern.engine.models.vq import VQArgs, encoder_levels

    sd = {k: v.detach() for k, v in model.state_dict().items()}
    if "quantize.embedding.weight" not in sd:
        raise UserError(f"{what} is not a LlamaGen VQ tokenizer: it has no quantize.embedding.weight; pass upstream's "
                        "VQModel (VQ_models['VQ-16']) as vq_ckpt")
    levels = encoder_levels(sd)
    if not levels:
        raise UserError(f"{what} has no encoder.conv_blocks; it is not a LlamaGen VQModel")
    ch = sd["encoder.conv_in.weight"].shape[0]
    mult = tuple(sd[f"encoder.conv_blocks.{i}.res.0.conv1.weight"].shape[0] // ch for i in range(levels))

    def count(prefix: str, level: int) -> int:  # res blocks of one level: <prefix>.conv_blocks.<level>.res.<j>...
        return len({k.split(".")[4] for k in sd if k.startswith(f"{prefix}.conv_blocks.{level}.res.")})

    groups = next((m.num_groups for m in model.modules() if isinstance(m, nn.GroupNorm)), 32)
    codes, dim = sd["quantize.embedding.weight"].shape
    config = getattr(model, "config", None)
    args = VQArgs(codebook_size=codes, codebook_embed_dim=dim,
                  codebook_l2_norm=bool(getattr(config, "codebook_l2_norm", True)), ch=ch, ch_mult=mult,
                  z_channels=sd["quant_conv.weight"].shape[1], norm_groups=groups,
                  enc_res_blocks=tuple(count("encoder", i) for i in range(levels)),
                  dec_res_blocks=tuple(count("decoder", i) for i in range(levels)),
                  usage_window=sd["quantize.codebook_used"].shape[0] if "quantize.codebook_used" in sd else 65536)
    return args, sd
