"""The EAGLE-1 drafter: the model, its target states, and its checkpoints (training: pipeline/train_drafter.py).

Architecture (method.md section 4): drafter position t reads the target's input embedding at position t + 1
(condition embeddings for t < T - 1, image-token embeddings after) and the target's post-norm hidden state h_t,
joins them with fc (2d -> d, bias), runs one decoder layer without input norm and no final norm, and predicts
h_{t+1}; the target's frozen output head turns that into logits for the token at t + 2. Token embedding and head
are frozen copies of the target's and are not stored in the drafter checkpoint. RoPE row t + 1 (the position of
the token read) is used, so the first image step is rotated like the target's img_0.

With `DrafterOptions.feature_layers` the drafter also reads the outputs of those target layers, as EAGLE-3 does
(arXiv 2503.01840): the target hands them on beside h_t (GPT.feature_layers), and `fuse` joins them, each
RMS-normalised without weights, with h_t into one d-wide state. Later chain steps read the drafter's own
prediction in its place, as in EAGLE-1.

A drafter may instead follow the LANTERN authors' LlamaGen drafter (`DrafterOptions`, set by `lantern convert`):
its own token embedding, code 0's embedding over the condition positions, no caption padding mask, norm eps 1e-6.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
from torch import Tensor

from lantern.engine.models.checkpoint import DRAFTER_FORMAT, wrong_kind
from lantern.errors import UserError
from lantern.params import check_feature_layers, check_layer_indices
from lantern.io import load_torch, save_torch
from lantern.engine.models.model import (GPT, KVCache, ModelArgs, TransformerBlock, causal_mask, key_mask, own_slots,
                                  precompute_rope_2d, row_mask, row_slots)

FORMAT = DRAFTER_FORMAT
TRAINED = ("fc.", "layer.", "fuse.")  # the drafter's own weights; embedding and head come from the target
OWN_EMBEDDING = "tok_embeddings."


@dataclass(frozen=True)
class DrafterOptions:
    """How a drafter reads its inputs. The defaults are ours; AUTHORS_LLAMAGEN is the LANTERN authors' LlamaGen
    drafter (jadohu/LANTERN models/drafters/cnets_llamagen.py), so that its converted weights compute its function.

    RoPE needs no option: theirs uses row p of a table with T - 1 zero rows, ours row p + 1 of one with T, the same
    angles at every drafter position p."""

    norm_eps: float | None = None  # the FFN pre-norm's eps; None: the target's
    # what drafter positions 0..T-2 (over the condition) read: "target": the target's condition embeddings 1..T-1;
    # "code0": the drafter's embedding of code 0 (the authors zero-pad the input ids there, in training and decoding)
    cond_inputs: str = "target"
    mask_padding: bool = True  # hide left-padded caption positions (the authors' drafter attends to them)
    own_embedding: bool = False  # the token embedding is stored with the drafter, never re-tied to the target's
    # target layers (0-based, increasing, below the last) whose outputs the drafter reads beside h_t; () = EAGLE-1
    feature_layers: tuple[int, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "feature_layers", check_layer_indices(self.feature_layers))
        if self.cond_inputs not in ("target", "code0"):
            raise UserError(f"drafter options cond_inputs={self.cond_inputs!r} must be 'target' or 'code0'")
        if self.norm_eps is not None and self.norm_eps <= 0:
            raise UserError(f"drafter options norm_eps={self.norm_eps} must be > 0 (or null for the target's)")


AUTHORS_LLAMAGEN = DrafterOptions(norm_eps=1e-6, cond_inputs="code0", mask_padding=False, own_embedding=True)


class Drafter(nn.Module):
    def __init__(self, args: ModelArgs, options: DrafterOptions = DrafterOptions()):
        super().__init__()
        self.args, self.options = args, options
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.fc = nn.Linear(2 * args.dim, args.dim, bias=True)
        eps = args.norm_eps if options.norm_eps is None else options.norm_eps
        self.layer = TransformerBlock(dataclasses.replace(args, norm_eps=eps), input_norm=False)
        check_feature_layers(options.feature_layers, args.n_layer)
        self.fuse = nn.Linear((len(options.feature_layers) + 1) * args.dim, args.dim) if options.feature_layers else None
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        self.rope = precompute_rope_2d(args)
        self.cache_key_valid: Tensor | None = None
        for m in (self.fc, *self.layer.modules()):
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
        nn.init.zeros_(self.fc.bias)
        if self.fuse is not None:  # starts as h_t alone (EAGLE-1), the state later chain steps read in its place
            nn.init.zeros_(self.fuse.bias)
            with torch.no_grad():
                self.fuse.weight.zero_()[:, -args.dim :] = torch.eye(args.dim)

    @classmethod
    def from_target(cls, target: GPT, options: DrafterOptions = DrafterOptions()) -> "Drafter":
        d = cls(target.args, options).to(device=target.output.weight.device)
        d.copy_frozen(target)
        return d

    def copy_frozen(self, target: GPT) -> None:
        """The head is always the target's; the embedding too, unless the drafter carries its own. The target then
        hands on the layers this drafter reads."""
        target.feature_layers = self.options.feature_layers
        with torch.no_grad():
            if not self.options.own_embedding:
                self.tok_embeddings.weight.copy_(target.tok_embeddings.weight)
            self.output.weight.copy_(target.output.weight)
        self.tok_embeddings.requires_grad_(False)
        self.output.requires_grad_(False)

    @property
    def stored(self) -> tuple[str, ...]:
        """State-dict prefixes a drafter checkpoint holds."""
        return TRAINED + ((OWN_EMBEDDING,) if self.options.own_embedding else ())

    def _apply(self, fn, *a, **kw):
        out = super()._apply(fn, *a, **kw)
        self.rope = self.rope.to(self.fc.weight.device)  # fp32 on the weights' device, never in the state dict
        return out

    def trained_state(self) -> dict[str, Tensor]:
        return {k: v.detach().cpu() for k, v in self.state_dict().items() if k.startswith(self.stored)}

    def head(self, hidden: Tensor) -> Tensor:
        return self.output(hidden).float()

    def embed_tokens(self, tokens: Tensor) -> Tensor:
        return self.tok_embeddings(tokens)

    def cond_inputs(self, cond_emb: Tensor) -> Tensor:
        """What drafter positions 0..T-2 read, given the target's condition embeddings cond_emb [B, T, d]."""
        w = self.fc.weight
        if self.options.cond_inputs == "target":
            return cond_emb[:, 1:].to(w.dtype)
        B, T = cond_emb.shape[:2]
        return self.tok_embeddings.weight[0].to(w.dtype).expand(B, T - 1, -1)

    def inputs(self, cond_emb: Tensor, tokens: Tensor) -> Tensor:
        """Drafter inputs over a whole teacher-forced sequence: condition part, then the image tokens [B, S]."""
        return torch.cat([self.cond_inputs(cond_emb), self.embed_tokens(tokens).to(self.fc.weight.dtype)], dim=1)

    def padding_mask(self, cond_mask: Tensor | None, S: int) -> Tensor | None:
        """The uncached pass's attention mask for S positions (None: causal)."""
        return drafter_mask(cond_mask if self.options.mask_padding else None, S)

    def uncached_positions(self, cond_mask: Tensor | None, S: int) -> Tensor:
        """Drafter positions of the uncached pass over S positions ([S], or per row [B, S])."""
        return torch.arange(S, device=self.fc.weight.device)

    def fused(self, hidden: Tensor) -> Tensor:
        """The d-wide state the drafter reads: the target's features [..., (n + 1) * d] fused (the n layers' outputs
        RMS-normalised, as their scales grow with depth), or a d-wide state (h_t, or a prediction) as it is."""
        if hidden.shape[-1] == self.args.dim:
            return hidden
        *layers, h = hidden.float().split(self.args.dim, dim=-1)
        parts = [x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) for x in layers] + [h]
        return self.fuse(torch.cat(parts, dim=-1).to(self.fuse.weight.dtype))

    def _run(self, emb: Tensor, hidden: Tensor, pos: Tensor, mask: Tensor | None, slots: Tensor | None,
             rows: Tensor | None = None) -> Tensor:
        hidden = self.fused(hidden)
        x = self.fc(torch.cat([emb, hidden.to(emb.dtype)], dim=-1))
        return self.layer(x, self.rope[pos + 1], mask, row_slots(slots, rows, self.layer.attention.kv_cache), rows)

    def forward(self, emb: Tensor, hidden: Tensor, mask: Tensor | None = None, pos: Tensor | None = None) -> Tensor:
        """Uncached pass over drafter positions `pos` [S] (default 0..S-1): emb [B, S, d] (target inputs at t + 1),
        hidden [B, S, d] (target h_t); returns the predicted h_{t+1} [B, S, d]. mask None: causal."""
        pos = torch.arange(emb.shape[1], device=emb.device) if pos is None else pos
        return self._run(emb, hidden, pos, mask, None)

    # -- cached drafting ------------------------------------------------------------------------------------------
    @property
    def layers(self) -> tuple[TransformerBlock]:
        """The drafter's one decoder layer, as GPT.layers (what holds a KV cache)."""
        return (self.layer,)

    def setup_cache(self, batch: int, extra: int = 0, cond_mask: Tensor | None = None) -> None:
        w = self.fc.weight
        max_len = self.args.max_seq_len + extra
        self.layer.attention.kv_cache = KVCache(batch, self.args.n_head, max_len, self.args.head_dim, w.dtype, w.device)
        self.cache_key_valid = torch.ones(batch, max_len, dtype=torch.bool, device=w.device)
        self.set_cond_mask(cond_mask)

    def set_cond_mask(self, cond_mask: Tensor | None) -> None:
        """Hide left-padded caption positions (unless the options say the drafter sees them); drafter position t
        reads condition t + 1, so the padding mask shifts by one."""
        if cond_mask is not None and self.options.mask_padding:
            self.cache_key_valid[:, : cond_mask.shape[1] - 1] = cond_mask[:, 1:].bool()

    def clear_cache(self) -> None:
        self.layer.attention.kv_cache = None
        self.cache_key_valid = None

    @property
    def cache_len(self) -> int:
        return self.layer.attention.kv_cache.k.shape[2]

    def forward_cached(self, emb: Tensor, hidden: Tensor, pos: Tensor, visible: Tensor,
                       slots: Tensor | None = None) -> Tensor:
        """Cached pass at drafter positions `pos` [S], written to cache `slots` [S] (default: the positions; tree
        nodes sharing a depth share a position but not a slot); visible [S, max_len] as in GPT."""
        slots = pos if slots is None else slots
        own = own_slots(slots, visible.shape[-1])
        mask = (visible[None, None] & self.cache_key_valid[:, None, None, :]) | own[None, None]
        return self._run(emb, hidden, pos, mask, slots)

    def forward_rows(self, emb: Tensor, hidden: Tensor, pos: Tensor, slots: Tensor, visible: Tensor,
                     rows: Tensor | None = None) -> Tensor:
        """Cached pass with per-row drafter positions pos [b, S] and slots [b, S] over the cache rows `rows` [b]
        (None: all rows, in order); visible [b, S, max_len]; as GPT.forward_rows."""
        key_valid = self.cache_key_valid if rows is None else self.cache_key_valid[rows]
        return self._run(emb, hidden, pos, row_mask(visible, slots, key_valid), slots, rows)

    def step(self, emb: Tensor, hidden: Tensor, start: int) -> Tensor:
        """Causal cached pass over consecutive drafter positions start.. start + S - 1."""
        S = emb.shape[1]
        pos = torch.arange(start, start + S, device=emb.device)
        return self.forward_cached(emb, hidden, pos, causal_mask(S, self.cache_len, emb.device, start=start))


