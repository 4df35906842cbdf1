"""Chameleon-family targets (Anole-7b-v0.1-hf, Lumina-mGPT-7B-768) and the LANTERN authors' Chameleon drafter, on
LlamaGen's decoding machinery: `Chameleon` is a GPT (same KV cache, run / forward_cached / forward_rows / keep_rows,
prefill) and `ChameleonDrafter` a Drafter, so every drafting kind and rule runs on them unchanged.

What differs from LlamaGen (reference chameleon-targets.md, sections 1, 2 and 5):
- the condition is a text prompt of token ids [B, T], left-padded with the pad id to the fixed T = cls_token_num
  (its key mask hides the padding); each row's RoPE positions start at its first real token, so a padded row
  computes exactly what its unpadded prompt computes alone. The shift is read from the cache's key mask (its
  padded prompt slots), so nothing else carries it and a kept static cache stays consistent;
- 1-D RoPE over token positions; q/k are normalised per head (HeadNorm) before RoPE; the swin_norm variant;
- the decoders see codes 0 .. V - 1 only: code c is token id c + image_offset (4) for c < image_codes (8192), then
  the `extra_ids` (structural tokens a layout adds to the head), and `head` gives the logits of those rows of the
  full lm_head. Softmax over them is the authors' distribution after they set every other logit to finfo.min.
- HF checkpoints rotate halves (dim i pairs with i + hd / 2); our apply_rope rotates interleaved pairs. The loader
  un-permutes the q / k projection rows and the q / k-norm gamma / beta per head (new dim 2j <- j, 2j + 1 <-
  j + hd / 2), which leaves q . k and the per-head LayerNorm statistics unchanged (chameleon_load.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from lantern.engine.models.drafter import Drafter, DrafterOptions
from lantern.engine.models.model import GPT, RMSNorm, TransformerBlock, causal_mask, key_mask, row_slots
from lantern.errors import UserError

IMAGE_OFFSET, IMAGE_CODES = 4, 8192  # ids 4 .. 8195 are the VQGAN's 8192 codes


@dataclass(frozen=True)
class ChameleonArgs:
    """A Chameleon trunk (from its HF config.json, `args_from_hf_config`) plus the layout the decoders run it in
    (prompt slots, tokens per image, the head's extra ids, the CFG null prompt), which the world sets."""

    dim: int = 4096
    n_layer: int = 32
    n_head: int = 32
    ffn_dim: int = 11008
    text_vocab: int = 65536  # rows of embed_tokens and lm_head
    norm_eps: float = 1e-5
    rope_base: float = 10000.0
    swin_norm: bool = False
    cls_token_num: int = 64  # T: prompt slots; prompts are left-padded to T
    image_tokens: int = 1024  # N: tokens generated per image
    image_offset: int = IMAGE_OFFSET
    image_codes: int = IMAGE_CODES
    extra_ids: tuple[int, ...] = ()  # token ids the head exposes after the codes (codes image_codes, ...)
    pad_id: int = 1
    uncond_prompt: tuple[int, ...] = ()  # the CFG null prompt (Anole (0, 8197); Lumina (8197, s, s)); () = no CFG

    def __post_init__(self):
        object.__setattr__(self, "extra_ids", tuple(int(i) for i in self.extra_ids))
        object.__setattr__(self, "uncond_prompt", tuple(int(i) for i in self.uncond_prompt))
        if self.dim % self.n_head or self.head_dim % 2:
            raise UserError(f"Chameleon width {self.dim} does not split into {self.n_head} heads of an even size")
        ids = list(range(self.image_offset, self.image_offset + self.image_codes)) + list(self.extra_ids)
        if len(set(ids)) != len(ids) or min(ids) < 0 or max(ids) >= self.text_vocab:
            raise UserError(f"Chameleon head ids (codes at {self.image_offset}.., extra {self.extra_ids}) must be "
                            f"distinct ids below the vocabulary size {self.text_vocab}")
        if len(self.uncond_prompt) > self.cls_token_num:
            raise UserError(f"the CFG null prompt {self.uncond_prompt} is longer than the {self.cls_token_num} prompt "
                            "slots; raise the prompt length")
        if self.cls_token_num < 1 or self.image_tokens < 1:
            raise UserError("a Chameleon layout needs at least one prompt slot and one image token")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    @property
    def vocab_size(self) -> int:
        """What the decoders see: the codes, then the extra ids."""
        return self.image_codes + len(self.extra_ids)

    @property
    def max_seq_len(self) -> int:
        return self.cls_token_num + self.image_tokens

    def layout(self) -> dict:
        """The fields the world sets (not in config.json)."""
        return {k: getattr(self, k) for k in LAYOUT_FIELDS}

    def head_ids(self) -> Tensor:
        """[vocab_size] the token id of each code."""
        codes = torch.arange(self.image_offset, self.image_offset + self.image_codes)
        return torch.cat([codes, torch.tensor(self.extra_ids, dtype=torch.long)])

    def to_dict(self) -> dict:
        return asdict(self)


LAYOUT_FIELDS = ("cls_token_num", "image_tokens", "image_offset", "image_codes", "extra_ids", "pad_id", "uncond_prompt")


def precompute_rope_1d(args: ChameleonArgs) -> Tensor:
    """[max_seq_len, head_dim // 2, 2] (cos, sin) of angle p * base^(-2i / head_dim), for apply_rope's pairs."""
    hd = args.head_dim
    freqs = 1.0 / (args.rope_base ** (torch.arange(0, hd, 2).float() / hd))
    angles = torch.outer(torch.arange(args.max_seq_len, dtype=torch.float32), freqs)
    return torch.stack([angles.cos(), angles.sin()], dim=-1)


def rope_positions(pos: Tensor, key_valid: Tensor | None, rows: Tensor | None, prompt_slots: int) -> Tensor:
    """Each row's RoPE positions [b, S] for the slot positions `pos` ([S] shared, or [b, S]): the slot minus the row's
    left padding (its hidden prompt slots among the first `prompt_slots`), 0 for padding itself."""
    if key_valid is None:
        return pos
    valid = key_valid if rows is None else key_valid[rows]
    shift = prompt_slots - valid[:, :prompt_slots].sum(-1, keepdim=True)
    return (pos if pos.ndim == 2 else pos[None]).sub(shift).clamp_min(0)


def image_logits(hidden: Tensor, weight: Tensor, args: ChameleonArgs, extra: Tensor) -> Tensor:
    """fp32 logits of the head's rows: lm_head rows image_offset .. + image_codes (a view, no copy), then `extra`."""
    lo = args.image_offset
    out = F.linear(hidden, weight[lo : lo + args.image_codes])
    if args.extra_ids:
        out = torch.cat([out, F.linear(hidden, weight.index_select(0, extra))], dim=-1)
    return out.float()


class Chameleon(GPT):
    """A Chameleon target through GPT's cache and passes (cond: prompt ids [B, T]; tokens: codes)."""

    def __init__(self, args: ChameleonArgs):
        nn.Module.__init__(self)  # GPT's condition embedders and 2-D RoPE do not apply
        self.args = args
        self.tok_embeddings = nn.Embedding(args.text_vocab, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(args, qk_norm=True, swin=args.swin_norm)
                                    for _ in range(args.n_layer))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.text_vocab, bias=False)  # the full lm_head
        self.register_buffer("head_ids", args.head_ids(), persistent=False)
        self.register_buffer("extra", torch.tensor(args.extra_ids, dtype=torch.long), persistent=False)
        self.rope = self.rope_table()
        self.cache_key_valid: Tensor | None = None
        self.pad_semantics = "upstream"
        self.feature_layers: tuple[int, ...] = ()
        self.apply(self._init_weights)

    def rope_table(self) -> Tensor:
        return precompute_rope_1d(self.args)

    # -- prompts and codes --------------------------------------------------------------------------------------
    def null_cond(self, batch: int, device=None) -> Tensor:
        """The CFG null prompt, left-padded to T: [batch, T] ids (its mask: cfg_mask)."""
        a = self.args
        if not a.uncond_prompt:
            raise UserError("this Chameleon target has no CFG null prompt (uncond_prompt); set sampling.cfg_scale: 1")
        row = [a.pad_id] * (a.cls_token_num - len(a.uncond_prompt)) + list(a.uncond_prompt)
        device = device or self.output.weight.device
        return torch.tensor(row, device=device).expand(batch, -1).clone()

    def null_mask(self, batch: int, device) -> Tensor:
        T, n = self.args.cls_token_num, len(self.args.uncond_prompt)
        return (torch.arange(T, device=device) >= T - n).expand(batch, -1)

    def cfg_mask(self, cond_mask: Tensor | None, batch: int) -> Tensor:
        """[cond; null] key masks: the null prompt is padded to T whatever the prompts' masks are."""
        raise_if_not_left_padded(cond_mask)
        device = self.output.weight.device if cond_mask is None else cond_mask.device
        null = self.null_mask(batch, device)
        return torch.cat([torch.ones_like(null) if cond_mask is None else cond_mask.bool(), null])

    def set_cond_mask(self, cond_mask: Tensor) -> None:
        raise_if_not_left_padded(cond_mask)
        super().set_cond_mask(cond_mask)

    def drop_cond(self, cond: Tensor, p: float, generator: torch.Generator | None = None) -> Tensor:
        if p:  # the null prompt has its own key mask: a dropped prompt without it would attend to stale slots
            raise RuntimeError("a Chameleon prompt drops with its key mask: call drop_conditions")
        return cond

    def drop_conditions(self, cond: Tensor, cond_mask: Tensor | None, p: float,
                        generator: torch.Generator | None = None) -> tuple[Tensor, Tensor | None]:
        """Each row replaced with probability p by the family's CFG null prompt (`null_cond`, Anole [<s>, boi],
        Lumina [boi, s, s]) and its key mask: the uncond row the authors' CFG runs and their drafter trains on."""
        if p == 0:
            return cond, cond_mask
        B, device = cond.shape[0], cond.device
        draw_on = generator.device if generator is not None else device
        drop = (torch.rand(B, device=draw_on, generator=generator) < p).to(device)[:, None]
        mask = torch.ones_like(cond, dtype=torch.bool) if cond_mask is None else cond_mask.bool()
        return torch.where(drop, self.null_cond(B, device), cond), torch.where(drop, self.null_mask(B, device), mask)

    def embed_cond(self, cond: Tensor) -> Tensor:
        return self.tok_embeddings(cond)

    def embed_tokens(self, tokens: Tensor) -> Tensor:
        return self.tok_embeddings(self.head_ids[tokens])

    def head(self, hidden: Tensor) -> Tensor:
        return image_logits(hidden, self.output.weight, self.args, self.extra)

    def full_logits(self, hidden: Tensor) -> Tensor:
        """Logits over the whole text vocabulary (what the HF model's lm_head gives)."""
        return self.output(hidden).float()

    # -- passes -------------------------------------------------------------------------------------------------
    def run(self, x: Tensor, pos: Tensor, mask: Tensor | None = None, slots: Tensor | None = None,
            rows: Tensor | None = None):
        """GPT.run at each row's own RoPE positions (rope_positions; the cache's key mask shows the padding)."""
        pos = rope_positions(pos, self.cache_key_valid, rows, self.args.cls_token_num)
        return super().run(x, pos, mask, slots, rows)

    def prefill_cond(self, cond_emb: Tensor, cond_mask: Tensor | None = None):
        """The prompt slots through the cache; a padding query sees only its own slot (its output is unused)."""
        T = cond_emb.shape[1]
        pos = torch.arange(T, device=cond_emb.device)
        return self.forward_cached(cond_emb, pos, pos, causal_mask(T, self.cache_len, cond_emb.device))

    def teacher_forced(self, cond: Tensor, tokens: Tensor, cond_mask: Tensor | None = None):
        """Uncached pass over prompts (ids [B, T], mask) then codes `tokens` [B, S']: (embeddings, logits, hidden)."""
        if self.cache_key_valid is not None:
            raise RuntimeError("teacher_forced runs without a cache; clear_cache() first")
        x = torch.cat([self.embed_cond(cond), self.embed_tokens(tokens)], dim=1)
        B, S = x.shape[:2]
        T = cond.shape[1]
        mask = cond_mask if cond_mask is not None else torch.ones(B, T, dtype=torch.bool, device=x.device)
        raise_if_not_left_padded(mask)
        valid = key_mask(mask, S)[:, 0, 0]
        attend = (causal_mask(S, S, x.device) & valid[:, None, :]) | torch.eye(S, dtype=torch.bool, device=x.device)
        pos = rope_positions(torch.arange(S, device=x.device), valid, None, T)
        logits, hidden = super().run(x, pos, attend[:, None])
        return x, logits, hidden


