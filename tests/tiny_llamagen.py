"""Tiny LlamaGen stand-ins for the Python API, `lantern generate` and docs/python.md tests: an upstream-style c2i GPT
object (tests/upstream_llamagen.py) with random weights, and its files in the upstream layouts: the GPT as
{"model": state_dict} with no config, a 64-code VQ, a drafter of this project for the GPT, and the LANTERN authors'
drafter layout (config.json + pytorch_model.bin)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from torch import nn

from lantern.engine.models.vq import VQArgs, VQModel
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
    from lantern.engine.models.checkpoint import save_checkpoint
    from lantern.worlds.llamagen.upstream import load_gpt
    from lantern.engine.models.drafter import Drafter, save_drafter
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


class UpstreamVQ(nn.Module):
    """An object lantern does not know with upstream VQModel's attribute layout (encoder, decoder, quantize,
    quant_conv, post_quant_conv), holding a VQ's modules: lantern must read its config from its tensors."""

    def __init__(self, vq: VQModel):
        super().__init__()
        self.encoder, self.decoder, self.quantize = vq.encoder, vq.decoder, vq.quantize
        self.quant_conv, self.post_quant_conv = vq.quant_conv, vq.post_quant_conv


def released_like_gpt() -> Transformer:
    """An upstream-style GPT of the released c2i files' vocabulary, classes and token grid (16384 codes, 1000
    classes and the null row, 16 x 16 tokens, feed-forward rounded to 256) at the small width SIZE."""
    return upstream_gpt(seed=3, vocab_size=16384, num_classes=1000, block_size=256, multiple_of=256)


def released_like_vq() -> VQModel:
    """The VQ-16 layout (five levels, codebook 16384 x 8) at small channel widths (tests/llamagen_world.py's)."""
    from llamagen_world import VQ_ARGS

    torch.manual_seed(4)
    return VQModel(VQ_ARGS).eval()


def write_released_like(root: Path) -> dict[str, str]:
    """Stand-ins for the released files docs/python.md names: the GPT as upstream ships it ({"model": state_dict},
    no config), the VQ (its small widths as an `args` entry), a drafter of this project for the GPT, and the
    LANTERN authors' drafter layout."""
    from lantern.engine.models.checkpoint import save_checkpoint
    from lantern.worlds.llamagen.upstream import load_gpt
    from lantern.engine.models.drafter import Drafter, save_drafter
    from llamagen_world import VQ_ARGS, write_authors_drafter

    root.mkdir(parents=True, exist_ok=True)
    torch.save({"model": released_like_gpt().state_dict()}, root / "c2i_tiny_256.pt")
    save_checkpoint(root / "vq_ds16_tiny.pt", released_like_vq(), args=dataclasses.asdict(VQ_ARGS))
    target = load_gpt(root / "c2i_tiny_256.pt", spec={"gpt_size": SIZE})
    torch.manual_seed(5)
    save_drafter(root / "drafter_tiny.pt", Drafter.from_target(target))
    write_authors_drafter(root / "authors_drafter", str(root / "c2i_tiny_256.pt"))
    return {"gpt_ckpt": str(root / "c2i_tiny_256.pt"), "vq_ckpt": str(root / "vq_ds16_tiny.pt"),
            "drafter_ckpt": str(root / "drafter_tiny.pt"), "authors_drafter": str(root / "authors_drafter")}
