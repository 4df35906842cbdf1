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

from lantern.api import World, _placement
from lantern.worlds.chameleon.world import AUTHORS_SAMPLING, DEFAULT_PIXELS, PATCH  # noqa: F401 (public defaults)


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
    from lantern.worlds.chameleon.world import load_pieces

    where = _placement(device, dtype)
    p = load_pieces(family, target, vqgan_ckpt, tokenizer, where, dtype, drafter=drafter, vqgan_yaml=vqgan_yaml,
                    pixels=pixels, prompt_tokens=prompt_tokens)
    return World(family, p.target, p.vq, p.drafter, max_k=neighbours_k, layout=p.layout, prompts=p.prompts,
                 pixels=p.pixels, sampling=AUTHORS_SAMPLING)
