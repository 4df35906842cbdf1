"""Checkpoint I/O in the upstream LlamaGen containers, with strict, readable key checking, and `build`, the one place
a model is made from what a layout's reader returns (the readers: lantern.worlds.<family>, e.g. llamagen/upstream.py).

Upstream files are {"model": state_dict} (B / L / XL and the VQ), or the raw consolidated state dict (XXL, 3B);
some trainers wrap it as "module" or "state_dict". Our own files add an "args" entry holding the model config,
like upstream training checkpoints do, so they load without naming a size. Upstream files carry no config: the model
is built from a target spec (the llamagen world's config as data) plus the shapes the file shows, and any
disagreement between the two is one line naming the llamagen key to change.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from lantern.errors import UserError
from lantern.io import load_torch, save_torch
from lantern.engine.models.model import GPT_SIZES, UPSTREAM_CAPTION_TOKENS, ModelArgs, find_multiple
from lantern.params import check_device_name

CONTAINERS = ("model", "module", "state_dict")
# Present in some upstream files, never part of our modules.
IGNORABLE = ("freqs_cis", "causal_mask", "kv_cache")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def parse_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise UserError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}")
    return DTYPES[name]


def parse_device(name: str) -> torch.device:
    check_device_name(name, "--device")  # before torch, which accepts devices the decoders do not run on
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError, TypeError):
        raise UserError(f"device {name!r} is not a device; use auto, cpu, cuda or cuda:<index>") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device {name!r} requested but CUDA is not available here; set device: cpu (or auto)")
    assigned = os.environ.get("LANTERN_GPU_RUN_DEVICE")
    if device.type == "cuda" and device.index is not None and assigned is not None and torch.cuda.device_count() == 1:
        # lantern-gpu-run chose this job's GPU and left only it visible: cuda:N names that one, as cuda:0
        if device.index != 0:
            print(f"device {name}: lantern-gpu-run gave this job GPU {assigned} (its only visible device); "
                  "using it as cuda:0", file=sys.stderr, flush=True)
        return torch.device("cuda", 0)
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise UserError(f"device {name!r} does not exist: this machine has {torch.cuda.device_count()} CUDA "
                        "device(s); use cuda (or auto)")
    return device


def read_checkpoint(path: str | os.PathLike) -> dict:
    return load_torch(path, "checkpoint")


def extract_state_dict(obj: dict, path: str | os.PathLike = "<checkpoint>") -> dict[str, torch.Tensor]:
    if obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        return obj  # raw consolidated state dict (XXL / 3B, FSDP)
    for key in CONTAINERS:
        if isinstance(obj.get(key), dict):
            return obj[key]
    raise UserError(
        f"checkpoint {path} has no state dict: expected a raw state dict or one of the keys "
        f"{', '.join(CONTAINERS)}; found keys {', '.join(map(str, list(obj)[:8]))}"
    )


DRAFTER_FORMAT = "lantern-drafter-v1"  # the format tag of a drafter file (drafter.save_drafter)

# What each kind of file is given as, for the line that names a file of another kind.
KIND_FLAGS = {"VQ tokenizer": "llamagen.vq_ckpt / --vq", "LlamaGen GPT": "llamagen.gpt_ckpt / --target",
              "drafter": "llamagen.drafter_ckpt / --drafter"}


def checkpoint_kind(obj: dict) -> str | None:
    """Which of the project's kinds of torch file `obj` holds (a VQ tokenizer, a LlamaGen GPT, a drafter), read from
    its format tag or its tensor names; None when it is none of them."""
    if obj.get("format") == DRAFTER_FORMAT:
        return "drafter"
    sd = obj if obj and all(isinstance(v, torch.Tensor) for v in obj.values()) else next(
        (obj[k] for k in CONTAINERS if isinstance(obj.get(k), dict)), {})
    if "quantize.embedding.weight" in sd:
        return "VQ tokenizer"
    if "tok_embeddings.weight" in sd:
        return "LlamaGen GPT"
    return None


def wrong_kind(obj: dict, path, want: str) -> UserError | None:
    """The one line for a file of another kind where a `want` belongs, e.g. the VQ given as the GPT."""
    kind = checkpoint_kind(obj)
    if kind is None or kind == want:
        return None
    return UserError(f"checkpoint {path} is a {kind}, not a {want}; give it as {KIND_FLAGS[kind]} and the "
                     f"{want} as {KIND_FLAGS[want]}")


def short_list(keys) -> str:
    keys = sorted(keys)
    return ", ".join(keys[:6]) + (f" (+{len(keys) - 6} more)" if len(keys) > 6 else "")


class no_init(TorchFunctionMode):
    """Build a model whose weights a checkpoint is about to overwrite: parameters are allocated, never initialised
    (nn.init's random fills and tensors' normal_ / uniform_ return their input). Cheaper than the meta device here:
    the first meta-device op imports torch._dynamo (~2.5 s in every job that loads a model)."""

    SKIP = {"normal_", "uniform_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_",
            "xavier_normal_"}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in self.SKIP:
            return args[0] if args else kwargs["tensor"]
        return func(*args, **(kwargs or {}))


def load_weights(model: nn.Module, state_dict: dict[str, torch.Tensor], path: str | os.PathLike = "<checkpoint>"):
    """Strict load: every missing or unexpected key, or wrong shape, is one clear error naming them."""
    sd = {k: v for k, v in state_dict.items() if not any(tag in k for tag in IGNORABLE)}
    expected = model.state_dict()
    missing, unexpected = set(expected) - set(sd), set(sd) - set(expected)
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} keys: {short_list(missing)}")
        if unexpected:
            parts.append(f"unexpected {len(unexpected)} keys: {short_list(unexpected)}")
        raise UserError(
            f"checkpoint {path} does not match the model ({'; '.join(parts)}); "
            "check the model size / config it was trained with"
        )
    wrong = [f"{k} {tuple(sd[k].shape)} vs {tuple(v.shape)}" for k, v in expected.items() if sd[k].shape != v.shape]
    if wrong:
        raise UserError(f"checkpoint {path} has {len(wrong)} tensors of the wrong shape (file vs model): {short_list(wrong)}")
    model.load_state_dict(sd, strict=True)
    return model


def save_checkpoint(path: str | os.PathLike, model: nn.Module, container: str = "model", **extra) -> None:
    """Write atomically in an upstream container ("model", "module", "state_dict" or "raw"), plus `extra` entries."""
    sd = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if container == "raw":
        if extra:
            raise ValueError("a raw state dict cannot carry extra entries")
        obj = sd
    elif container in CONTAINERS:
        obj = {container: sd, **extra}
    else:
        raise ValueError(f"unknown container {container!r}")
    save_torch(obj, path)


# -- target spec: the llamagen world's model config, checked against what a checkpoint holds -------------------
SPEC_KEYS = ("model_type", "gpt_size", "image_tokens", "cls_token_num", "num_classes")
# Upstream defaults for what the weights cannot tell: ImageNet classes, 256 px with VQ-16.
UPSTREAM_NUM_CLASSES = 1000
UPSTREAM_IMAGE_TOKENS = 256


@dataclass(frozen=True)
class Found:
    """What a checkpoint says about its model: its embedded args (from_args), or its tensor shapes, which do not show
    n_head, num_classes or image_tokens."""

    model_type: str
    dim: int
    n_layer: int
    cond_rows: int  # c2i: class-table rows (classes plus any null row); t2i: uncond_embedding rows
    vocab_size: int
    caption_dim: int | None
    multiple_of: int
    n_head: int | None = None
    num_classes: int | None = None
    image_tokens: int | None = None
    from_args: bool = False


def _size_name(dim: int, n_layer: int) -> str | None:
    return next((name for name, s in GPT_SIZES.items() if (s["dim"], s["n_layer"]) == (dim, n_layer)), None)


def _size_text(dim: int, n_layer: int, n_head: int | None = None) -> str:
    name = _size_name(dim, n_layer)
    heads = f", {n_head} heads" if n_head else ""
    return f"{n_layer} layers of width {dim}{heads} ({name or 'no named LlamaGen size'})"


def _parse_size(size) -> dict:
    names = ", ".join(GPT_SIZES)
    if isinstance(size, str):
        if size not in GPT_SIZES:
            raise UserError(f"llamagen.gpt_size = {size!r} is not a LlamaGen size; "
                            f"set one of {names} or {{dim, n_layer, n_head}}")
        return {"text": size, **GPT_SIZES[size]}
    keys = ("dim", "n_layer", "n_head")
    if not (isinstance(size, dict) and set(size) == set(keys)
            and all(isinstance(size[k], int) and not isinstance(size[k], bool) and size[k] > 0 for k in keys)):
        raise UserError(f"llamagen.gpt_size = {size!r} must be one of {names} "
                        "or {dim, n_layer, n_head} positive integers")
    if size["dim"] % size["n_head"] or (size["dim"] // size["n_head"]) % 4:
        raise UserError(f"llamagen.gpt_size: dim {size['dim']} does not split into n_head {size['n_head']} heads of a "
                        "size divisible by 4; fix llamagen.gpt_size.n_head")
    return {"text": "{" + ", ".join(f"{k}: {size[k]}" for k in keys) + "}", **{k: size[k] for k in keys}}


def parse_spec(spec: dict | None) -> dict:
    """Validate a target spec (keys of SPEC_KEYS, all optional; None values count as absent).

    gpt_size is a name of model.GPT_SIZES or {dim, n_layer, n_head}; it comes back as {text, dim, n_layer, n_head}.
    """
    spec = {k: v for k, v in (spec or {}).items() if v is not None}
    unknown = sorted(set(spec) - set(SPEC_KEYS))
    if unknown:
        raise UserError(f"target spec has unknown keys {', '.join(unknown)}; it holds only {', '.join(SPEC_KEYS)}")
    if spec.get("model_type", "c2i") not in ("c2i", "t2i"):
        raise UserError(f"llamagen.model_type = {spec['model_type']!r} is not a model type; "
                        "set llamagen.model_type: c2i or t2i")
    if "gpt_size" in spec:
        spec["gpt_size"] = _parse_size(spec["gpt_size"])
    for key in ("image_tokens", "cls_token_num", "num_classes"):
        v = spec.get(key, 1)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UserError(f"llamagen.{key} = {v!r} must be a positive integer")
    n = spec.get("image_tokens", UPSTREAM_IMAGE_TOKENS)
    if math.isqrt(n) ** 2 != n:
        raise UserError(f"llamagen.image_tokens = {n} is not a square token grid; "
                        "set it to e.g. 256 (256 px with VQ-16)")
    if spec.get("model_type") == "c2i":
        _one_condition_token(spec)
    return spec


def _one_condition_token(spec: dict) -> None:
    if spec.get("cls_token_num", 1) != 1:
        raise UserError(f"llamagen.cls_token_num = {spec['cls_token_num']}, but a c2i model has one condition token; "
                        "set llamagen.cls_token_num: 1 (or leave it out)")


def _multiple_of(dim: int, ffn: int, path) -> int:
    """The SwiGLU rounding that gives this feed-forward width (upstream: 256; small test models use less)."""
    hidden = int(2 * 4 * dim / 3)
    for m in (256, 128, 64, 32, 16, 8, 4, 2, 1):
        if find_multiple(hidden, m) == ffn:
            return m
    raise UserError(f"checkpoint {path} has a feed-forward width {ffn} for dim {dim}, not LlamaGen's (8/3 dim rounded "
                    "up); it is not a LlamaGen GPT")


def read_shapes(sd: dict[str, torch.Tensor], path) -> Found:
    """What the tensors of an upstream file (no config inside) say about its model."""
    def shape(key):
        return tuple(sd[key].shape) if key in sd else None

    if shape("tok_embeddings.weight") is None and shape("model.embed_tokens.weight") is not None:
        raise UserError(f"checkpoint {path} is the LANTERN authors' HF-format LlamaGen (model.embed_tokens.weight), "
                        "not upstream's; give its folder as llamagen.gpt_ckpt (the convert_target rule converts it) "
                        "or run `lantern convert --kind target --src <its folder> --out <file.pt>`")
    if shape("tok_embeddings.weight") is None:
        raise UserError(f"checkpoint {path} is not a LlamaGen GPT: it has no tok_embeddings.weight "
                        f"(keys: {short_list(sd)})")
    vocab_size, dim = shape("tok_embeddings.weight")
    layers = {int(k.split(".")[1]) for k in sd if k.startswith("layers.") and k.split(".")[1].isdigit()}
    if not layers or shape("layers.0.feed_forward.w1.weight") is None:
        raise UserError(f"checkpoint {path} is not a LlamaGen GPT: it has no layers.0.feed_forward.w1.weight")
    multiple_of = _multiple_of(dim, shape("layers.0.feed_forward.w1.weight")[0], path)
    table, fc1 = shape("cls_embedding.embedding_table.weight"), shape("cls_embedding.cap_proj.fc1.weight")
    uncond = shape("cls_embedding.uncond_embedding")
    common = dict(dim=dim, n_layer=max(layers) + 1, vocab_size=vocab_size, multiple_of=multiple_of)
    if table is not None and fc1 is None:
        return Found(model_type="c2i", cond_rows=table[0], caption_dim=None, **common)
    if fc1 is not None and uncond is not None and table is None:
        return Found(model_type="t2i", cond_rows=uncond[0], caption_dim=fc1[1], **common)
    raise UserError(f"checkpoint {path} has neither only a class table (cls_embedding.embedding_table, c2i) nor only a "
                    "caption projection with uncond_embedding (cls_embedding.cap_proj, t2i); it is not a LlamaGen GPT")


def _found_in_args(args) -> Found:
    rows = args.num_classes + int(args.null_class) if args.model_type == "c2i" else args.cls_token_num
    return Found(model_type=args.model_type, dim=args.dim, n_layer=args.n_layer, cond_rows=rows,
                 vocab_size=args.vocab_size, caption_dim=args.caption_dim, multiple_of=args.multiple_of,
                 n_head=args.n_head, num_classes=args.num_classes, image_tokens=args.image_tokens, from_args=True)


def resolve_spec(spec: dict, found: Found, path) -> dict:
    """The model config where a parsed spec and a checkpoint agree; any disagreement is one line naming the key.

    Spec keys left out take the checkpoint's value, or upstream's default where the weights cannot show it.
    """
    where = f"checkpoint {path}"
    model_type = spec.get("model_type", found.model_type)
    if model_type != found.model_type:
        holds = "a class table" if found.model_type == "c2i" else "a caption projection"
        raise UserError(f"{where} is a {found.model_type} model (it has {holds}), but llamagen.model_type = "
                        f"{model_type}; set llamagen.model_type: {found.model_type}")
    size = spec.get("gpt_size")
    if size is not None:
        if (size["dim"], size["n_layer"]) != (found.dim, found.n_layer) or found.n_head not in (None, size["n_head"]):
            name = _size_name(found.dim, found.n_layer)
            named = name is not None and found.n_head in (None, GPT_SIZES[name]["n_head"])
            heads = found.n_head or "<heads>"
            fix = name if named else f"{{dim: {found.dim}, n_layer: {found.n_layer}, n_head: {heads}}}"
            raise UserError(f"{where} has {_size_text(found.dim, found.n_layer, found.n_head)}, "
                            f"but llamagen.gpt_size = {size['text']}; set llamagen.gpt_size: {fix}")
        n_head = size["n_head"]
    else:
        n_head = found.n_head or GPT_SIZES.get(_size_name(found.dim, found.n_layer), {}).get("n_head")
        if n_head is None:
            raise UserError(f"{where} has {_size_text(found.dim, found.n_layer)} and its head count is not in the "
                            f"weights; set llamagen.gpt_size: {{dim: {found.dim}, n_layer: {found.n_layer}, "
                            "n_head: <heads>}")
    out = dict(model_type=model_type, dim=found.dim, n_layer=found.n_layer, n_head=n_head)
    if model_type == "c2i":
        _one_condition_token(spec)
        out.update(cls_token_num=1, **_classes(spec, found, where))
    else:
        tokens = spec.get("cls_token_num", found.cond_rows if found.from_args else UPSTREAM_CAPTION_TOKENS)
        if tokens != found.cond_rows:
            note = "" if "cls_token_num" in spec else " (the default)"
            raise UserError(f"{where} has {found.cond_rows} caption positions (uncond_embedding rows), but "
                            f"llamagen.cls_token_num = {tokens}{note}; set llamagen.cls_token_num: {found.cond_rows}")
        out.update(cls_token_num=tokens)
    image_tokens = spec.get("image_tokens", found.image_tokens or UPSTREAM_IMAGE_TOKENS)
    if found.image_tokens not in (None, image_tokens):
        raise UserError(f"{where} was trained for {found.image_tokens} image tokens, but llamagen.image_tokens = "
                        f"{image_tokens}; set the image size it was trained for")
    return dict(out, image_tokens=image_tokens)


def _classes(spec: dict, found: Found, where: str) -> dict:
    """num_classes and whether the class table ends in the CFG null row (upstream: only if trained with dropout)."""
    rows = found.cond_rows
    if found.from_args:  # they name the classes
        classes = spec.get("num_classes", found.num_classes)
        if classes != found.num_classes:
            raise UserError(f"{where} has {found.num_classes} classes, but llamagen.num_classes = {classes}; "
                            f"set llamagen.num_classes: {found.num_classes}")
    else:
        classes = spec.get("num_classes", UPSTREAM_NUM_CLASSES)
        if rows not in (classes, classes + 1):
            note = "" if "num_classes" in spec else " (the default)"
            raise UserError(f"{where} has a class table of {rows} rows, but llamagen.num_classes = {classes}{note}; "
                            f"set llamagen.num_classes: {rows - 1} (if its last row is the CFG null class) "
                            f"or {rows} (if not)")
    null = rows == classes + 1
    return dict(num_classes=classes, null_class=null, class_dropout_prob=0.1 if null else 0.0)


def target_args(obj: dict, sd: dict[str, torch.Tensor], spec: dict, path):
    """ModelArgs for a checkpoint: its embedded args (ours), or the parsed spec plus its tensor shapes (upstream)."""
    error = wrong_kind(obj, path, "LlamaGen GPT")
    if error:
        raise error
    saved = obj.get("args")
    if isinstance(saved, dict):
        try:
            args = ModelArgs(**saved)
        except TypeError as e:
            raise UserError(f"checkpoint {path} has an unusable model config: {e}") from None
        resolve_spec(spec, _found_in_args(args), path)
        return args
    found = read_shapes(sd, path)
    resolved = resolve_spec(spec, found, path)
    extra = {} if found.caption_dim is None else {"caption_dim": found.caption_dim}
    return ModelArgs(vocab_size=found.vocab_size, multiple_of=found.multiple_of, **extra, **resolved)


def build(make, args, sd: dict[str, torch.Tensor], path, dtype: str | None = "fp32", device="cpu") -> nn.Module:
    """The one place a model is made from a reader's (spec, state dict): `make(args)` built without initialisation,
    every key and shape of `sd` checked against it (one line naming the file and the keys), then placed on `device`
    (a name or a torch.device) in `dtype` (None: as built) and put in eval mode. Every layout's reader ends here."""
    torch_dtype = None if dtype is None else parse_dtype(dtype)
    where = device if isinstance(device, torch.device) else parse_device(device)
    with no_init():
        model = make(args)
    load_weights(model, sd, path)
    return model.to(device=where, dtype=torch_dtype).eval()
