"""VQModel: the LlamaGen VQ tokenizer architecture (state-dict compatible with vq_ds16_*.pt), at any width.

Images in [-1, 1] -> encoder (downsample 2^(len(ch_mult)-1)) -> quant_conv -> nearest code (L2-normalised
codebook) -> indices; indices -> codebook rows -> post_quant_conv -> decoder -> images in about [-1, 1].
The toy world uses the same modules at small widths, with residual blocks per level configurable so that no 3x3
convolution stack runs at full resolution on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from lantern.errors import UserError


@dataclass
class VQArgs:
    codebook_size: int = 16384
    codebook_embed_dim: int = 8
    codebook_l2_norm: bool = True
    usage_window: int = 65536       # length of the `codebook_used` buffer: the most recently chosen codes
    commit_beta: float = 0.25
    ch: int = 128
    ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    z_channels: int = 256
    enc_res_blocks: tuple[int, ...] | int = 2  # per encoder level, highest resolution first
    dec_res_blocks: tuple[int, ...] | int = 3  # per decoder level, lowest resolution first (decoder.conv_blocks order)
    norm_groups: int = 32
    dropout: float = 0.0

    def __post_init__(self):
        self.ch_mult = tuple(self.ch_mult)
        n = len(self.ch_mult)
        for name in ("enc_res_blocks", "dec_res_blocks"):
            v = getattr(self, name)
            v = (v,) * n if isinstance(v, int) else tuple(v)
            if len(v) != n:
                raise ValueError(f"{name} needs one entry per level of ch_mult ({n}), got {v}")
            setattr(self, name, v)
        widths = [self.ch * m for m in self.ch_mult] + [self.ch, self.z_channels]
        if any(w % self.norm_groups for w in widths):
            raise ValueError(f"every width {sorted(set(widths))} must be divisible by norm_groups={self.norm_groups}")

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)


VQ_CONFIGS = {
    "VQ-16": VQArgs(),
    "VQ-8": VQArgs(ch_mult=(1, 2, 2, 4)),
}  # the toy world's sizes are the defaults of lantern.worlds.toy.train_vq.VQParams


def Normalize(ch: int, groups: int) -> nn.GroupNorm:
    return nn.GroupNorm(groups, ch, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, groups: int, dropout: float = 0.0):
        super().__init__()
        self.norm1 = Normalize(cin, groups)
        self.conv1 = nn.Conv2d(cin, cout, 3, 1, 1)
        self.norm2 = Normalize(cout, groups)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1)
        if cin != cout:
            self.nin_shortcut = nn.Conv2d(cin, cout, 1, 1, 0)

    def forward(self, x):
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(self.dropout(F.silu(self.norm2(h))))
        if hasattr(self, "nin_shortcut"):
            x = self.nin_shortcut(x)
        return x + h


class AttnBlock(nn.Module):
    """Single-head self-attention over the spatial positions, with 1x1 convs as projections."""

    def __init__(self, ch: int, groups: int):
        super().__init__()
        self.norm = Normalize(ch, groups)
        self.q = nn.Conv2d(ch, ch, 1)
        self.k = nn.Conv2d(ch, ch, 1)
        self.v = nn.Conv2d(ch, ch, 1)
        self.proj_out = nn.Conv2d(ch, ch, 1)

    def forward(self, x):
        B, C, H, W = x.shape
        h = self.norm(x)
        q, k, v = (p(h).reshape(B, 1, C, H * W).transpose(2, 3) for p in (self.q, self.k, self.v))
        h = F.scaled_dot_product_attention(q, k, v).transpose(2, 3).reshape(B, C, H, W)
        return x + self.proj_out(h)


class Downsample(nn.Module):
    def __init__(self, ch: int):
        super().__init__()
        self.conv = nn.Conv2d(ch, ch, 3, 2, 0)

    def forward(self, x):
        return self.conv(F.pad(x, (0, 1, 0, 1)))  # asymmetric pad, as upstream: 2k -> k exactly


class Upsample(nn.Module):
    def __init__(self, ch: int):
        super().__init__()
        self.conv = nn.Conv2d(ch, ch, 3, 1, 1)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


def _mid(ch: int, a: VQArgs) -> nn.ModuleList:
    return nn.ModuleList([ResnetBlock(ch, ch, a.norm_groups, a.dropout), AttnBlock(ch, a.norm_groups),
                          ResnetBlock(ch, ch, a.norm_groups, a.dropout)])


class Encoder(nn.Module):
    def __init__(self, a: VQArgs):
        super().__init__()
        n = len(a.ch_mult)
        self.conv_in = nn.Conv2d(3, a.ch, 3, 1, 1)
        self.conv_blocks = nn.ModuleList()
        cin = a.ch
        for lvl in range(n):
            block, cout = nn.Module(), a.ch * a.ch_mult[lvl]
            block.res, block.attn = nn.ModuleList(), nn.ModuleList()
            for _ in range(a.enc_res_blocks[lvl]):
                block.res.append(ResnetBlock(cin, cout, a.norm_groups, a.dropout))
                cin = cout
                if lvl == n - 1:
                    block.attn.append(AttnBlock(cin, a.norm_groups))
            if lvl != n - 1:
                block.downsample = Downsample(cin)
            self.conv_blocks.append(block)
        self.mid = _mid(cin, a)
        self.norm_out = Normalize(cin, a.norm_groups)
        self.conv_out = nn.Conv2d(cin, a.z_channels, 3, 1, 1)

    def forward(self, x):
        h = self.conv_in(x)
        for block in self.conv_blocks:
            for j, res in enumerate(block.res):
                h = res(h)
                if len(block.attn):
                    h = block.attn[j](h)
            if hasattr(block, "downsample"):
                h = block.downsample(h)
        for m in self.mid:
            h = m(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class Decoder(nn.Module):
    def __init__(self, a: VQArgs):
        super().__init__()
        n = len(a.ch_mult)
        cin = a.ch * a.ch_mult[-1]
        self.conv_in = nn.Conv2d(a.z_channels, cin, 3, 1, 1)
        self.mid = _mid(cin, a)
        self.conv_blocks = nn.ModuleList()
        for lvl in range(n):
            block, cout = nn.Module(), a.ch * a.ch_mult[n - 1 - lvl]
            block.res, block.attn = nn.ModuleList(), nn.ModuleList()
            for _ in range(a.dec_res_blocks[lvl]):
                block.res.append(ResnetBlock(cin, cout, a.norm_groups, a.dropout))
                cin = cout
                if lvl == 0:
                    block.attn.append(AttnBlock(cin, a.norm_groups))
            if lvl != n - 1:
                block.upsample = Upsample(cin)
            self.conv_blocks.append(block)
        self.norm_out = Normalize(cin, a.norm_groups)
        self.conv_out = nn.Conv2d(cin, 3, 3, 1, 1)

    def forward(self, z):
        h = self.conv_in(z)
        for m in self.mid:
            h = m(h)
        for block in self.conv_blocks:
            for j, res in enumerate(block.res):
                h = res(h)
                if len(block.attn):
                    h = block.attn[j](h)
            if hasattr(block, "upsample"):
                h = block.upsample(h)
        return self.conv_out(F.silu(self.norm_out(h)))


def nearest_rows(z: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """z: [..., D] -> index of the nearest codebook row [N, D] by squared L2, expanded as the taming / LlamaGen
    quantisers compute it (|z|^2 + |e|^2 - 2 z.e; the first index on an exact tie)."""
    flat = z.reshape(-1, codebook.shape[1])
    d = flat.pow(2).sum(1, keepdim=True) + codebook.pow(2).sum(1) - 2 * flat @ codebook.t()
    return d.argmin(1).reshape(z.shape[:-1])


class VectorQuantizer(nn.Module):
    def __init__(self, a: VQArgs):
        super().__init__()
        self.n_e, self.e_dim, self.l2_norm, self.beta = a.codebook_size, a.codebook_embed_dim, a.codebook_l2_norm, a.commit_beta
        self.embedding = nn.Embedding(a.codebook_size, a.codebook_embed_dim)
        nn.init.uniform_(self.embedding.weight, -1.0 / a.codebook_size, 1.0 / a.codebook_size)
        # upstream checkpoints carry this rolling record of recently chosen codes; strict loading needs it
        self.register_buffer("codebook_used", torch.zeros(a.usage_window))

    def codebook(self) -> torch.Tensor:
        w = self.embedding.weight
        return F.normalize(w, dim=-1) if self.l2_norm else w

    def nearest(self, z: torch.Tensor) -> torch.Tensor:
        """z: [..., e_dim] (already normalised when l2_norm) -> indices of the nearest codebook rows."""
        return nearest_rows(z, self.codebook())

    def forward(self, z: torch.Tensor):
        """z: [B, e_dim, h, w] -> (z_q with straight-through gradient, codebook loss, commit loss, indices [B, h, w])."""
        z = z.permute(0, 2, 3, 1)
        if self.l2_norm:
            z = F.normalize(z, dim=-1)
        idx = self.nearest(z.detach())
        z_q = self.codebook()[idx]
        codebook_loss = F.mse_loss(z_q, z.detach())
        commit_loss = self.beta * F.mse_loss(z, z_q.detach())
        if self.training:
            self.record_usage(idx)
        z_q = z + (z_q - z).detach()
        return z_q.permute(0, 3, 1, 2), codebook_loss, commit_loss, idx

    @torch.no_grad()
    def record_usage(self, idx: torch.Tensor) -> None:
        idx = idx.flatten()[-len(self.codebook_used):].to(self.codebook_used.dtype)
        k = len(idx)
        self.codebook_used[:-k] = self.codebook_used[k:].clone()
        self.codebook_used[-k:] = idx

    def get_codebook_entry(self, indices: torch.Tensor, shape=None) -> torch.Tensor:
        """indices [B, h*w] or [B, h, w] -> [B, e_dim, h, w]; shape (B, e_dim, h, w) as upstream, or None for square."""
        z_q = self.codebook()[indices]
        B = indices.shape[0]
        if shape is None:
            n = z_q[0].numel() // self.e_dim
            h = int(round(n ** 0.5))
            if h * h != n:
                raise ValueError(f"cannot infer a square grid from {n} tokens; pass shape=(B, C, h, w)")
            shape = (B, self.e_dim, h, h)
        return z_q.reshape(shape[0], shape[2], shape[3], shape[1]).permute(0, 3, 1, 2)


class VQModel(nn.Module):
    def __init__(self, args: VQArgs):
        super().__init__()
        self.args = args
        self.encoder = Encoder(args)
        self.decoder = Decoder(args)
        self.quantize = VectorQuantizer(args)
        self.quant_conv = nn.Conv2d(args.z_channels, args.codebook_embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(args.codebook_embed_dim, args.z_channels, 1)

    def forward(self, x: torch.Tensor):
        """Training pass: images [B, 3, H, W] in [-1, 1] -> (reconstruction, codebook loss, commit loss, indices)."""
        z_q, codebook_loss, commit_loss, idx = self.quantize(self.quant_conv(self.encoder(x)))
        return self.decode(z_q), codebook_loss, commit_loss, idx

    def encode_latent(self, x: torch.Tensor) -> torch.Tensor:
        """Pre-quantisation vectors [B, h, w, e_dim] (normalised when the codebook is)."""
        z = self.quant_conv(self.encoder(x)).permute(0, 2, 3, 1)
        return F.normalize(z, dim=-1) if self.quantize.l2_norm else z

    @torch.no_grad()
    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Images [B, 3, H, W] in [-1, 1] -> code indices [B, h*w] (row-major, the GPT's token order)."""
        return self.quantize.nearest(self.encode_latent(x)).flatten(1)

    def decode(self, z_q: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.post_quant_conv(z_q))

    def decode_code(self, indices: torch.Tensor, shape=None) -> torch.Tensor:
        """Code indices [B, h*w] -> images [B, 3, H, W] in about [-1, 1]; shape = (B, e_dim, h, w) or None (square)."""
        return self.decode(self.quantize.get_codebook_entry(indices, shape))


