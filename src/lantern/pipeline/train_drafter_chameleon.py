"""The pieces of `lantern train-drafter --family anole|lumina-mgpt` (run by train_drafter.chameleon_main): the
LANTERN authors' Chameleon drafter (one Chameleon layer, fc with bias, the target's embedding;
engine/models/chameleon.py) trained for a released Chameleon target on the target's own generations, and saved in
the authors' folder layout, which worlds/chameleon/hf.load_drafter reads.

Data, as the authors make Lumina-mGPT's (chameleon-targets.md section 5): the target generates one image per
prompt (prompts in turn, n_self sequences) with its family's layout and the authors' sampling (CFG 3, top-k 2000,
overridable by `self_sampling`); a sequence is (the family's prompt ids, every generated step: codes and the
forced structural tokens, Lumina's end-of-line and end-of-image). Sequence i draws from its own seed (`seed`, i).
The sequences are kept in `<out>.self.pt` as they are made (`SelfData`): a rerun with the same target, prompts,
sampling, seed and n_self goes on from there, and a later training run with other optimiser params reuses them.
Training is train_drafter's (SmoothL1 + soft CE, resume), with `cond_dropout` (default 0.1, the authors' uncond
share) of the rows on the family's uncond prompt.

Output folder: config.json (the target's, num_hidden_layers 1, bias true), pytorch_model.bin (the authors' keys, in
the target's dtype) and training.json (params, history: our record; the loader reads only the first two).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from torch import Tensor

from lantern.errors import UserError
from lantern.hparams import DrafterParams
from lantern.io import atomic_path, load_torch, save_torch, write_json

SAVE_EVERY = 512  # self-generated sequences between writes of <out>.self.pt (each write is the whole set so far)


def read_prompt_set(path) -> list[str]:
    """Captions of a prompt file: a TSV with a Prompt column (PartiPrompts.tsv, SJDPrompts.tsv), a JSON list of
    captions (captions_val2017_longest.json) or a `lantern prompts` table (CSV, id and caption)."""
    from lantern.worlds.chameleon.prompts import read_caption_list, read_prompt_tsv
    from lantern.worlds.llamagen.prompts import read_prompts

    path = Path(path)
    suffix = path.suffix.lower()
    rows = (read_prompt_tsv(path, "--prompts") if suffix == ".tsv" else read_caption_list(path, "--prompts")
            if suffix == ".json" else read_prompts(path, "--prompts"))
    if not rows:
        raise UserError(f"--prompts {path} holds no prompts")
    return [caption for _, caption in rows]


def check_params(params: DrafterParams) -> None:
    """What the authors' drafter cannot take."""
    if params.feature_layers:
        raise UserError(f"drafter feature_layers {list(params.feature_layers)}: the authors' Chameleon drafter reads "
                        "the last hidden state only; set feature_layers: []")


def check_args(a, params: DrafterParams) -> None:
    """What the Chameleon path refuses, before any file is read."""
    for flag in ("tokens", "caption_features", "target_spec"):
        if getattr(a, flag):
            raise UserError(f"--{flag.replace('_', '-')} is for LlamaGen targets; a Chameleon drafter trains on its "
                            "target's own generations (--prompts)")
    if params.data != "self":
        raise UserError(f"drafter data {params.data}: a Chameleon drafter trains on its target's own generations; "
                        "set data: self and n_self: N in --params")
    check_params(params)
    if not a.prompts or not a.tokenizer or not a.vqgan_ckpt:
        raise UserError("a Chameleon target needs --prompts (the captions to generate from), --tokenizer and "
                        "--vqgan-ckpt (the model's tokenizer.json and tokenizer/vqgan.ckpt)")
    if a.gen_batch < 1:
        raise UserError(f"--gen-batch {a.gen_batch} must be a positive number of sequences")
    if Path(a.out).is_file():
        raise UserError(f"--out {a.out} is a file; a Chameleon drafter is a folder (config.json + pytorch_model.bin)")


def digest(t: Tensor) -> str:
    return hashlib.sha256(t.detach().cpu().contiguous().numpy().tobytes()).hexdigest()


class SelfData:
    """The data step's prompts and its store: n_self prompt rows (ids [n, T] and masks, the captions in turn), the
    sampling and identity of the step, the sequences a previous run of it left in `path` (`done`), and `keep`,
    which writes the sequences so far there every SAVE_EVERY and at the end."""

    def __init__(self, world, captions: list[str], params: DrafterParams, path: Path):
        n, self.path = params.n_self, path
        cond, mask, _ = world._prompts([captions[i % len(captions)] for i in range(n)])
        self.cond, self.mask = cond.cpu(), mask.cpu()
        self.sampling = {**world.sampling, **params.self_sampling}
        self.identity = {"target": json.dumps(world.target.args.to_dict(), sort_keys=True, default=str),
                         "prompts": digest(self.cond), "sampling": json.dumps(self.sampling, sort_keys=True),
                         "seed": params.seed, "n": n}
        self.done = None
        if path.is_file():
            state = load_torch(path, "self-generated drafter data")
            if state.get("identity") == self.identity:
                self.done = state["tokens"].long()
                print(f"train-drafter: {len(self.done)} of {n} self-generated sequences read from {path}", flush=True)
            else:
                print(f"train-drafter: {path} holds another data step's sequences; generating afresh", flush=True)
        self.saved = 0 if self.done is None else len(self.done)

    @property
    def complete(self) -> bool:
        return self.done is not None and len(self.done) == len(self.cond)

    def keep(self, tokens: Tensor) -> None:
        if len(tokens) - self.saved >= SAVE_EVERY or len(tokens) == len(self.cond):
            # int16: the head's columns (8192 codes + a few structural ids) fit
            save_torch({"identity": self.identity, "tokens": tokens.to(torch.int16)}, self.path)
            self.saved = len(tokens)


def save_authors_folder(out: Path, drafter, target, target_folder, record: dict) -> None:
    """The drafter as the authors release theirs: config.json (the target's, one layer, fc bias) and
    pytorch_model.bin (their keys, the target's dtype), plus our training.json. config.json is written last, so a
    folder that has it is whole."""
    from lantern.engine.models.chameleon_load import drafter_to_authors
    from lantern.worlds.chameleon.hf import read_config

    cfg = dict(read_config(Path(target_folder)), num_hidden_layers=1, bias=True)
    out.mkdir(parents=True, exist_ok=True)
    sd = drafter_to_authors(drafter, target, target.output.weight.dtype)
    with atomic_path(out / "pytorch_model.bin") as tmp:
        torch.save(sd, tmp)
    write_json(out / "training.json", record)
    write_json(out / "config.json", cfg)


def load(a, params: DrafterParams):
    """(the world, the captions) of a Chameleon `lantern train-drafter` (a: its parsed arguments), its arguments
    checked first."""
    import lantern

    check_args(a, params)
    captions = read_prompt_set(a.prompts)
    world = lantern.load_chameleon(a.family, target=a.target, vqgan_ckpt=a.vqgan_ckpt, tokenizer=a.tokenizer,
                                   vqgan_yaml=a.vqgan_yaml, pixels=a.pixels, prompt_tokens=a.prompt_tokens,
                                   device=a.device, dtype=a.dtype)
    return world, captions
