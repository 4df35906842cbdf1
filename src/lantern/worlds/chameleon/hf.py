"""Readers of the released Chameleon-family folders, unchanged: the HF target folders (Anole-7b-v0.1-hf,
Lumina-mGPT-7B-768: config.json, model-0000x-of-0000y.safetensors shards and model.safetensors.index.json, or one
model.safetensors) and the LANTERN authors' drafter folders (config.json + pytorch_model.bin, or model.safetensors).

Each reader returns what the folder says (the trunk's ChameleonArgs, the state dict under its own key names, each
key's file); the engine (engine/models/chameleon.py) checks every key and shape and builds the model, in one place.
The VQ inside the target checkpoints (model.vqmodel.*) is never read: the VQGAN is loaded from its own files.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from lantern.engine.models.chameleon import Chameleon, ChameleonArgs, ChameleonDrafter
from lantern.engine.models.chameleon_load import args_from_hf_config, chameleon_from_hf, drafter_from_authors
from lantern.engine.models.checkpoint import parse_device, parse_dtype
from lantern.errors import UserError
from lantern.io import load_torch

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
SKIPPED = ("model.vqmodel.",)


def read_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise UserError(f"{folder} has no config.json; give the released HF folder itself")
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{path} is not readable JSON ({str(e)[:80]})") from None
    if not isinstance(cfg, dict):
        raise UserError(f"{path} is not a JSON object")
    return cfg


def read_safetensors(files: dict[Path, list[str] | None], skip: tuple[str, ...] = ()) -> tuple[dict, dict]:
    """Tensors of each file (only `keys` when given, else all but those under `skip`): (state dict, key -> file)."""
    from safetensors import SafetensorError, safe_open

    sd, where = {}, {}
    for path, keys in files.items():
        if not path.is_file():
            raise UserError(f"{path} is missing (named by {INDEX}); download the whole folder")
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                present = set(f.keys())
                for key in keys if keys is not None else sorted(present):
                    if key.startswith(skip):
                        continue
                    if key not in present:
                        raise UserError(f"{path}: has no tensor {key}, which {INDEX} places there")
                    sd[key], where[key] = f.get_tensor(key), str(path)
        except (SafetensorError, OSError) as e:
            raise UserError(f"{path} is not a readable safetensors file ({str(e)[:80]})") from None
    return sd, where


def read_target_folder(folder, **layout) -> tuple[ChameleonArgs, dict[str, torch.Tensor], dict[str, str]]:
    """A released Chameleon HF folder: (ChameleonArgs from config.json plus `layout`, the HF-named state dict
    without model.vqmodel.*, each key's shard file)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"Chameleon checkpoint folder {folder} does not exist")
    args = args_from_hf_config(read_config(folder), folder, **layout)
    index = folder / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError):
            raise UserError(f"{index} has no weight_map; it is not a safetensors index") from None
        files: dict[Path, list[str]] = {}
        for key, name in weight_map.items():
            if not key.startswith(SKIPPED):
                files.setdefault(folder / name, []).append(key)
        sd, where = read_safetensors(files)
    elif (folder / SINGLE).is_file():
        sd, where = read_safetensors({folder / SINGLE: None}, skip=SKIPPED)
    else:
        raise UserError(f"{folder} has neither {INDEX} nor {SINGLE}; give the released HF folder (safetensors)")
    return args, sd, where


def load_target(folder, dtype: str = "bf16", device: str = "cpu", **layout) -> Chameleon:
    """The Chameleon target of a released HF folder, checked and built by the engine."""
    torch_dtype, torch_device = parse_dtype(dtype), parse_device(device)
    args, sd, where = read_target_folder(folder, **layout)
    return chameleon_from_hf(args, sd, folder, where, dtype=torch_dtype, device=torch_device)


def read_drafter_folder(folder) -> tuple[dict, dict[str, torch.Tensor], dict[str, str]]:
    """The authors' drafter folder: (its config.json, its state dict, key -> file). pytorch_model.bin first, as
    their loader, then model.safetensors."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"Chameleon drafter folder {folder} does not exist")
    cfg = read_config(folder)
    if (folder / "pytorch_model.bin").is_file():
        path = folder / "pytorch_model.bin"
        sd = load_torch(path, "drafter weights")
        if not all(isinstance(v, torch.Tensor) for v in sd.values()):
            raise UserError(f"{path} is not a state dict of tensors")
    elif (folder / SINGLE).is_file():
        path = folder / SINGLE
        sd, _ = read_safetensors({path: None})
    else:
        raise UserError(f"{folder} has neither pytorch_model.bin nor {SINGLE}; give the released drafter folder")
    return cfg, sd, {k: str(path) for k in sd}


def load_drafter(folder, target: Chameleon) -> ChameleonDrafter:
    """The authors' released Chameleon drafter for `target`: its config must describe the target's trunk with
    one layer, and its weights load strictly (engine: drafter_from_authors)."""
    cfg, sd, where = read_drafter_folder(folder)
    layers = cfg.get("num_hidden_layers")
    if layers != 1:
        raise UserError(f"{folder}/config.json: num_hidden_layers {layers}; the authors' drafter has one layer")
    if cfg.get("bias", True) is not True:
        raise UserError(f"{folder}/config.json: bias {cfg['bias']}; only the drafter with an fc bias is supported")
    mine = args_from_hf_config(dict(cfg, num_hidden_layers=target.args.n_layer), folder, **target.args.layout())
    for key in ("dim", "n_head", "ffn_dim", "text_vocab", "norm_eps", "rope_base"):
        if getattr(mine, key) != getattr(target.args, key):
            raise UserError(f"{folder}/config.json: {key} {getattr(mine, key)} differs from the target's "
                            f"{getattr(target.args, key)}; this drafter belongs to another model")
    return drafter_from_authors(sd, folder, target, where)