def target_states(target: GPT, cond: Tensor, tokens: Tensor, cond_mask: Tensor | None = None):
    """Teacher-forced target pass keeping every position: (input embeddings, post-norm hidden, logits), each
    [B, T + N - 1, ...] for tokens = img[:, :-1] (GPT.forward keeps only the image-predicting positions)."""
    x, logits, hidden = target.teacher_forced(cond, tokens, cond_mask)
    return x, hidden, logits


def drafter_mask(cond_mask: Tensor | None, S: int) -> Tensor | None:
    """Causal mask for the drafter's S positions; padded conditions (shifted by one) hidden."""
    if cond_mask is None:
        return None
    shifted = torch.ones_like(cond_mask, dtype=torch.bool)
    shifted[:, :-1] = cond_mask[:, 1:].bool()
    return (causal_mask(S, S, cond_mask.device) & key_mask(shifted, S)) | torch.eye(S, dtype=torch.bool, device=cond_mask.device)


# -- checkpoints --------------------------------------------------------------------------------------------------
def save_drafter(path: str | Path, drafter: Drafter, params=None, **extra) -> None:
    """params: the training hyperparameters (a dataclass), kept for the record."""
    obj = {
        "format": FORMAT, "drafter": drafter.trained_state(), "target_args": drafter.args.to_dict(),
        "options": dataclasses.asdict(drafter.options), "params": dataclasses.asdict(params) if params else {}, **extra,
    }
    save_torch(obj, path)


