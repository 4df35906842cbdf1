"""`lantern convert`: the LANTERN authors' LlamaGen files -> ours.

--kind target   their HF-converted LlamaGen (LlamaForCausalLM-style keys; a folder with config.json and
                model.safetensors / pytorch_model.bin, maybe sharded behind an *.index.json, or one weights file)
                -> the upstream LlamaGen container {"model": state_dict} that `load_gpt` reads with a target spec.
--kind drafter  their one-layer EAGLE drafter for LlamaGen -> a drafter checkpoint for --target, with the drafter's
                own token embedding and the options (`DrafterOptions`) under which our forward computes theirs.
Every key is mapped by name; an unmapped, missing or wrongly shaped key is refused, naming it.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import torch
from torch import Tensor

from lantern.engine.checkpoint import short_list
from lantern.errors import UserError

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
INDEX_FILES = tuple(f"{name}.index.json" for name in WEIGHT_FILES)
# HF rotary caches are derived from the config, carry no weights and have no upstream counterpart
DERIVED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")


# -- reading their files --------------------------------------------------------------------------------------------
def _read_weights(path: Path, shapes_only: bool = False) -> dict[str, Tensor]:
    """A weights file's tensors; with shapes_only, tensors on the meta device (only the file's header is read)."""
    from lantern.engine.checkpoint import extract_state_dict
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


def config_spec(config: dict, sd: dict[str, Tensor]) -> dict:
    """The target spec config.json states (heads, image tokens, condition tokens, classes); the weights say the rest."""
    spec = {"model_type": config.get("input_type"), "image_tokens": config.get("block_size"),
            "cls_token_num": config.get("cls_token_num"), "num_classes": config.get("num_classes")}
    if "num_attention_heads" in config and "tok_embeddings.weight" in sd:
        layers = {int(k.split(".")[1]) for k in sd if k.startswith("layers.")}
        spec["gpt_size"] = {"dim": sd["tok_embeddings.weight"].shape[1], "n_layer": max(layers, default=-1) + 1,
                            "n_head": config["num_attention_heads"]}
    if spec["model_type"] not in ("c2i", "t2i"):
        spec["model_type"] = None  # their t2i2 / unknown tags: the weights tell c2i from t2i
    return {k: v for k, v in spec.items() if v is not None}


def check_target(sd: dict[str, Tensor], args) -> None:
    """Every upstream key present once with the upstream shape (compared with a GPT on the meta device)."""
    from lantern.engine.model import GPT

    with torch.device("meta"):
        want = {k: v.shape for k, v in GPT(args).state_dict().items()}
    missing, extra = sorted(set(want) - set(sd)), sorted(set(sd) - set(want))
    wrong = [f"{k} {tuple(sd[k].shape)} vs {tuple(want[k])}" for k in want if k in sd and sd[k].shape != want[k]]
    if missing or extra or wrong:
        parts = [f"{what} {short_list(keys)}" for what, keys in
                 (("missing", missing), ("unexpected", extra), ("wrong shape (file vs LlamaGen)", wrong)) if keys]
        raise UserError(f"--src does not convert to a LlamaGen {args.model_type} target of width {args.dim} "
                        f"and {args.n_layer} layers: {'; '.join(parts)}")


def printable_spec(args) -> dict:
    """The --target-spec that loads the converted file (named size where it is one)."""
    from lantern.engine.model import GPT_SIZES

    size = next((name for name, v in GPT_SIZES.items() if v == {"n_layer": args.n_layer, "n_head": args.n_head,
                                                                  "dim": args.dim}), None)
    spec = {"model_type": args.model_type, "gpt_size": size or {"dim": args.dim, "n_layer": args.n_layer,
                                                                 "n_head": args.n_head},
            "image_tokens": args.image_tokens, "cls_token_num": args.cls_token_num}
    if args.model_type == "c2i":
        spec["num_classes"] = args.num_classes
    return spec


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
    from dataclasses import replace

    from lantern.engine.drafter import AUTHORS_LLAMAGEN, Drafter

    heads, layers = config.get("num_attention_heads", a.n_head), config.get("num_hidden_layers", 1)
    if heads != a.n_head or layers != 1:
        raise UserError(f"--src drafter config has {layers} layers and {heads} heads; a LlamaGen drafter for this target "
                        f"has 1 layer and the target's {a.n_head} heads")
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


def convert_drafter(theirs: dict[str, Tensor], config: dict, target):
    """A Drafter for `target` computing the authors' drafter function from its state dict and config.json."""
    from lantern.engine.drafter import Drafter

    drafter = Drafter(target.args, check_authors_drafter(theirs, config, target.args))
    want = drafter.state_dict()
    ours = {DRAFTER_KEYS[k]: v for k, v in theirs.items() if k in DRAFTER_KEYS}
    ours["layer.attention.wqkv.weight"] = torch.cat([theirs[k] for k in DRAFTER_QKV])
    with torch.no_grad():
        for k, v in ours.items():
            want[k].copy_(v.float())  # fp16 -> fp32 is exact; load_drafter casts to the target's dtype
    drafter.copy_frozen(target)
    return drafter.eval()


# -- CLI --------------------------------------------------------------------------------------------------------------
def main(argv: list[str]) -> None:
    from lantern.io import read_structured, save_torch

    ap = argparse.ArgumentParser(prog="lantern convert", description=__doc__.split("\n")[0])
    ap.add_argument("--kind", required=True, choices=("target", "drafter"))
    ap.add_argument("--src", required=True, help="the authors' model folder or weights file")
    ap.add_argument("--out", required=True, help="converted checkpoint")
    ap.add_argument("--target", default=None, help="GPT checkpoint the drafter serves (--kind drafter)")
    ap.add_argument("--target-spec", default=None,
                    help="llamagen target config (JSON/YAML or file): of --target (drafter), or of --src (target)")
    a = ap.parse_args(argv)
    if a.kind == "drafter" and not a.target:
        raise UserError("--kind drafter needs --target (the GPT checkpoint the drafter serves, with --target-spec)")
    hf, config = read_hf(a.src)
    if a.kind == "target":
        from lantern.engine.checkpoint import parse_spec, target_args

        sd = target_state_dict(hf)
        stated = {**config_spec(config, sd), **read_structured(a.target_spec, "--target-spec")}  # the user's spec has the last word
        args = target_args({}, sd, parse_spec(stated), a.src)
        check_target(sd, args)
        save_torch({"model": sd}, a.out)
        spec = json.dumps(printable_spec(args))
        print(f"target {a.src} -> {a.out} ({len(sd)} tensors); load it with --target-spec '{spec}'")
        return
    from lantern.engine.checkpoint import load_gpt
    from lantern.engine.drafter import save_drafter

    spec = {"spec": read_structured(a.target_spec, "--target-spec")} if a.target_spec else {}
    target = load_gpt(a.target, **spec)
    drafter = convert_drafter(hf, config, target)
    save_drafter(a.out, drafter, converted_from=str(a.src), target=str(a.target))
    print(f"drafter {a.src} -> {a.out} (own embedding, norm eps {drafter.options.norm_eps}, code-0 condition inputs)")
