"""A model family's generated token sequence, as its authors generate it: the image codes in raster order, and the
structural tokens the logits processors force between them (Chameleon-family targets; reference notes
chameleon-targets.md section 2, docs/chameleon-layout.md).

A sequence is: `prefix` (forced, fed with the prompt: the authors' EAGLE path appends Lumina-mGPT's [boi, size,
size] to the input ids, so no forward samples them), then `steps` generated slots: `rows` rows of `cols` codes,
each row followed by `eol` when the family has one, then `eoi` when it has one. Step s is forced when it is a row's
end-of-line or the end-of-image slot; every other step holds code i = its code index, as id i + `code_offset`.

- Anole: 32 x 32 codes, no structural token: 1024 steps, all codes.
- Lumina-mGPT-7B-768: prefix [8197, 8828, 8828]; 48 rows of (48 codes + 8803); then 8196: 2353 steps
  (2352 + eoi; the authors' max_new_tokens), 2304 codes, 49 forced; 2356 tokens from boi to eoi.

Pure functions of a Layout; the decoders (docs/chameleon-layout.md) work on code indices and call `code_steps` /
`forced_after` to splice the forced tokens into the target's forwards.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lantern.errors import UserError


@dataclass(frozen=True)
class Layout:
    name: str
    rows: int  # code grid height
    cols: int  # code grid width
    prefix: tuple[int, ...] = ()  # forced tokens fed with the prompt (Lumina: boi, size, size)
    eol: int | None = None  # forced after each row's last code
    eoi: int | None = None  # forced after the last row
    code_offset: int = 4  # token id of code c: c + code_offset (Chameleon: ids 4 .. 8195)
    codebook: int = 8192  # codes 0 .. codebook - 1
    vocab: int = 65536  # the target's head rows

    def __post_init__(self):
        for field in ("rows", "cols", "codebook", "vocab"):
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UserError(f"layout {self.name}: {field}={v!r} must be a positive integer")
        if self.code_offset < 0 or self.code_offset + self.codebook > self.vocab:
            raise UserError(f"layout {self.name}: codes at ids {self.code_offset} .. "
                            f"{self.code_offset + self.codebook - 1} do not fit a vocabulary of {self.vocab}")
        for what, tok in (("eol", self.eol), ("eoi", self.eoi), *(("prefix", t) for t in self.prefix)):
            if tok is not None and not 0 <= tok < self.vocab:
                raise UserError(f"layout {self.name}: {what} token {tok} lies outside the vocabulary of {self.vocab}")
            if tok is not None and self.is_code_id(tok):
                raise UserError(f"layout {self.name}: {what} token {tok} is an image code's id; structural tokens "
                                f"must lie outside {self.code_offset} .. {self.code_offset + self.codebook - 1}")

    def is_code_id(self, token: int) -> bool:
        return self.code_offset <= token < self.code_offset + self.codebook

    @property
    def codes(self) -> int:
        """N, the image codes per image."""
        return self.rows * self.cols

    @property
    def row_len(self) -> int:
        """Steps per row: its codes and its end-of-line token."""
        return self.cols + (self.eol is not None)

    @property
    def steps(self) -> int:
        """Generated slots after the prefix: codes and forced tokens."""
        return self.rows * self.row_len + (self.eoi is not None)

    @property
    def forced_steps(self) -> int:
        return self.steps - self.codes


ANOLE = Layout("anole", 32, 32)
# Lumina-mGPT-7B-768: grid size 24 patches of 32 px -> size token 8804 + 24 (chameleon-targets.md section 2)
LUMINA_MGPT_768 = Layout("lumina-mgpt-768", 48, 48, prefix=(8197, 8828, 8828), eol=8803, eoi=8196)
LAYOUTS = {layout.name: layout for layout in (ANOLE, LUMINA_MGPT_768)}


def lumina_layout(pixels: int) -> Layout:
    """Lumina-mGPT's layout at a square resolution: a 16-px code grid, size token 8804 + pixels / 32 (their
    `<reserved08800+n>`; 512 -> 8820, 768 -> 8828, 1024 -> 8836)."""
    if isinstance(pixels, bool) or not isinstance(pixels, int) or pixels < 32 or pixels % 32:
        raise UserError(f"Lumina-mGPT resolution {pixels!r} must be a positive multiple of 32 pixels, e.g. 768")
    size = 8804 + pixels // 32
    return Layout(f"lumina-mgpt-{pixels}", pixels // 16, pixels // 16, prefix=(8197, size, size), eol=8803,
                  eoi=8196)


def head_layout(layout: Layout) -> tuple[Layout, tuple[int, ...]]:
    """(the layout in a Chameleon target's head space, the head's extra ids). `Chameleon` sees code c as column c
    and exposes its `extra_ids` after the codes (engine/models/chameleon.py), so the decoders feed eol as column
    codebook and eoi as the next: the same sequence, the tokens embedded by their ids. The prefix goes with the
    prompt (the family's prompt builder), so it is dropped here."""
    extra = tuple(t for t in (layout.eol, layout.eoi) if t is not None)
    column = {t: layout.codebook + j for j, t in enumerate(extra)}
    return Layout(layout.name, layout.rows, layout.cols, eol=column.get(layout.eol), eoi=column.get(layout.eoi),
                  code_offset=0, codebook=layout.codebook, vocab=layout.codebook + len(extra)), extra


# -- steps and codes -----------------------------------------------------------------------------------------------
def forced_tokens(layout: Layout, device=None) -> Tensor:
    """[steps] long: the token forced at each generated step, -1 where a code is generated. Lumina: 8803 at every
    49th step (steps 48, 97, .., 2351), 8196 at step 2352 (the authors' MultiModalLogitsProcessor: with n tokens
    generated after the prefix, n + 1 divisible by 49 forces 8803, n + 1 = 49 * 48 + 1 forces 8196)."""
    out = torch.full((layout.steps,), -1, dtype=torch.long, device=device)
    if layout.eol is not None:
        out[layout.row_len - 1 :: layout.row_len] = layout.eol
    if layout.eoi is not None:
        out[-1] = layout.eoi
    return out


def code_steps(layout: Layout, index: Tensor) -> Tensor:
    """The generated step of code index i (any shape): i + (rows completed before it, when rows end with eol). The
    code's sequence position is then prompt length + len(prefix) + its step."""
    return index + (index // layout.cols if layout.eol is not None else 0)


def forced_after(layout: Layout, index: Tensor) -> Tensor:
    """The forced tokens that follow code index i (any shape) directly, [..., F] padded with -1 (F = 2 with eol and
    eoi): eol after a row's last code, then eoi after the grid's last code. A round that verifies code i feeds these
    to the target right after it (docs/chameleon-layout.md)."""
    cols = []
    if layout.eol is not None:
        cols.append(torch.where(index % layout.cols == layout.cols - 1, layout.eol, -1))
    if layout.eoi is not None:
        cols.append(torch.where(index == layout.codes - 1, layout.eoi, -1))
    if not cols:
        return index.new_full((*index.shape, 0), -1)
    return torch.stack(cols, -1)


def ids_to_codes(layout: Layout, ids: Tensor) -> Tensor:
    """Generated ids [..., steps] -> code grid [..., rows, cols]: the forced steps checked and dropped, ids minus
    code_offset. Raises ValueError naming the first step that breaks the layout."""
    if ids.shape[-1] != layout.steps:
        raise ValueError(f"layout {layout.name}: {ids.shape[-1]} generated ids, expected {layout.steps}")
    forced = forced_tokens(layout, ids.device)
    is_forced = forced >= 0
    bad = (is_forced & (ids != forced)) | (~is_forced & ((ids < layout.code_offset)
                                                          | (ids >= layout.code_offset + layout.codebook)))
    if bool(bad.any()):
        step = int(bad.reshape(-1, layout.steps).any(0).nonzero()[0])
        want = f"token {int(forced[step])}" if is_forced[step] else "an image code's id"
        raise ValueError(f"layout {layout.name}: step {step} holds an id that is not {want}")
    return (ids[..., ~is_forced] - layout.code_offset).reshape(*ids.shape[:-1], layout.rows, layout.cols)


def codes_to_ids(layout: Layout, codes: Tensor) -> Tensor:
    """Code grid [..., rows, cols] (or [..., rows * cols]) -> generated ids [..., steps], forced steps filled."""
    flat = codes.reshape(*codes.shape[: -2 if codes.shape[-2:] == (layout.rows, layout.cols) else -1], layout.codes)
    if bool(((flat < 0) | (flat >= layout.codebook)).any()):
        raise ValueError(f"layout {layout.name}: codes must lie in 0 .. {layout.codebook - 1}")
    forced = forced_tokens(layout, codes.device)
    out = forced.expand(*flat.shape[:-1], layout.steps).clone()
    out[..., forced < 0] = flat + layout.code_offset
    return out


# -- the image-only restriction ------------------------------------------------------------------------------------
def image_mask(layout: Layout, device=None) -> Tensor:
    """[vocab] bool: the ids an unforced step may take. The authors set every other logit to finfo.min (Anole) or
    -inf (Lumina) after CFG, so a softmax over the head's rows code_offset .. + codebook alone (`image_logits`) is
    the same distribution."""
    ids = torch.arange(layout.vocab, device=device)
    return (ids >= layout.code_offset) & (ids < layout.code_offset + layout.codebook)


def image_logits(layout: Layout, logits: Tensor) -> Tensor:
    """[..., vocab] -> [..., codebook]: the image head's rows, what the decoders work on (code c at column c)."""
    return logits[..., layout.code_offset : layout.code_offset + layout.codebook]


# -- tau ----------------------------------------------------------------------------------------------------------
def tau_codes(layout: Layout, target_forwards: int) -> float:
    """Ours (docs/decoders.md): image codes / target forwards, the prefill forward and the bonus token counted;
    forced tokens are not codes and are not counted."""
    return layout.codes / target_forwards


def tau_authors(layout: Layout, target_forwards: int) -> float:
    """The authors' (mean of accept_length + 1 over their verify rounds): every generated step after the first,
    forced tokens included, over the verify forwards; the prefill, which samples the first step, is in neither.
    Their loop also counts what its last round accepts past eoi (at most a tree's depth), which ours never draws."""
    if target_forwards < 2:
        raise ValueError("the authors' tau needs at least one verify forward after the prefill")
    return (layout.steps - 1) / (target_forwards - 1)