def raise_if_not_left_padded(cond_mask: Tensor | None) -> None:
    """Prompts must be left-padded (real tokens last): the RoPE shift counts the hidden prompt slots."""
    if cond_mask is not None and bool((cond_mask.long().diff(dim=-1) < 0).any()):
        raise UserError("Chameleon prompts must be left-padded (padding first, then the prompt's tokens)")


class ChameleonDrafter(Drafter):
    """The LANTERN authors' Chameleon drafter (cnets_anole / cnets_lumina_mgpt): fc(cat(embed(token p + 1), h_p))
    with bias, ONE Chameleon layer with its input RMSNorm and qk-norm, no final norm, the target's image head.
    Drafter position p sits at RoPE position p (that of h_p) minus the row's padding; over the prompt it reads the
    target's prompt embeddings (its own embedding is the target's frozen copy: the loader checks), after that its
    own embedding of the codes."""

    def __init__(self, args: ChameleonArgs):
        nn.Module.__init__(self)
        self.args, self.options = args, DrafterOptions(own_embedding=True)
        self.tok_embeddings = nn.Embedding(args.text_vocab, args.dim)
        self.fc = nn.Linear(2 * args.dim, args.dim, bias=True)
        self.layer = TransformerBlock(args, input_norm=True, qk_norm=True)
        self.fuse = None
        self.output: nn.Linear | None = None  # the target's lm_head, shared (copy_frozen)
        self.register_buffer("head_ids", args.head_ids(), persistent=False)
        self.register_buffer("extra", torch.tensor(args.extra_ids, dtype=torch.long), persistent=False)
        self.rope = precompute_rope_1d(args)
        self.cache_key_valid: Tensor | None = None
        for m in (self.fc, *self.layer.modules()):
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
        nn.init.zeros_(self.fc.bias)

    @classmethod
    def from_target(cls, target: Chameleon, options=None) -> "ChameleonDrafter":
        """A drafter with fresh weights for `target` (its embedding a copy of the target's); the authors' drafter
        has no options (no feature layers, no own condition inputs)."""
        if options is not None and options != DrafterOptions(own_embedding=True):
            raise UserError(f"the Chameleon drafter takes no drafter options (got {options})")
        w = target.output.weight
        d = cls(target.args).to(device=w.device, dtype=w.dtype)
        with torch.no_grad():
            d.tok_embeddings.weight.copy_(target.tok_embeddings.weight)
        d.copy_frozen(target)
        return d

    def copy_frozen(self, target: Chameleon) -> None:
        """Share the target's lm_head (not a copy: 0.5 GB at 7B); the embedding stays the drafter's own."""
        if target.args != self.args:
            raise UserError("this Chameleon drafter was built for another target layout; build it from the target")
        target.feature_layers = ()
        self.output = target.output
        self.tok_embeddings.requires_grad_(False)

    def head(self, hidden: Tensor) -> Tensor:
        # in the head's dtype: training keeps fp32 weights beside a bf16 target (the shared lm_head)
        return image_logits(hidden.to(self.output.weight.dtype), self.output.weight, self.args, self.extra)

    def embed_tokens(self, tokens: Tensor) -> Tensor:
        return self.tok_embeddings(self.head_ids[tokens])

    def cond_inputs(self, cond_emb: Tensor) -> Tensor:
        return cond_emb[:, 1:].to(self.fc.weight.dtype)

    def padding_mask(self, cond_mask: Tensor | None, S: int) -> Tensor | None:
        """The uncached (training) pass's mask, as cached drafting keys it (set_cond_mask): position p is valid
        where prompt slot p is, unshifted (it reads h_p, a padding slot's state when slot p is padding)."""
        if cond_mask is None:
            return None
        valid = key_mask(cond_mask[:, : cond_mask.shape[1] - 1], S)
        return (causal_mask(S, S, cond_mask.device) & valid) | torch.eye(S, dtype=torch.bool, device=cond_mask.device)

    def uncached_positions(self, cond_mask: Tensor | None, S: int) -> Tensor:
        """Each row's positions [B, S] in the uncached pass: those cached drafting gives (the row's padding taken
        off), so training rotates as decoding does."""
        pos = torch.arange(S, device=self.fc.weight.device)
        if cond_mask is None:
            return pos
        T = cond_mask.shape[1]
        return rope_positions(pos, cond_mask[:, : T - 1].bool(), None, T - 1)

    def set_cond_mask(self, cond_mask: Tensor | None) -> None:
        """Drafter position p reads h_p and token p + 1: valid where prompt slot p is (left padding), unshifted."""
        if cond_mask is not None:
            T = cond_mask.shape[1]
            self.cache_key_valid[:, : T - 1] = cond_mask[:, : T - 1].bool()

    def _run(self, emb: Tensor, hidden: Tensor, pos: Tensor, mask: Tensor | None, slots: Tensor | None,
             rows: Tensor | None = None) -> Tensor:
        x = self.fc(torch.cat([emb, hidden.to(emb.dtype)], dim=-1))
        rope = self.rope[rope_positions(pos, self.cache_key_valid, rows, self.args.cls_token_num - 1)]
        return self.layer(x, rope, mask, row_slots(slots, rows, self.layer.attention.kv_cache), rows)
