"""An upstream-style LlamaGen GPT for the tests: a `Transformer` built from a `ModelArgs`, with upstream's module
names (so its state dict has the released files' keys), its attributes (`config`, `block_size`, `cls_token_num`),
its call convention (`forward(idx, cond_idx, input_pos)`, `setup_caches`) and its sampling loop (`generate`: prefill,
then one cached token at a time, CFG rows stacked as [cond; uncond]). Written for these tests from the format facts in
shared/reference/llamagen-format.md, independently of lantern's own GPT, so that agreeing with it means something:
nothing here imports lantern.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


def round_up(n: int, k: int) -> int:
    return n if n % k == 0 else n + k - n % k


@dataclass
class ModelArgs:
    dim: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_kv_head: int | None = None
    multiple_of: int = 256
    ffn_dim_multiplier: float | None = None
    rope_base: float = 10000
    norm_eps: float = 1e-5
    num_classes: int = 1000
    caption_dim: int = 2048
    class_dropout_prob: float = 0.1
    model_type: str = "c2i"
    vocab_size: int = 16384
    cls_token_num: int = 1
    block_size: int = 256


class LabelEmbedder(nn.Module):
    def __init__(self, num_classes: int, dim: int, dropout_prob: float):
        super().__init__()
        self.embedding_table = nn.Embedding(num_classes + int(dropout_prob > 0), dim)  # last row: the null class

    def forward(self, labels):
        return self.embedding_table(labels)[:, None]


class MLP(nn.Module):
    def __init__(self, cin: int, hidden: int, cout: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(cin, hidden, bias=False), nn.Linear(hidden, cout, bias=False)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class CaptionEmbedder(nn.Module):
    def __init__(self, caption_dim: int, dim: int, tokens: int):
        super().__init__()
        self.cap_proj = MLP(caption_dim, dim, dim)
        self.register_buffer("uncond_embedding", torch.randn(tokens, caption_dim) / caption_dim ** 0.5)

    def forward(self, captions):
        return self.cap_proj(captions)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class FeedForward(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        hidden = round_up(int(2 * 4 * a.dim / 3), a.multiple_of)
        self.w1, self.w3 = nn.Linear(a.dim, hidden, bias=False), nn.Linear(a.dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, a.dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class KVCache(nn.Module):
    def __init__(self, batch: int, length: int, heads: int, head_dim: int, dtype):
        super().__init__()
        self.register_buffer("k_cache", torch.zeros(batch, heads, length, head_dim, dtype=dtype))
        self.register_buffer("v_cache", torch.zeros(batch, heads, length, head_dim, dtype=dtype))

    def update(self, pos, k, v):
        self.k_cache[:, :, pos] = k
        self.v_cache[:, :, pos] = v
        return self.k_cache, self.v_cache


def rope_2d(grid: int, head_dim: int, base: float, cond_tokens: int) -> torch.Tensor:
    """[cond_tokens + grid * grid, head_dim / 2, 2] (cos, sin): cell (r, c) turns by concat(r f, c f); the
    condition rows are all zero."""
    quarter = head_dim // 4
    f = 1.0 / base ** (torch.arange(quarter).float() * 2 / (head_dim // 2))
    r, c = torch.meshgrid(torch.arange(grid).float(), torch.arange(grid).float(), indexing="ij")
    angles = torch.cat([r.reshape(-1, 1) * f, c.reshape(-1, 1) * f], dim=1)
    table = torch.stack([angles.cos(), angles.sin()], dim=-1)
    return torch.cat([torch.zeros(cond_tokens, head_dim // 2, 2), table])


def rotate(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """x [B, S, H, D], table [S, D / 2, 2]: each interleaved pair (x[2j], x[2j + 1]) turned by its angle."""
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    cos, sin = table[None, :, None, :, 0], table[None, :, None, :, 1]
    out = torch.stack([pairs[..., 0] * cos - pairs[..., 1] * sin, pairs[..., 1] * cos + pairs[..., 0] * sin], -1)
    return out.flatten(3).type_as(x)


class Attention(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.n_head, self.head_dim, self.dim = a.n_head, a.dim // a.n_head, a.dim
        self.wqkv = nn.Linear(a.dim, 3 * a.dim, bias=False)
        self.wo = nn.Linear(a.dim, a.dim, bias=False)
        self.kv_cache = None

    def forward(self, x, table, pos=None, mask=None):
        B, S, _ = x.shape
        q, k, v = (t.view(B, S, self.n_head, self.head_dim) for t in self.wqkv(x).split(self.dim, dim=-1))
        q, k = rotate(q, table), rotate(k, table)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if self.kv_cache is not None:
            k, v = self.kv_cache.update(pos, k, v)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        return self.wo(out.transpose(1, 2).reshape(B, S, self.dim))


class TransformerBlock(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.attention, self.feed_forward = Attention(a), FeedForward(a)
        self.attention_norm, self.ffn_norm = RMSNorm(a.dim, a.norm_eps), RMSNorm(a.dim, a.norm_eps)

    def forward(self, x, table, pos=None, mask=None):
        h = x + self.attention(self.attention_norm(x), table, pos, mask)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, config: ModelArgs):
        super().__init__()
        self.config, self.block_size, self.cls_token_num = config, config.block_size, config.cls_token_num
        self.model_type, self.num_classes = config.model_type, config.num_classes
        if config.model_type == "c2i":
            self.cls_embedding = LabelEmbedder(config.num_classes, config.dim, config.class_dropout_prob)
        else:
            self.cls_embedding = CaptionEmbedder(config.caption_dim, config.dim, config.cls_token_num)
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(TransformerBlock(config) for _ in range(config.n_layer))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        # a plain attribute, as upstream: not in the state dict
        self.freqs_cis = rope_2d(math.isqrt(config.block_size), config.dim // config.n_head, config.rope_base,
                                 config.cls_token_num)

    def setup_caches(self, max_batch_size: int, max_seq_length: int, dtype):
        length = round_up(max_seq_length, 8)
        for layer in self.layers:
            layer.attention.kv_cache = KVCache(max_batch_size, length, self.config.n_head,
                                               self.config.dim // self.config.n_head, dtype)
        self.causal_mask = torch.tril(torch.ones(length, length, dtype=torch.bool))[None].repeat(max_batch_size, 1, 1)

    def forward(self, idx, cond_idx, input_pos=None):
        """Both idx and cond_idx: one causal pass over [condition, idx] (training; upstream's eval mode needs
        input_pos = arange(length) here), logits at every position. Else the cached inference path: a prefill (idx
        None) or one token (cond_idx None) at `input_pos`."""
        T = self.cls_token_num
        if idx is not None and cond_idx is not None:
            h = torch.cat([self.cls_embedding(cond_idx)[:, :T], self.tok_embeddings(idx)], dim=1)
            table = self.freqs_cis[: h.shape[1]] if input_pos is None else self.freqs_cis[input_pos]
            mask = None
        else:
            h = self.cls_embedding(cond_idx)[:, :T] if cond_idx is not None else self.tok_embeddings(idx)
            table, mask = self.freqs_cis[input_pos], self.causal_mask[: h.shape[0], None, input_pos]
        for layer in self.layers:
            h = layer(h, table, input_pos, mask)
        return self.output(self.norm(h)).float(), None


def _pick(logits, temperature: float, top_k: int):
    """Upstream's sampling with top-k 1: the argmax (no ties in random logits)."""
    logits = logits / max(temperature, 1e-5)
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(-1), 1)


