"""Every released layout the worlds read, by name, each with its one reader.

A reader lives under its world's folder and returns (spec, state dict): the model's config and its tensors in the
engine's key names, every key and shape checked, errors one line naming the file (or flag) and the key. The engine
then builds the model in one place (`engine/models/checkpoint.build`; drafters: `drafter.build_drafter`).
Chameleon's HF folders are sharded and keep HF key names: their readers return (spec, state dict, key -> file),
and the engine's `chameleon_load` checks every key and shape (naming the shard) as it builds; the taming VQGAN's
builder is `vqgan.build_vqgan`.
`lantern.api`, the `lantern` CLI and the pipeline's config check read released files only through these readers;
`tests/test_layouts.py` holds every module to that. A new family adds its layouts here (docs/development.md,
"Add a model family").
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Layout:
    reader: str  # "lantern.worlds.<family>.<module>:<function>"
    builds: str  # the engine class the returned spec and state dict make
    files: str  # what the layout is, as released


LAYOUTS = {
    "llamagen-gpt": Layout("lantern.worlds.llamagen.upstream:read_gpt", "GPT",
                           "upstream LlamaGen's GPT .pt (c2i_*.pt, t2i_*.pt), or this project's (its args inside)"),
    "llamagen-vq": Layout("lantern.worlds.llamagen.upstream:read_vq", "VQModel",
                          "upstream LlamaGen's VQ .pt (vq_ds16_*.pt, vq_ds8_*.pt), or this project's"),
    "llamagen-gpt-object": Layout("lantern.worlds.llamagen.upstream:read_gpt_object", "GPT",
                                  "upstream LlamaGen's Transformer object in memory, or a lantern GPT"),
    "llamagen-vq-object": Layout("lantern.worlds.llamagen.upstream:read_vq_object", "VQModel",
                                 "upstream LlamaGen's VQModel object in memory"),
    "lantern-authors-target": Layout("lantern.worlds.llamagen.hf:read_authors_target", "GPT",
                                     "the LANTERN authors' HF-format LlamaGen target folder (config.json + weights)"),
    "lantern-authors-drafter": Layout("lantern.worlds.llamagen.hf:read_authors_drafter", "Drafter",
                                      "the LANTERN authors' HF-format LlamaGen drafter folder (config.json + weights)"),
    "chameleon-target": Layout("lantern.worlds.chameleon.hf:read_target_folder", "Chameleon",
                               "a Chameleon HF folder (Anole-7b-v0.1-hf, Lumina-mGPT-7B-768): config.json + "
                               "safetensors shards and their index, or one model.safetensors"),
    "chameleon-authors-drafter": Layout("lantern.worlds.chameleon.hf:read_drafter_folder", "ChameleonDrafter",
                                        "the LANTERN authors' Chameleon drafter folder (jadohu/anole_drafter, "
                                        "sihwanpark/LANTERN-Lumina-mGPT-7B-768): config.json + weights"),
    "chameleon-vqgan": Layout("lantern.worlds.chameleon.vqgan:read_vqgan", "VQGAN",
                              "Chameleon's taming VQGAN: tokenizer/vqgan.ckpt (Lightning) + tokenizer/vqgan.yaml"),
}


def reader(name: str) -> Callable:
    """The reader function of layout `name`."""
    module, function = LAYOUTS[name].reader.split(":")
    return getattr(importlib.import_module(module), function)
