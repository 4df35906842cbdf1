"""A Chameleon-family world's pieces from its released files (Anole, Lumina-mGPT): the one loading path of
`lantern.load_chameleon` and of `lantern sample` on such a world (pipeline/sample_chameleon.py).

Every file is read through its registered reader (worlds/layouts.py); every missing one is named, one line each,
before any weight is read. The layout is the family's (engine/models/layout.py): Anole, a grid of codes;
Lumina-mGPT, rows ended by eol and the grid by eoi, forced (docs/chameleon-layout.md). Pixels are the VQGAN's,
truncated to uint8 as the authors do. The caller places the models (device, dtype, deterministic kernels).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from lantern.errors import UserError

AUTHORS_SAMPLING = {"cfg_scale": 3.0, "top_k": 2000}  # reference chameleon-targets.md section 3: both families
DEFAULT_PIXELS = {"anole": 512, "lumina-mgpt": 768}  # Anole-7b-v0.1: 32 x 32 codes; Lumina-mGPT-7B-768
PATCH = 16  # the VQGAN's stride: a grid side is pixels / 16


@dataclass
class ChameleonPieces:
    """What a Chameleon world is made of: `target` (engine Chameleon), `vq` (the VQGAN), `drafter` (None without
    one), `layout` (None for Anole: codes only), `prompts` (captions -> (ids [B, T], mask [B, T], one dict per
    caption)), `pixels` (codes [B, N] -> uint8 [B, H, W, 3] on the CPU)."""

    family: str
    target: torch.nn.Module
    vq: torch.nn.Module
    drafter: torch.nn.Module | None
    layout: object
    prompts: Callable
    pixels: Callable


def missing_files(family: str, target, drafter, vqgan_ckpt, vqgan_yaml, tokenizer) -> list[str]:
    """One line per file or folder that is not there."""
    lines = []
    for key, path, folder in (("target", target, True), ("drafter", drafter, True), ("vqgan_ckpt", vqgan_ckpt, False),
                              ("vqgan_yaml", vqgan_yaml, False), ("tokenizer", tokenizer, None)):
        if path is None:
            continue
        p = Path(path)
        there = p.exists() if folder is None else p.is_dir() if folder else p.is_file()
        if not there:
            what = "folder" if folder else "file" if folder is False else "file or folder"
            lines.append(f"{family} {key}: {what} {p} does not exist")
    return lines


def family_layout(family: str, pixels: int):
    """(the layout in the head's space or None, the head's extra ids, the grid side) of a family at `pixels`."""
    from lantern.engine.models.layout import head_layout, lumina_layout

    if isinstance(pixels, bool) or not isinstance(pixels, int) or pixels < PATCH or pixels % PATCH:
        raise UserError(f"pixels = {pixels!r} must be a positive multiple of {PATCH} (the VQGAN's stride)")
    if family == "anole":
        return None, (), pixels // PATCH  # codes only: the decoders run it as LlamaGen's grid
    layout, extra = head_layout(lumina_layout(pixels))
    return layout, extra, pixels // PATCH


def load_vqgan(vqgan_ckpt, vqgan_yaml, where: torch.device) -> torch.nn.Module:
    """The VQGAN from vqgan.ckpt + vqgan.yaml (read through its reader, checked against the yaml) on `where`."""
    from lantern.engine.models.vqgan import build_vqgan
    from lantern.worlds.chameleon.vqgan import read_vqgan

    spec, sd = read_vqgan(vqgan_ckpt, vqgan_yaml)
    return build_vqgan(spec, sd, vqgan_ckpt, vqgan_yaml, where).eval()


def pixels_of(vq: torch.nn.Module, side: int) -> Callable:
    """codes [B, side * side] -> uint8 [B, H, W, 3] on the CPU: the VQGAN's decode truncated to uint8, as the
    authors do. The one way a Chameleon world's codes become pixels: lantern.generate, `lantern sample`'s PNGs, and
    the repair that redraws a damaged PNG from its tokens (vqgan_pixels)."""
    from lantern.worlds.chameleon.vqgan import decode_codes

    def to_pixels(codes):
        return decode_codes(vq, codes.reshape(codes.shape[0], side, side)).cpu().numpy()

    return to_pixels


def vqgan_pixels(family: str, vqgan_ckpt, vqgan_yaml=None, pixels: int | None = None,
                 where: torch.device = torch.device("cpu")) -> Callable:
    """pixels_of a world's VQGAN alone (no target, no tokenizer), from what a shard's manifest records of its world
    (`lantern sample --family`: family, --vq, --vqgan-yaml, --pixels; None: their defaults)."""
    from lantern.worlds.chameleon.vqgan import default_yaml

    _, _, side = family_layout(family, DEFAULT_PIXELS[family] if pixels is None else pixels)
    vq = load_vqgan(vqgan_ckpt, vqgan_yaml if vqgan_yaml is not None else default_yaml(vqgan_ckpt), where)
    return pixels_of(vq, side)


def load_pieces(family: str, target, vqgan_ckpt, tokenizer, where: torch.device, dtype: str, drafter=None,
                vqgan_yaml=None, pixels: int | None = None, prompt_tokens: int = 128) -> ChameleonPieces:
    """The world's pieces on device `where` in `dtype` (lantern.load_chameleon documents the arguments)."""
    from lantern.worlds.chameleon import prompts as cp
    from lantern.worlds.chameleon.hf import load_drafter, load_target
    from lantern.worlds.chameleon.tokenizer import IMAGE_OFFSET, load_vocab
    from lantern.worlds.chameleon.vqgan import default_yaml

    if family not in cp.FAMILIES:
        raise UserError(f"family {family!r} is not a Chameleon family; use one of {', '.join(cp.FAMILIES)}")
    vqgan_yaml = vqgan_yaml if vqgan_yaml is not None else default_yaml(vqgan_ckpt)
    missing = missing_files(family, target, drafter, vqgan_ckpt, vqgan_yaml, tokenizer)
    if missing:
        raise UserError("; ".join(missing))
    pixels = DEFAULT_PIXELS[family] if pixels is None else pixels
    layout, extra, side = family_layout(family, pixels)
    if isinstance(prompt_tokens, bool) or not isinstance(prompt_tokens, int) or prompt_tokens < 4:
        raise UserError(f"prompt_tokens = {prompt_tokens!r} must be an integer >= 4 (the prompt slots)")
    tok, vocab = load_vocab(tokenizer)  # checked: code c at id c + 4, the structural ids the authors hard-code
    null = cp.uncond_ids(family, vocab, tok, pixels)
    vq = load_vqgan(vqgan_ckpt, vqgan_yaml, where)
    if vq.spec.n_embed != vocab.num_codes:
        raise UserError(f"vqgan: {vqgan_yaml} has {vq.spec.n_embed} codes but tokenizer {tokenizer} names "
                        f"{vocab.num_codes} image tokens; give the model's own tokenizer folder")
    steps = side * side if layout is None else layout.steps
    model = load_target(target, dtype=dtype, device=str(where), cls_token_num=prompt_tokens, image_tokens=steps,
                        image_offset=IMAGE_OFFSET, image_codes=vocab.num_codes, extra_ids=extra,
                        pad_id=vocab.id("<pad>"), uncond_prompt=null)
    if vocab.size > model.args.text_vocab:
        raise UserError(f"tokenizer {tokenizer} names ids up to {vocab.size - 1}, beyond the {model.args.text_vocab} "
                        f"rows of {target}'s embedding; give the model's own tokenizer")
    agent = load_drafter(drafter, model) if drafter is not None else None
    pad = model.args.pad_id

    def prompts(conditions):
        if isinstance(conditions, str):
            conditions = [conditions]
        if not isinstance(conditions, (list, tuple)) or not conditions or \
                not all(isinstance(c, str) for c in conditions):
            raise UserError(f"a {family} world takes prompts as text: a non-empty list of strings")
        rows = [cp.prompt_ids(family, c, tok, vocab, pixels) for c in conditions]
        for c, r in zip(conditions, rows):
            if len(r) > prompt_tokens:
                raise UserError(f"prompt {c[:40]!r} is {len(r)} tokens, over the world's {prompt_tokens} prompt "
                                "slots; load it with a larger prompt_tokens")
        ids = torch.tensor([[pad] * (prompt_tokens - len(r)) + r for r in rows], device=model.output.weight.device)
        mask = torch.arange(prompt_tokens, device=ids.device)[None] >= \
            torch.tensor([prompt_tokens - len(r) for r in rows], device=ids.device)[:, None]
        return ids, mask, [{"caption": c} for c in conditions]

    return ChameleonPieces(family, model, vq, agent, layout, prompts, pixels_of(vq, side))