def read_drafter(path: str | Path, mmap: bool = False) -> dict:
    """A drafter file's contents, checked to be one (format tag, its target's config, its weights)."""
    obj = load_torch(path, "checkpoint", mmap=mmap)
    error = wrong_kind(obj, path, "drafter")
    if error:
        raise error
    if (obj.get("format") != FORMAT or not isinstance(obj.get("target_args"), dict)
            or not isinstance(obj.get("drafter"), dict) or not isinstance(obj.get("options", {}), dict)):
        raise UserError(f"{path} is not a drafter checkpoint written by `lantern train-drafter` or `lantern convert`")
    return obj


def check_drafter_target(obj: dict, target_args: dict, path) -> None:
    """A drafter serves only the target it was trained for (same width, vocabulary, condition and token grid)."""
    saved = obj["target_args"]
    for key in ("dim", "vocab_size", "model_type", "cls_token_num", "image_tokens"):
        if saved.get(key) != target_args[key]:
            raise UserError(
                f"drafter {path} was trained for a target with {key}={saved.get(key)}, but this target has "
                f"{key}={target_args[key]}; train a drafter for this target (`lantern train-drafter`)"
            )


def load_drafter(path: str | Path, target: GPT) -> Drafter:
    """A drafter for `target`, on its device and dtype; a drafter trained for another target is a UserError."""
    obj = read_drafter(path)
    check_drafter_target(obj, target.args.to_dict(), path)
    try:
        options = DrafterOptions(**obj.get("options", {}))
        args = ModelArgs(**obj["target_args"])
    except TypeError as e:
        raise UserError(f"drafter {path} has an unusable config or options ({e}); rewrite it with this version of "
                        "lantern") from None
    return build_drafter(args, options, obj["drafter"], target, path)


def build_drafter(args: ModelArgs, options: DrafterOptions, sd: dict[str, Tensor], target: GPT, path) -> Drafter:
    """The one place a drafter is made from (its target's args, options, its stored weights): ours (load_drafter) or
    a reader's (the LANTERN authors' drafter, worlds/llamagen/hf.py), on the target's device and dtype, with the
    target's frozen head (and embedding, unless its own) copied in."""
    drafter = Drafter(args, options)
    try:
        missing = drafter.load_state_dict(sd, strict=False).missing_keys
    except RuntimeError as e:  # a tensor of the wrong shape
        first = (str(e).strip().splitlines() or [type(e).__name__])[-1].strip()[:200]
        raise UserError(f"drafter {path} does not fit its own target config ({first}); rewrite it") from None
    lacking = [k for k in missing if k.startswith(drafter.stored)]
    if lacking:
        raise UserError(f"drafter {path} is incomplete: missing {', '.join(lacking)}")
    w = target.output.weight
    drafter = drafter.to(device=w.device, dtype=w.dtype)
    drafter.copy_frozen(target)
    return drafter.eval().requires_grad_(False)
