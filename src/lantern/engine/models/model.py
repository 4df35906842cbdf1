"""LlamaGen GPT (class- and text-conditional) with 2-D RoPE and one static KV cache for every decoder.

Parameter names and shapes follow the public LlamaGen checkpoints exactly, so their files load unchanged.
Sequence layout: [cond_0 .. cond_{T-1}, img_0 .. img_{N-2}]; the last condition position predicts img_0.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from lantern.errors import UserError


# Caption positions of LlamaGen t2i (FLAN-T5-XL features), also the rows of its uncond_embedding.
UPSTREAM_CAPTION_TOKENS = 120


def find_multiple(n: int, k: int) -> int:
    return n if n % k == 0 else n + k - (n % k)


@dataclass(frozen=True)
class ModelArgs:
    dim: int = 768
    n_layer: int = 12
    n_head: int = 12
    vocab_size: int = 16384
    num_classes: int = 1000
    model_type: str = "c2i"  # "c2i" (class ids) or "t2i" (caption features)
    # Condition positions T; None: upstream's 1 for c2i, 120 for t2i. A t2i null caption has exactly T rows.
    cls_token_num: int | None = None
    image_tokens: int = 256  # N, a perfect square (16 x 16 for 256 px with VQ-16)
    caption_dim: int = 2048
    class_dropout_prob: float = 0.1
    # c2i: the class table has the CFG null row (row num_classes); upstream omits it when trained without dropout.
    null_class: bool = True
    multiple_of: int = 256
    norm_eps: float = 1e-5
    rope_base: float = 10000.0

    def __post_init__(self):
        if self.cls_token_num is None:
            object.__setattr__(self, "cls_token_num", 1 if self.model_type == "c2i" else UPSTREAM_CAPTION_TOKENS)
        grid = math.isqrt(self.image_tokens)
        if grid * grid != self.image_tokens:
            raise UserError(f"image_tokens={self.image_tokens} is not a perfect square; use e.g. 64, 256, 1024")
        if self.dim % self.n_head or (self.dim // self.n_head) % 4:
            raise UserError(f"dim={self.dim} must split into n_head={self.n_head} heads of a size divisible by 4")
        if self.model_type not in ("c2i", "t2i"):
            raise UserError(f"model_type must be 'c2i' or 't2i', got {self.model_type!r}")
        if self.model_type == "c2i" and self.cls_token_num != 1:
            raise UserError("a class-conditional (c2i) model has exactly one condition token: set cls_token_num: 1")
        if not self.null_class and (self.model_type == "t2i" or self.class_dropout_prob > 0):
            raise UserError(
                "null_class: false needs a c2i model with class_dropout_prob: 0 (dropped classes use the null row, "
                "and a t2i model always has its null caption)"
            )

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    @property
    def ffn_dim(self) -> int:
        return find_multiple(int(2 * 4 * self.dim / 3), self.multiple_of)

    @property
    def grid(self) -> int:
        return math.isqrt(self.image_tokens)

    @property
    def max_seq_len(self) -> int:
        """Positions the model ever sees: T condition positions plus N - 1 image inputs, plus one spare row."""
        return self.cls_token_num + self.image_tokens

    def to_dict(self) -> dict:
        return asdict(self)


# Upstream sizes (layers, heads, dim); the 3B model has head_dim 100.
GPT_SIZES = {
    "GPT-B": dict(n_layer=12, n_head=12, dim=768),
    "GPT-L": dict(n_layer=24, n_head=16, dim=1024),
    "GPT-XL": dict(n_layer=36, n_head=20, dim=1280),
    "GPT-XXL": dict(n_layer=48, n_head=24, dim=1536),
    "GPT-3B": dict(n_layer=24, n_head=32, dim=3200),
}


def named_args(size: str, **overrides) -> ModelArgs:
    if size not in GPT_SIZES:
        raise UserError(f"unknown model size {size!r}; choose one of {', '.join(GPT_SIZES)} or give dim/n_layer/n_head")
    return ModelArgs(**{**GPT_SIZES[size], **overrides})


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return out.type_as(x) * self.weight


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.w1 = nn.Linear(args.dim, args.ffn_dim, bias=False)
        self.w3 = nn.Linear(args.dim, args.ffn_dim, bias=False)
        self.w2 = nn.Linear(args.ffn_dim, args.dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def precompute_rope_2d(args: ModelArgs) -> Tensor:
    """[T + N, head_dim // 2, 2] (cos, sin); condition rows are all zero, as upstream (q = k = 0 there)."""
    half = args.head_dim // 2
    freqs = 1.0 / (args.rope_base ** (torch.arange(0, half, 2)[: half // 2].float() / half))
    t = torch.arange(args.grid, dtype=torch.float32)
    f = torch.outer(t, freqs)  # [grid, head_dim // 4]
    g = args.grid
    grid_angles = torch.cat([f[:, None, :].expand(-1, g, -1), f[None, :, :].expand(g, -1, -1)], dim=-1)
    table = torch.stack([grid_angles.cos(), grid_angles.sin()], dim=-1).flatten(0, 1)
    return torch.cat([torch.zeros(args.cls_token_num, half, 2), table])


def apply_rope(x: Tensor, rope: Tensor) -> Tensor:
    """x [B, S, H, hd]; rope [S, hd // 2, 2], or [B, S, hd // 2, 2] for per-row positions; pairs are interleaved
    (x[2j], x[2j+1])."""
    xs = x.float().reshape(*x.shape[:-1], -1, 2)
    r = rope.view(rope.shape[0] if rope.ndim == 4 else 1, xs.size(1), 1, xs.size(3), 2)
    if torch.compiler.is_compiling():  # inductor fuses the real rotation into one kernel (it emits no complex code)
        out = torch.stack([xs[..., 0] * r[..., 0] - xs[..., 1] * r[..., 1],
                           xs[..., 1] * r[..., 0] + xs[..., 0] * r[..., 1]], dim=-1)
    else:  # eager: one complex product, the same numbers as the four products and two sums, 4-7x faster
        out = torch.view_as_real(torch.view_as_complex(xs) * torch.view_as_complex(r))
    return out.flatten(3).type_as(x)


@dataclass(frozen=True)
class RowSlots:
    """Per-row cache slots of one pass as one flat index into a layer's cache viewed [rows * H * max_len, hd], in
    k's [b, H, S] order: built once per pass (row_slots) and shared by every layer, whose write is then one
    index_copy_ (an advanced-index assignment per layer cost a 32-layer target's 5-position verify about 0.5 ms
    at batch 1 on a CPU, 7 % of a step)."""

    flat: Tensor


def row_slots(slots: Tensor | None, rows: Tensor | None, cache: KVCache | None) -> Tensor | RowSlots | None:
    """A pass's slots as KVCache.update takes them: [S] (shared by all rows) unchanged, per-row [b, S] of the cache
    rows `rows` [b] (None: every row) as a RowSlots."""
    if slots is None or slots.ndim == 1 or cache is None:
        return slots
    R, H, L, _ = cache.k.shape
    r = torch.arange(R, device=slots.device) if rows is None else rows
    heads = torch.arange(H, device=slots.device)
    return RowSlots(((r[:, None, None] * H + heads[None, :, None]) * L + slots[:, None, :]).reshape(-1))


class KVCache(nn.Module):
    """Static per-layer key/value storage [B, H, S, hd] shared by every decoder.

    Slots are written at arbitrary indices (a block of tree nodes at once) and later compacted with `keep`, so
    a verified tree path ends up contiguous, exactly as if its tokens had been decoded one by one.
    """

    def __init__(self, batch: int, n_head: int, max_len: int, head_dim: int, dtype: torch.dtype, device):
        super().__init__()
        shape = (batch, n_head, max_len, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def update(self, slots: Tensor | RowSlots, k: Tensor, v: Tensor, rows: Tensor | None = None
               ) -> tuple[Tensor, Tensor]:
        """Write k, v [b, H, S, hd] at `slots` [S] (shared by all rows), or at per-row slots (RowSlots, from [b, S])
        of the cache rows `rows` [b] (None: every row, in order); returns the keys and values of those rows."""
        if isinstance(slots, Tensor):
            self.k[:, :, slots] = k
            self.v[:, :, slots] = v
            return self.k, self.v
        hd = k.shape[-1]
        self.k.view(-1, hd).index_copy_(0, slots.flat, k.reshape(-1, hd))
        self.v.view(-1, hd).index_copy_(0, slots.flat, v.reshape(-1, hd))
        return (self.k, self.v) if rows is None else (self.k.index_select(0, rows), self.v.index_select(0, rows))

    def keep(self, src: Tensor, dst_start: int) -> None:
        n = src.numel()
        self.k[:, :, dst_start : dst_start + n] = self.k[:, :, src]
        self.v[:, :, dst_start : dst_start + n] = self.v[:, :, src]

    def keep_rows(self, rows: Tensor, src: Tensor, dst: Tensor) -> None:
        """`keep` with its own moves per cache row: entry j copies slot src[j] of row rows[j] to slot dst[j] (all
        [M]); every source is read before any destination is written."""
        self.k[rows, :, dst] = self.k[rows, :, src]
        self.v[rows, :, dst] = self.v[rows, :, src]


class HeadNorm(nn.Module):
    """Chameleon's qk-norm: each head's vector layer-normalised over head_dim (no affine inside, eps 1e-5 as
    transformers' ChameleonLayerNorm), then that head's own gamma and beta [n_head, head_dim]."""

    def __init__(self, n_head: int, head_dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(n_head, head_dim))
        self.bias = nn.Parameter(torch.zeros(n_head, head_dim))

    def forward(self, x: Tensor) -> Tensor:  # x [B, S, H, hd]
        return F.layer_norm(x, x.shape[-1:], eps=self.eps) * self.weight + self.bias


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, qk_norm: bool = False):
        super().__init__()
        self.n_head, self.head_dim = args.n_head, args.head_dim
        self.wqkv = nn.Linear(args.dim, 3 * args.dim, bias=False)
        self.wo = nn.Linear(args.dim, args.dim, bias=False)
        # Chameleon normalises q and k per head before RoPE (engine/models/chameleon.py); LlamaGen does not.
        self.q_norm = HeadNorm(args.n_head, args.head_dim) if qk_norm else None
        self.k_norm = HeadNorm(args.n_head, args.head_dim) if qk_norm else None
        self.kv_cache: KVCache | None = None

    def forward(self, x: Tensor, rope: Tensor, mask: Tensor | None, slots: Tensor | None,
                rows: Tensor | None = None) -> Tensor:
        B, S, D = x.shape
        q, k, v = self.wqkv(x).split(D, dim=-1)
        q, k = q.view(B, S, self.n_head, self.head_dim), k.view(B, S, self.n_head, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rope(q, rope).transpose(1, 2)
        k = apply_rope(k, rope).transpose(1, 2)
        v = v.view(B, S, self.n_head, self.head_dim).transpose(1, 2)
        if self.kv_cache is not None:
            k, v = self.kv_cache.update(slots, k, v, rows)
        if mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.wo(y.transpose(1, 2).reshape(B, S, D))


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs, input_norm: bool = True, qk_norm: bool = False, swin: bool = False):
        super().__init__()
        self.attention = Attention(args, qk_norm)
        self.feed_forward = FeedForward(args)
        # The EAGLE drafter's single layer has no input norm; the target's layers all have one.
        self.attention_norm = RMSNorm(args.dim, args.norm_eps) if input_norm else nn.Identity()
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        # Chameleon's swin_norm variant: the same two norms applied to each sub-block's output, before the residual.
        self.swin = swin

    def forward(self, x: Tensor, rope: Tensor, mask: Tensor | None, slots: Tensor | None,
                rows: Tensor | None = None) -> Tensor:
        if self.swin:
            h = x + self.attention_norm(self.attention(x, rope, mask, slots, rows))
            return h + self.ffn_norm(self.feed_forward(h))
        h = x + self.attention(self.attention_norm(x), rope, mask, slots, rows)
        return h + self.feed_forward(self.ffn_norm(h))


class LabelEmbedder(nn.Module):
    def __init__(self, num_classes: int, dim: int, null_class: bool):
        super().__init__()
        # Row num_classes, when present, is the CFG null class.
        self.embedding_table = nn.Embedding(num_classes + int(null_class), dim)

    def forward(self, labels: Tensor) -> Tensor:
        return self.embedding_table(labels).unsqueeze(1)


class CaptionEmbedder(nn.Module):
    """Projects caption features (FLAN-T5-XL upstream) into the model width; `uncond_embedding` is the null caption."""

    def __init__(self, caption_dim: int, dim: int, token_num: int):
        super().__init__()
        self.cap_proj = nn.Module()
        self.cap_proj.fc1 = nn.Linear(caption_dim, dim, bias=False)
        self.cap_proj.fc2 = nn.Linear(dim, dim, bias=False)
        self.register_buffer("uncond_embedding", torch.randn(token_num, caption_dim) / caption_dim**0.5)

    def forward(self, captions: Tensor) -> Tensor:
        return self.cap_proj.fc2(F.gelu(self.cap_proj.fc1(captions), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        if args.model_type == "c2i":
            self.cls_embedding = LabelEmbedder(args.num_classes, args.dim, args.null_class)
        else:
            self.cls_embedding = CaptionEmbedder(args.caption_dim, args.dim, args.cls_token_num)
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(args) for _ in range(args.n_layer))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        # Not a registered buffer upstream, so it never appears in checkpoints.
        self.rope = self.rope_table()
        self.cache_key_valid: Tensor | None = None
        # What a left-padded caption query sees in the prefill (PAD_SEMANTICS): upstream's own position only, or
        # the LANTERN authors' HF target's (their drafter was trained on those states); set by the decoders' user.
        self.pad_semantics = "upstream"
        # Layers whose outputs `run` hands on beside the post-norm hidden state (concatenated before it), for a
        # drafter that fuses them (DrafterOptions.feature_layers); set by the drafter (Drafter.copy_frozen).
        self.feature_layers: tuple[int, ...] = ()
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def _apply(self, fn, *a, **kw):
        # Keep the RoPE table on the model's device (fp32) without making it part of the state dict.
        out = super()._apply(fn, *a, **kw)
        probe = self.norm.weight
        if probe.device.type != "meta":
            if self.rope.device.type == "meta":  # built on the meta device, now materialised
                self.rope = self.rope_table()
            self.rope = self.rope.to(probe.device)
        return out

    def rope_table(self) -> Tensor:
        """The RoPE (cos, sin) rows `run` indexes by position (fp32, never in the state dict)."""
        return precompute_rope_2d(self.args)

    # -- embeddings -------------------------------------------------------------------------------------------
    def cfg_mask(self, cond_mask: Tensor | None, batch: int) -> Tensor | None:
        """The key mask of the `batch` CFG rows [cond; null cond] (generate.cfg_rows): a null caption is padded as
        its caption is (upstream), a class needs no mask."""
        return None if cond_mask is None else torch.cat([cond_mask, cond_mask])

    def null_cond(self, batch: int, device=None) -> Tensor:
        """The CFG unconditional condition: the null class id, or the null caption features.

        Every CFG path (the decoders through generate.cfg_rows, the analyses) comes through here, so a c2i model
        without a null row stops here, before any forward pass.
        """
        device = device or self.output.weight.device
        if self.args.model_type == "c2i":
            if not self.args.null_class:
                raise UserError(
                    f"the target checkpoint has no null class row (its class table has {self.args.num_classes} rows: "
                    "trained without class dropout), so it cannot run classifier-free guidance; "
                    "set sampling.cfg_scale: 1"
                )
            return torch.full((batch,), self.args.num_classes, dtype=torch.long, device=device)
        return self.cls_embedding.uncond_embedding.expand(batch, -1, -1).clone()

    def drop_cond(self, cond: Tensor, p: float, generator: torch.Generator | None = None) -> Tensor:
        """Replace conditions by the null condition with probability p (classifier-free guidance training)."""
        if p == 0:  # what lets a model without a null row train a drafter
            return cond
        if self.args.model_type == "c2i" and not self.args.null_class:
            raise UserError(
                f"condition dropout (p={p}) needs a null class row, which this c2i checkpoint lacks; "
                "use it with class_dropout_prob: 0"
            )
        # drawn on the generator's device (a CPU generator cannot draw on CUDA), then moved to the condition's
        draw_on = generator.device if generator is not None else cond.device
        drop = (torch.rand(cond.shape[0], device=draw_on, generator=generator) < p).to(cond.device)
        null = self.null_cond(cond.shape[0], cond.device)
        if self.args.model_type == "c2i":
            return torch.where(drop, null, cond)
        return torch.where(drop[:, None, None], null.to(cond.dtype), cond)

    def drop_conditions(self, cond: Tensor, cond_mask: Tensor | None, p: float,
                        generator: torch.Generator | None = None) -> tuple[Tensor, Tensor | None]:
        """drop_cond with the conditions' mask: (conditions, mask); a caption's mask stays (its null row is
        learned over every slot)."""
        return self.drop_cond(cond, p, generator), cond_mask

    def embed_cond(self, cond: Tensor) -> Tensor:
        return self.cls_embedding(cond)

    def embed_tokens(self, tokens: Tensor) -> Tensor:
        return self.tok_embeddings(tokens)

    def head(self, hidden: Tensor) -> Tensor:
        return self.output(hidden).float()

    # -- forward passes ---------------------------------------------------------------------------------------
    def run(self, x: Tensor, pos: Tensor, mask: Tensor | None = None, slots: Tensor | None = None,
            rows: Tensor | None = None):
        """Transformer over embeddings x [B, S, dim] at RoPE positions `pos` [S]; returns (logits, post-norm hidden),
        the hidden state [B, S, (len(feature_layers) + 1) * dim] when feature layers are set: their outputs, then it.

        With a cache set up, `slots` [S] are the cache slots written and `mask` [B or 1, 1, S, max_len] the keys
        each query may see. Without a cache, mask None means plain causal attention over x. Per-row positions:
        pos and slots [B, S], x being the cache rows `rows` (see forward_rows).
        """
        rope = self.rope[pos]
        if mask is not None and mask.dtype == torch.bool:
            mask = additive_mask(mask, x.dtype)
        slots = row_slots(slots, rows, self.layers[0].attention.kv_cache)
        kept = []
        for i, layer in enumerate(self.layers):
            x = layer(x, rope, mask, slots, rows)
            if i in self.feature_layers:
                kept.append(x)
        hidden = self.norm(x)
        return self.head(hidden), torch.cat([*kept, hidden], dim=-1) if kept else hidden

    def forward(self, cond: Tensor, tokens: Tensor, cond_mask: Tensor | None = None):
        """Teacher-forced pass. tokens = img[:, :-1] ([B, N-1]); returns logits [B, N, V] predicting img_0..img_{N-1}."""
        T = self.args.cls_token_num
        _, logits, hidden = self.teacher_forced(cond, tokens, cond_mask)
        return logits[:, T - 1 :], hidden[:, T - 1 :]

    def teacher_forced(self, cond: Tensor, tokens: Tensor, cond_mask: Tensor | None = None):
        """Teacher-forced pass keeping every position: (input embeddings, logits, post-norm hidden), each
        [B, T + N - 1, ...] for tokens = img[:, :-1]."""
        x = torch.cat([self.embed_cond(cond), self.embed_tokens(tokens)], dim=1)
        S = x.shape[1]
        mask = None
        if cond_mask is not None:
            mask = causal_mask(S, S, x.device) & key_mask(cond_mask, S)
            mask = mask | torch.eye(S, dtype=torch.bool, device=x.device)
        logits, hidden = self.run(x, torch.arange(S, device=x.device), mask)
        return x, logits, hidden

    # -- cache management -------------------------------------------------------------------------------------
    def setup_cache(self, batch: int, dtype: torch.dtype | None = None, extra: int = 0) -> None:
        """Allocate a fresh cache for `batch` rows; `extra` spare slots hold unverified draft-tree nodes."""
        p = self.output.weight
        max_len = self.args.max_seq_len + extra
        for layer in self.layers:
            layer.attention.kv_cache = KVCache(batch, self.args.n_head, max_len, self.args.head_dim, dtype or p.dtype, p.device)
        self.cache_key_valid = torch.ones(batch, max_len, dtype=torch.bool, device=p.device)

    def clear_cache(self) -> None:
        for layer in self.layers:
            layer.attention.kv_cache = None
        self.cache_key_valid = None

    @property
    def cache_len(self) -> int:
        return self.layers[0].attention.kv_cache.k.shape[2]

    def prefill_cond(self, cond_emb: Tensor, cond_mask: Tensor | None = None):
        """The condition positions 0 .. T - 1 through the cache (slots 0 .. T - 1); returns (logits, hidden) [R, T].
        A left-padded query row's state depends on `pad_semantics` (authors_prefill_mask); every other row's, and
        so every image token, does not: valid queries never see padded keys."""
        T = cond_emb.shape[1]
        pos = torch.arange(T, device=cond_emb.device)
        if self.pad_semantics == "upstream" or cond_mask is None:
            return self.forward_cached(cond_emb, pos, pos, causal_mask(T, self.cache_len, cond_emb.device))
        mask = authors_prefill_mask(cond_mask.bool(), self.cache_len, self.output.weight.dtype)
        return self.run(cond_emb, pos, mask, pos)

    def set_cond_mask(self, cond_mask: Tensor) -> None:
        """Hide left-padding caption positions from every query (upstream semantics for t2i)."""
        self.cache_key_valid[:, : cond_mask.shape[1]] = cond_mask.bool()

    def keep(self, src: Tensor, dst_start: int) -> None:
        for layer in self.layers:
            layer.attention.kv_cache.keep(src, dst_start)

    def keep_rows(self, rows: Tensor, src: Tensor, dst: Tensor) -> None:
        """Per-row `keep` (batched draft trees): cache row rows[j]'s slot src[j] moves to slot dst[j]."""
        for layer in self.layers:
            layer.attention.kv_cache.keep_rows(rows, src, dst)

    def forward_cached(self, x: Tensor, pos: Tensor, slots: Tensor, visible: Tensor):
        """Cached pass: embeddings x [B, S, dim] at RoPE positions `pos`, written to `slots`.

        visible [S, max_len] bool says which cache slots each query attends to (causal prefix, or prefix plus
        tree ancestors). A query always sees its own slot, so fully padded conditions never give NaN.
        """
        own = own_slots(slots, visible.shape[-1])
        mask = (visible[None, None] & self.cache_key_valid[:, None, None, :]) | own[None, None]
        return self.run(x, pos, mask, slots)

    def forward_rows(self, x: Tensor, pos: Tensor, slots: Tensor, visible: Tensor, rows: Tensor | None = None):
        """Cached pass where every row has its own positions (batched speculative decoding, rounds.py): x [b, S, dim]
        feeds the cache rows `rows` [b] (None: all rows, in order) at RoPE positions pos [b, S], written to slots
        [b, S]; visible [b, S, max_len]. Rows not in `rows` are neither read nor written."""
        key_valid = self.cache_key_valid if rows is None else self.cache_key_valid[rows]
        return self.run(x, pos, row_mask(visible, slots, key_valid), slots, rows)


def row_mask(visible: Tensor, slots: Tensor, key_valid: Tensor) -> Tensor:
    """[b, 1, S, max_len] attention mask of a per-row pass: visible [b, S, max_len] keys that are valid (key_valid
    [b, max_len]), and each query's own slot (slots [b, S]), so fully padded conditions never give NaN."""
    own = torch.zeros_like(visible).scatter_(2, slots[..., None], True)
    return ((visible & key_valid[:, None, :]) | own)[:, None]


PAD_SEMANTICS = ("upstream", "authors")


def authors_prefill_mask(cond_mask: Tensor, k_len: int, dtype: torch.dtype) -> Tensor:
    """[R, 1, T, k_len] keys the condition prefill's queries see under the LANTERN authors' HF target.

    Their target adds a causal and a padding float mask, each finfo.min where a key is hidden, the causal one in
    fp32 and the padding one in the model's dtype. A valid query sees the valid keys up to itself, as upstream. A
    left-padded query i hides every key, at different levels: past padded keys sit at the padding minimum, later
    padded keys at -inf, later valid keys at the fp32 minimum. In fp32 both minima are equal, so softmax spreads
    uniformly over the padded keys up to i and the later valid keys; in bf16 / fp16 the padding minimum is the
    larger, and the row averages the padded keys up to i. The attention scores there are all zero (condition
    positions have q = k = 0), so a uniform average is exactly what seeing those keys gives.
    """
    R, T = cond_mask.shape
    device = cond_mask.device
    causal = causal_mask(T, k_len, device)[None]  # [1, T, k_len]
    valid = torch.zeros(R, k_len, dtype=torch.bool, device=device)
    valid[:, :T] = cond_mask
    mask = causal & valid[:, None, :]  # valid queries: upstream's rule
    padded_row = ~cond_mask[:, :, None]  # [R, T, 1]
    padded_key = torch.zeros(R, k_len, dtype=torch.bool, device=device)
    padded_key[:, :T] = ~cond_mask
    seen = causal & padded_key[:, None, :]
    if dtype == torch.float32:
        seen = seen | valid[:, None, :]
    return torch.where(padded_row, seen, mask)[:, None]


def own_slots(slots: Tensor, max_len: int) -> Tensor:
    """[S, max_len] bool: query j's own cache slot slots[j]. Built by comparison: an indexed assignment of a Python
    True copies the scalar to the device and blocks, once per pass (found by CUDA's sync debug mode)."""
    return torch.arange(max_len, device=slots.device) == slots[:, None]


def additive_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """The additive form of a boolean attention mask (0 where visible, -inf elsewhere): the values SDPA itself
    derives from a boolean mask, made once per pass rather than by every layer (on a CPU, with a deep target, the
    per-layer conversion cost a verify over 5 positions as much as 15 % of a step)."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


def causal_mask(q_len: int, k_len: int, device, start: int = 0) -> Tensor:
    """[q_len, k_len]: query i (at position start + i) sees keys 0 .. start + i."""
    q = torch.arange(q_len, device=device)[:, None] + start
    return torch.arange(k_len, device=device)[None, :] <= q


def key_mask(cond_mask: Tensor, k_len: int) -> Tensor:
    """[B, 1, 1, k_len]: padded condition positions are hidden; image positions always visible."""
    B, T = cond_mask.shape
    valid = torch.ones(B, k_len, dtype=torch.bool, device=cond_mask.device)
    valid[:, :T] = cond_mask.bool()
    return valid[:, None, None, :]


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
