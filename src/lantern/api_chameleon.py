"""`lantern.load_chameleon`: a Chameleon-family world (Anole, Lumina-mGPT) from its released files, for
`lantern.generate` with prompts as text.

    world = lantern.load_chameleon("lumina-mgpt", target="Lumina-mGPT-7B-768", vqgan_ckpt="tokenizer/vqgan.ckpt",
                                   tokenizer="Lumina-mGPT-7B-768/tokenizer.json", device="cuda", dtype="bf16")
    out = lantern.generate(world, ["a red apple"], "lantern", delta=0.1, k=1000, drafting="jacobi")

Every file is read through its registered reader (worlds/layouts.py); every missing one is named, one line each,
before any weight is read. The world's layout is the family's (engine/models/layout.py): Anole, a grid of codes;
Lumina-mGPT, rows ended by eol and the grid by eoi, forced (docs/chameleon-layout.md). Its sampling defaults are the
authors' (CFG 3, top-k 2000); its pixels are the VQGAN's, truncated to uint8 as the authors do.
"""

from __future__ import annotations

from pathlib import Path

import torch

from lantern.api import World, _placement
from lantern.errors import UserError

AUTHORS_SAMPLING = {"cfg_scale": 3.0, "top_k": 2000}  # reference chameleon-targets.md section 3: both families
DEFAULT_PIXELS = {"anole": 512, "lumina-mgpt": 768}  # Anole-7b-v0.1: 32 x 32 codes; Lumina-mGPT-7B-768
PATCH = 16  # the VQGAN's stride: a grid side is pixels / 16


def _missing(family: str, target, drafter, vqgan_ckpt, vqgan_yaml, tokenizer) -> list[str]:
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


def _layout(family: str, pixels: int):
    from lantern.engine.models.layout import Layout, head_layout, lumina_layout

    if isinstance(pixels, bool) or not isinstance(pixels, int) or pixels < PATCH or pixels % PATCH:
        raise UserError(f"pixels = {pixels!r} must be a positive multiple of {PATCH} (the VQGAN's stride)")
    if family == "anole":
        return None, (), pixels // PATCH  # codes only: the decoders run it as LlamaGen's grid
    layout, extra = head_layout(lumina_layout(pixels))
    return layout, extra, pixels // PATCH


def load_chameleon(family: str, target, vqgan_ckpt, tokenizer, drafter=None, vqgan_yaml=None,
                   pixels: int | None = None, prompt_tokens: int = 128, neighbours_k: int | None = None,
                   device: str = "auto", dtype: str = "bf16") -> World:
    """A Chameleon-family world. family: anole or lumina-mgpt. target: the released HF folder (Anole-7b-v0.1-hf,
    Lumina-mGPT-7B-768; safetensors shards). vqgan_ckpt / vqgan_yaml: the model's tokenizer/vqgan.ckpt and
    vqgan.yaml (default: beside the checkpoint). tokenizer: tokenizer.json (or a folder holding it / Meta's
    text_tokenizer.json). drafter: the LANTERN authors' drafter folder (jadohu/anole_drafter,
    sihwanpark/LANTERN-Lumina-mGPT-7B-768); without it only plain AR and Jacobi drafting run. pixels: the image
    side (Anole 512, Lumina-mGPT 768 by default). prompt_tokens: the prompt slots (prompts are left-padded to it; a
    longer one is refused). neighbours_k: the neighbour table's width (default 200), built from the codebook on
    first use. Returns a `World` whose conditions are prompts as text."""
    from lantern.engine.models.vqgan import build_vqgan
    from lantern.worlds.chameleon import prompts as cp
    from lantern.worlds.chameleon.hf import load_drafter, load_target
    from lantern.worlds.chameleon.tokenizer import IMAGE_OFFSET, load_vocab
    from lantern.worlds.chameleon.vqgan import decode_codes, default_yaml, read_vqgan

    if family not in cp.FAMILIES:
        raise UserError(f"family {family!r} is not a Chameleon family; use one of {', '.join(cp.FAMILIES)}")
    vqgan_yaml = vqgan_yaml if vqgan_yaml is not None else default_yaml(vqgan_ckpt)
    missing = _missing(family, target, drafter, vqgan_ckpt, vqgan_yaml, tokenizer)
    if missing:
        raise UserError("; ".join(missing))
    pixels = DEFAULT_PIXELS[family] if pixels is None else pixels
    layout, extra, side = _layout(family, pixels)
    if isinstance(prompt_tokens, bool) or not isinstance(prompt_tokens, int) or prompt_tokens < 4:
        raise UserError(f"prompt_tokens = {prompt_tokens!r} must be an integer >= 4 (the prompt slots)")
    where = _placement(device, dtype)
    tok, vocab = load_vocab(tokenizer)  # checked: code c at id c + 4, the structural ids the authors hard-code
    null = cp.uncond_ids(family, vocab, tok, pixels)
    spec, sd = read_vqgan(vqgan_ckpt, vqgan_yaml)
    if spec.n_embed != vocab.num_codes:
        raise UserError(f"vqgan: {vqgan_yaml} has {spec.n_embed} codes but tokenizer {tokenizer} names "
                        f"{vocab.num_codes} image tokens; give the model's own tokenizer folder")
    vq = build_vqgan(spec, sd, vqgan_ckpt, vqgan_yaml, where).eval()
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

    def to_pixels(codes):  # codes [1, N] -> uint8 [1, H, W, 3]
        return decode_codes(vq, codes.reshape(codes.shape[0], side, side)).cpu().numpy()

    return World(family, model, vq, agent, max_k=neighbours_k, layout=layout, prompts=prompts, pixels=to_pixels,
                 sampling=AUTHORS_SAMPLING)