@torch.no_grad()
def generate(model: Transformer, cond, max_new_tokens: int, cfg_scale: float = 1.0, cfg_interval: int = -1,
             temperature: float = 1.0, top_k: int = 0):
    """Upstream's loop: class ids `cond` [B] -> tokens [B, max_new_tokens]; CFG rows [cond; null class]."""
    T, guided = model.cls_token_num, cfg_scale > 1.0
    rows = torch.cat([cond, torch.full_like(cond, model.num_classes)]) if guided else cond
    model.setup_caches(len(rows), T + max_new_tokens, model.tok_embeddings.weight.dtype)

    def mixed(logits, use_cfg):
        if not guided:
            return logits
        c, u = logits.chunk(2)
        return u + (c - u) * cfg_scale if use_cfg else c

    logits, _ = model(None, rows, torch.arange(T))
    token = _pick(mixed(logits[:, -1], True), temperature, top_k)
    out, use_cfg = [token], True
    for i in range(max_new_tokens - 1):
        if cfg_interval > -1 and i > cfg_interval:
            use_cfg = False
        step = torch.cat([token, token]) if guided else token
        logits, _ = model(step, None, torch.tensor([T + i]))
        token = _pick(mixed(logits[:, -1], use_cfg), temperature, top_k)
        out.append(token)
    return torch.cat(out, dim=1)
