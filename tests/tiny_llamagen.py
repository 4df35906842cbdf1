"""Tiny LlamaGen stand-ins for the Python API, `lantern generate` and docs/python.md tests: an upstream-style c2i GPT
object (tests/upstream_llamagen.py) with random weights, and its files in the upstream layouts: the GPT as
{"model": state_dict} with no config, a 64-code VQ, a drafter of this project for the GPT, and the LANTERN authors'
drafter layout (config.json + pytorch_model.bin)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from lantern.engine.vq import VQArgs, VQModel
from upstream_llamagen import ModelArgs, Transformer

SIZE = {"dim": 64, "n_layer": 2, "n_head": 2}  # no named LlamaGen size: loading it names this as gpt_size
CLASSES, TOKENS = 4, 16  # 4 x 4 tokens: image_size 64 at downsample 16
TINY_VQ = VQArgs(codebook_size=64, codebook_embed_dim=4, ch=8, ch_mult=(1, 1), z_channels=8, enc_res_blocks=1,
                 dec_res_blocks=1, norm_groups=4)


def upstream_gpt(seed: int = 0, **kw) -> Transformer:
    """A small upstream-style c2i GPT with random weights (std 0.3: upstream's own init zeroes the output layer,
    which would make every logit equal)."""
    torch.manual_seed(seed)
    args = {**SIZE, "vocab_size": TINY_VQ.codebook_size, "num_classes": CLASSES, "block_size": TOKENS,
            "multiple_of": 32, **kw}
    model = Transformer(ModelArgs(**args)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model


def tiny_vq() -> VQModel:
    torch.manual_seed(1)
    return VQModel(TINY_VQ).eval()


def write_files(root: Path) -> dict[str, str]:
    """c2i_tiny.pt, vq_tiny.pt, drafter_tiny.pt and authors_drafter/ under root; their paths by llamagen key."""
    from lantern.engine.checkpoint import load_gpt, save_checkpoint
    from lantern.engine.drafter import Drafter, save_drafter
    from llamagen_world import write_authors_drafter

    root.mkdir(parents=True, exist_ok=True)
    torch.save({"model": upstream_gpt().state_dict()}, root / "c2i_tiny.pt")  # upstream: weights only
    save_checkpoint(root / "vq_tiny.pt", tiny_vq(), args=dataclasses.asdict(TINY_VQ))
    target = load_gpt(root / "c2i_tiny.pt", spec={"gpt_size": SIZE, "num_classes": CLASSES, "image_tokens": TOKENS})
    torch.manual_seed(2)
    save_drafter(root / "drafter_tiny.pt", Drafter.from_target(target))
    write_authors_drafter(root / "authors_drafter", str(root / "c2i_tiny.pt"))
    return {"gpt_ckpt": str(root / "c2i_tiny.pt"), "vq_ckpt": str(root / "vq_tiny.pt"),
            "drafter_ckpt": str(root / "drafter_tiny.pt"), "authors_drafter": str(root / "authors_drafter")}
