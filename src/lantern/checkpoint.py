"""Checkpoint I/O in the upstream LlamaGen containers, with strict, readable key checking.

Upstream files are {"model": state_dict} (B / L / XL and the VQ), or the raw consolidated state dict (XXL, 3B);
some trainers wrap it as "module" or "state_dict". Our own files add an "args" entry holding the model config,
like upstream training checkpoints do, so they load without naming a size.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path

import torch
from torch import nn

from .errors import UserError
from .io import save_torch

CONTAINERS = ("model", "module", "state_dict")
# Present in some upstream files, never part of our modules.
IGNORABLE = ("freqs_cis", "causal_mask", "kv_cache")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def parse_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise UserError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}")
    return DTYPES[name]


def parse_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device {name!r} requested but CUDA is not available here; set device: cpu (or auto)")
    return torch.device(name)


def read_checkpoint(path: str | os.PathLike) -> dict:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint {path} does not exist; check the path in your config or build it first")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, OSError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"checkpoint {path} is unreadable (truncated or not a torch file): {first}") from None
    if not isinstance(obj, dict):
        raise UserError(f"checkpoint {path} holds a {type(obj).__name__}, not a state dict or a container of one")
    return obj


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


def _short(keys) -> str:
    keys = sorted(keys)
    return ", ".join(keys[:6]) + (f" (+{len(keys) - 6} more)" if len(keys) > 6 else "")


def load_weights(model: nn.Module, state_dict: dict[str, torch.Tensor], path: str | os.PathLike = "<checkpoint>"):
    """Strict load: every missing or unexpected key, or wrong shape, is one clear error naming them."""
    sd = {k: v for k, v in state_dict.items() if not any(tag in k for tag in IGNORABLE)}
    expected = model.state_dict()
    missing, unexpected = set(expected) - set(sd), set(sd) - set(expected)
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} keys: {_short(missing)}")
        if unexpected:
            parts.append(f"unexpected {len(unexpected)} keys: {_short(unexpected)}")
        raise UserError(
            f"checkpoint {path} does not match the model ({'; '.join(parts)}); "
            "check the model size / config it was trained with"
        )
    wrong = [f"{k} {tuple(sd[k].shape)} vs {tuple(v.shape)}" for k, v in expected.items() if sd[k].shape != v.shape]
    if wrong:
        raise UserError(f"checkpoint {path} has {len(wrong)} tensors of the wrong shape (file vs model): {_short(wrong)}")
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


def load_gpt(path: str | os.PathLike, args=None, dtype: str = "fp32", device: str = "cpu"):
    """Load a LlamaGen GPT. `args` (ModelArgs) is required for upstream files, which carry no config."""
    from .model import GPT, ModelArgs

    obj = read_checkpoint(path)
    if args is None:
        if not isinstance(obj.get("args"), dict):
            raise UserError(f"checkpoint {path} carries no model config: give the model size / args in the config")
        try:
            args = ModelArgs(**obj["args"])
        except TypeError as e:
            raise UserError(f"checkpoint {path} has an unusable model config: {e}") from None
    with torch.device("meta"):
        model = GPT(args)
    model = model.to_empty(device="cpu")
    load_weights(model, extract_state_dict(obj, path), path)
    return model.to(device=parse_device(device), dtype=parse_dtype(dtype)).eval()
