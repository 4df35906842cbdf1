"""Where a round's codes and forced tokens sit when the target's sequence carries forced structural tokens (a
models/layout.Layout with eol / eoi; docs/chameleon-layout.md): the decoders draft, verify and accept codes only,
and the forced tokens are spliced into the drafter's steps and the target's verify forward at their own slots.

A round of an image whose newest token y is code d - 1 looks at the slots after y: slot s is sequence step
code_steps(d - 1) + 1 + s, which is either forced (its id) or a code d + t. The verify forward is [y, slot 0,
slot 1, ..] at contiguous positions from y's; its row r predicts slot r, so code d + t's distribution is the row
`code_slot[t]` (the eol's row after a row end). Every function is batched over images, on the device.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lantern.engine.models.layout import Layout, code_steps, forced_tokens, image_logits


def slot_width(layout: Layout, G: int) -> int:
    """Slots a round of G drafts may span after y, with room for the bonus code's predicting row and one spare slot
    that indices past the grid clamp to (never a real slot)."""
    return G + -(-(G + 1) // layout.cols) + 2


def draft_slots(layout: Layout, G: int) -> int:
    """The most slots G drafts span after y (a compiled round's drafter steps): the eol tokens among them."""
    return G + (-(-G // layout.cols) if layout.eol is not None else 0)


def verify_width(layout: Layout, G: int) -> int:
    """The most rows a verify of G drafts takes (verify_rows' bound; a compiled round's static width): y, the
    drafts, the bonus code's predicting row and the eol tokens among them."""
    return G + 1 + (-(-(G + 1) // layout.cols) if layout.eol is not None else 0)


def slot_geometry(layout: Layout, d: Tensor, G: int) -> tuple[Tensor, Tensor, Tensor]:
    """(forced [n, S]: the forced id at each slot after y, -1 at a code's slot; code_slot [n, G + 1]: the slot of code
    d + t, t = G the bonus code; slot_code [n, S]: t at a code's slot, -1 at a forced one), S = slot_width. Slots
    past the image's last step are neither (forced -1, slot_code -1) and codes past the grid sit at the spare slot
    S - 1: a round never reads them."""
    S = slot_width(layout, G)
    base = code_steps(layout, d - 1)
    step = base[:, None] + 1 + torch.arange(S, device=d.device)
    table = forced_tokens(layout, d.device)
    inside = step < layout.steps
    forced = torch.where(inside, table[step.clamp(max=layout.steps - 1)], -1)
    t = torch.arange(G + 1, device=d.device)
    code_slot = (code_steps(layout, d[:, None] + t) - base[:, None] - 1).clamp(max=S - 1)
    code_slot = torch.where(d[:, None] + t < layout.codes, code_slot, S - 1)
    slot_code = torch.full((d.shape[0], S), -1, dtype=torch.long, device=d.device)
    slot_code = slot_code.scatter(1, code_slot, t.expand_as(code_slot).clone())
    slot_code[:, S - 1] = -1
    return forced, code_slot, slot_code


def verify_rows(layout: Layout, d, g):
    """Rows of an image's verify forward for drafts of codes d .. d + g - 1 (host ints, or device tensors [n] for
    compiled rounds): y and the slots up to the bonus code's predicting row, or, when the drafts complete the grid,
    through the last draft (the forced tokens after it are never read)."""
    through_last, to_bonus = code_steps(layout, d + g - 1) + 1, code_steps(layout, d + g)
    if isinstance(d, Tensor):
        return torch.where(d + g >= layout.codes, through_last, to_bonus) - code_steps(layout, d - 1)
    return (through_last if d + g >= layout.codes else to_bonus) - code_steps(layout, d - 1)


def verify_width(layout: Layout, G: int) -> int:
    """The most rows verify_rows gives for G drafts: y, G + 1 codes' slots and the end-of-line tokens that a run of
    G + 1 codes can cross (none without eol); the static width of compiled rounds (docs/chameleon-layout.md)."""
    return G + 1 + (-(-(G + 1) // layout.cols) if layout.eol is not None else 0)


def code_logits(layout: Layout, logits: Tensor, code_slot: Tensor) -> Tensor:
    """A verify forward's logits [R * n, S, vocab] (forward layout) -> each code's predicting row over the image head,
    [R * n, T, codebook] for code_slot [n, T] (slot_geometry's); a slot past the forward reads its last row, which
    no round uses."""
    n, T = code_slot.shape
    R, head = logits.shape[0] // n, image_logits(layout, logits)
    rows = code_slot.clamp(max=logits.shape[1] - 1)[None, ..., None].expand(R, n, T, head.shape[-1])
    return head.reshape(R, n, -1, head.shape[-1]).gather(2, rows).reshape(R * n, T, -1)


def slot_ids(layout: Layout, forced: Tensor, code_slot: Tensor, X: Tensor) -> Tensor:
    """The ids at each slot [n, S]: the forced ids, and draft t (a code) as id X[:, t] + code_offset at its slot;
    id 0 at slots no round reads (past an image's drafts or its last step: padding)."""
    G = X.shape[1]
    return forced.scatter(1, code_slot[:, :G], X + layout.code_offset).clamp(min=0)


def code_positions(layout: Layout, prompt: int, index: Tensor) -> Tensor:
    """The sequence position of code index i: the prompt (its prefix tokens included) plus code_steps(i)."""
    return prompt + code_steps(layout, index)
