"""`lantern sample --family anole|lumina-mgpt`: the job's world-specific part for a Chameleon-family target.

The world comes from the same loader as `lantern.load_chameleon` (worlds/chameleon/world.py): --target is the
released HF folder, --vq the VQGAN's vqgan.ckpt (--vqgan-yaml, default beside it), --tokenizer its tokenizer.json.
Image i is drawn for row i of --prompts (a prompt table from `lantern prompts`), its caption as text through the
family's template; its codes decode with the family's layout (Lumina-mGPT's forced tokens) and become pixels
through the VQGAN, uint8 by truncation. Everything else (batches, resume, digests, in-job plain AR, seeds from
(seed, i)) is `lantern sample`'s own.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from lantern.errors import UserError


def add_arguments(ap) -> None:
    ap.add_argument("--family", choices=["anole", "lumina-mgpt"], help="a Chameleon-family world: --target is its "
                    "HF folder, --vq its vqgan.ckpt, prompts come from --prompts")
    ap.add_argument("--tokenizer", help="Chameleon world: tokenizer.json (or Meta's text_tokenizer.json)")
    ap.add_argument("--vqgan-yaml", help="Chameleon world: vqgan.yaml (default: beside --vq)")
    ap.add_argument("--pixels", type=int, help="Chameleon world: image side (default: Anole 512, Lumina-mGPT 768)")
    ap.add_argument("--prompt-tokens", type=int, default=128, help="Chameleon world: prompt slots")
    ap.add_argument("--prompts", help="Chameleon world: prompt table (id,caption; `lantern prompts`); image i is "
                                      "drawn for row i")


def identity(a) -> dict:
    """What decides a Chameleon job's images beyond `lantern sample`'s own flags (sample.job_identity)."""
    files = {k: (str(Path(v).resolve()), Path(v).stat().st_mtime_ns) if v and Path(v).exists() else v
             for k, v in (("tokenizer", a.tokenizer), ("vqgan_yaml", a.vqgan_yaml), ("prompts", a.prompts))}
    return {"family": a.family, "pixels": a.pixels, "prompt_tokens": a.prompt_tokens, "files": files}


class Prompts:
    """The condition of image i: prompt row i as text, through the family's template (left-padded ids, mask)."""

    def __init__(self, a, pieces):
        from lantern.worlds.llamagen.prompts import read_prompts

        if not a.prompts:
            raise UserError(f"--family {a.family} draws image i for prompt row i: give the prompt table with "
                            "--prompts (`lantern prompts`)")
        rows = read_prompts(a.prompts)
        if len(rows) < a.end:
            raise UserError(f"--prompts {a.prompts} holds {len(rows)} prompts, fewer than --end {a.end}; write more "
                            "prompts or lower --end")
        self.rows = dict(zip(range(a.start, a.end), rows[a.start : a.end]))
        # every caption of the range through the template now: a prompt over the slots stops the job before decoding
        ids, mask, _ = pieces.prompts([c for _, c in self.rows.values()])
        self.at = {i: r for r, i in enumerate(self.rows)}
        self.ids, self.mask = ids, mask

    def __call__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [self.at[i] for i in indices]
        return self.ids[rows], self.mask[rows]

    def describe(self, i: int) -> dict:
        pid, caption = self.rows[i]
        return {"prompt_id": pid, "caption": caption}


class ChameleonDecoder:
    """sample.Decoder's interface (run, reference, compile, pad_semantics, target) on a Chameleon world."""

    def __init__(self, method: dict, params, pieces, a, device: torch.device):
        from lantern.engine.decoding.compiled import resolve
        from lantern.engine.decoding.generate import generate
        from lantern.engine.decoding.kinds import layout_refusal
        from lantern.engine.methods import build_decoder, drafting, speculative

        self.target, self.layout = pieces.target, pieces.layout
        self.pad_semantics = "chameleon"  # the padded prompt rows of engine/models/chameleon.py (no choice here)
        compile = resolve({"true": True, "false": False}.get(a.compile, a.compile), device)
        if self.layout is not None and speculative(method):
            refused = layout_refusal(drafting(method), compile)
            if refused:
                raise UserError(f"method {method['name']} with {method.get('drafting')} drafting under layout "
                                f"{self.layout.name} (forced structural tokens): {refused}")
            # auto: a layout's speculative rounds run eager (their compiled forms are checked on CPU only so far),
            # and so does the in-job plain AR they are timed against
            compile = compile and a.compile == "true"
        self.compile = compile
        layout = self.layout

        def vanilla(cond, generators, cond_mask=None):
            return generate(self.target, cond, params, generators, cond_mask, compile=compile, layout=layout)

        self.reference = vanilla
        self.run = (build_decoder(method, params, self.target, None, a.neighbours, a.vq, device, compile,
                                  layout=layout, drafter=pieces.drafter) if speculative(method) else vanilla)


def chameleon_job(a, method: dict, params, device: torch.device):
    """(decoder, condition, pixels of codes [1, N] -> uint8 [H, W, 3], the manifest's extra keys) of the job."""
    from lantern.engine.methods import needs_drafter
    from lantern.io import sha256_file
    from lantern.worlds.chameleon.world import load_pieces

    for flag, value in (("--captions", a.captions), ("--target-spec", a.target_spec)):
        if value:
            raise UserError(f"{flag} is for LlamaGen targets; a {a.family} world reads its prompts as text "
                            "(--prompts) and its spec from --target's config.json")
    if not a.tokenizer:
        raise UserError(f"--family {a.family} needs its text tokenizer: --tokenizer tokenizer.json")
    drafter = a.drafter if needs_drafter(method) else None
    if needs_drafter(method) and not drafter:
        raise UserError(f"method {method['name']} with {method['drafting']} drafting needs the authors' drafter "
                        "folder (--drafter)")
    pieces = load_pieces(a.family, a.target, a.vq, a.tokenizer, device, a.dtype, drafter=drafter,
                         vqgan_yaml=a.vqgan_yaml, pixels=a.pixels, prompt_tokens=a.prompt_tokens)
    decoder = ChameleonDecoder(method, params, pieces, a, device)
    condition = Prompts(a, pieces)
    extra = {"chameleon": {"family": a.family, "tokenizer": a.tokenizer, "vqgan_yaml": a.vqgan_yaml,
                           "pixels": a.pixels, "prompt_tokens": a.prompt_tokens},
             "prompts": {"path": a.prompts, "sha256": sha256_file(a.prompts)},
             "layout": dataclasses.asdict(pieces.layout) if pieces.layout is not None else None}
    return decoder, condition, lambda codes: pieces.pixels(codes)[0], extra