def encoder_levels(sd: dict) -> int:
    """Resolution levels of a VQ state dict's encoder (encoder.conv_blocks.<level>...; 0 when it has none)."""
    levels = {k.split(".")[2] for k in sd if k.startswith("encoder.conv_blocks.")}
    return len({int(x) for x in levels if x.isdigit()})


def file_args(obj: dict, sd: dict, path) -> VQArgs:
    """The VQArgs of a VQ file: stored in ours; an upstream file carries only tensors, and the number of its
    encoder's levels tells VQ-16 (5 levels) from VQ-8 (4); one holding no encoder is taken as VQ-16."""
    stored = obj.get("args")
    if isinstance(stored, dict):
        try:
            return VQArgs(**stored)
        except (TypeError, ValueError) as e:
            raise UserError(f"VQ checkpoint {path} has an unusable config: {e}") from None
    levels = encoder_levels(sd)
    known = {a.downsample: a for a in VQ_CONFIGS.values()}
    if levels and 2 ** (levels - 1) not in known:
        raise UserError(f"VQ checkpoint {path} has an encoder of {levels} levels (downsampling {2 ** (levels - 1)}); "
                        f"upstream LlamaGen VQs are {', '.join(VQ_CONFIGS)} ({len(VQ_CONFIGS['VQ-16'].ch_mult)} or "
                        f"{len(VQ_CONFIGS['VQ-8'].ch_mult)} levels)")
    return known[2 ** (levels - 1)] if levels else VQ_CONFIGS["VQ-16"]
