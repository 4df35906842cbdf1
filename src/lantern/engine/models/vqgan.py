"""The taming-transformers VQGAN (Chameleon's image tokenizer: Anole, Lumina-mGPT), state-dict compatible with
its released `vqgan.ckpt`, and the reader of that Lightning container.

Same building blocks as LlamaGen's VQ (`vq.py`: ResnetBlock, AttnBlock, Downsample, Upsample, GroupNorm of 32
groups, eps 1e-6), arranged in taming's layout: `encoder.down.{level}.block.{j}`, attention only at the resolutions
the config lists (Chameleon: none) plus the mid block's, `decoder.up.{level}` indexed by resolution (the deepest
runs first) with num_res_blocks + 1 blocks per level, no tanh at the output. The quantiser is a plain codebook
(`quantize.embedding.weight`, no L2 normalisation): nearest row by squared L2.

The engine builds and checks the model here (`build_vqgan`); reading `vqgan.yaml` into a VQGANSpec is the chameleon
world's (lantern.worlds.chameleon.vqgan), which hands the spec and the state dict to this module.
"""

from __future__ import annotations

import pickle
import types
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from lantern.errors import UserError
from lantern.engine.models.vq import AttnBlock, Downsample, Normalize, ResnetBlock, Upsample, nearest_rows

GROUPS = 32  # taming's Normalize: GroupNorm(32, C, eps=1e-6)
MODULES = ("encoder.", "decoder.", "quantize.", "quant_conv.", "post_quant_conv.")  # keys the model owns


@dataclass(frozen=True)
class VQGANSpec:
    """vqgan.yaml's model.params (embed_dim, n_embed) and ddconfig, as the file names them."""

    embed_dim: int
    n_embed: int
    z_channels: int
    ch: int
    ch_mult: tuple[int, ...]
    num_res_blocks: int
    attn_resolutions: tuple[int, ...] = ()
    resolution: int = 256  # only places attention (attn_resolutions); any image size divisible by the stride runs
    in_channels: int = 3
    out_ch: int = 3
    dropout: float = 0.0

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)


def _mid(ch: int, dropout: float) -> nn.Module:
    mid = nn.Module()
    mid.block_1 = ResnetBlock(ch, ch, GROUPS, dropout)
    mid.attn_1 = AttnBlock(ch, GROUPS)
    mid.block_2 = ResnetBlock(ch, ch, GROUPS, dropout)
    return mid


def _run_mid(mid: nn.Module, h: torch.Tensor) -> torch.Tensor:
    return mid.block_2(mid.attn_1(mid.block_1(h)))


def _run_level(level: nn.Module, h: torch.Tensor) -> torch.Tensor:
    for j, block in enumerate(level.block):
        h = block(h)
        if len(level.attn):
            h = level.attn[j](h)
    return h


class TamingEncoder(nn.Module):
    def __init__(self, s: VQGANSpec):
        super().__init__()
        self.conv_in = nn.Conv2d(s.in_channels, s.ch, 3, 1, 1)
        self.down = nn.ModuleList()
        cin, res = s.ch, s.resolution
        for lvl, mult in enumerate(s.ch_mult):
            level, cout = nn.Module(), s.ch * mult
            level.block, level.attn = nn.ModuleList(), nn.ModuleList()
            for _ in range(s.num_res_blocks):
                level.block.append(ResnetBlock(cin, cout, GROUPS, s.dropout))
                cin = cout
                if res in s.attn_resolutions:
                    level.attn.append(AttnBlock(cin, GROUPS))
            if lvl != len(s.ch_mult) - 1:
                level.downsample = Downsample(cin)
                res //= 2
            self.down.append(level)
        self.mid = _mid(cin, s.dropout)
        self.norm_out = Normalize(cin, GROUPS)
        self.conv_out = nn.Conv2d(cin, s.z_channels, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for level in self.down:
            h = _run_level(level, h)
            if hasattr(level, "downsample"):
                h = level.downsample(h)
        return self.conv_out(F.silu(self.norm_out(_run_mid(self.mid, h))))


class TamingDecoder(nn.Module):
    def __init__(self, s: VQGANSpec):
        super().__init__()
        n = len(s.ch_mult)
        cin, res = s.ch * s.ch_mult[-1], s.resolution // s.downsample
        self.conv_in = nn.Conv2d(s.z_channels, cin, 3, 1, 1)
        self.mid = _mid(cin, s.dropout)
        up: list[nn.Module] = [nn.Module() for _ in range(n)]
        for lvl in reversed(range(n)):  # built deepest first, stored by resolution: up[0] is the finest
            level, cout = up[lvl], s.ch * s.ch_mult[lvl]
            level.block, level.attn = nn.ModuleList(), nn.ModuleList()
            for _ in range(s.num_res_blocks + 1):
                level.block.append(ResnetBlock(cin, cout, GROUPS, s.dropout))
                cin = cout
                if res in s.attn_resolutions:
                    level.attn.append(AttnBlock(cin, GROUPS))
            if lvl != 0:
                level.upsample = Upsample(cin)
                res *= 2
        self.up = nn.ModuleList(up)
        self.norm_out = Normalize(cin, GROUPS)
        self.conv_out = nn.Conv2d(cin, s.out_ch, 3, 1, 1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = _run_mid(self.mid, self.conv_in(z))
        for level in reversed(self.up):
            h = _run_level(level, h)
            if hasattr(level, "upsample"):
                h = level.upsample(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class VQGAN(nn.Module):
    """Images [B, 3, H, W] in [-1, 1] <-> code grids [B, H / s, W / s] (s = spec.downsample; Chameleon: 16)."""

    def __init__(self, spec: VQGANSpec):
        super().__init__()
        self.spec = spec
        self.encoder = TamingEncoder(spec)
        self.decoder = TamingDecoder(spec)
        self.quantize = nn.Module()
        self.quantize.embedding = nn.Embedding(spec.n_embed, spec.embed_dim)
        self.quant_conv = nn.Conv2d(spec.z_channels, spec.embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(spec.embed_dim, spec.z_channels, 1)

    @property
    def codebook(self) -> torch.Tensor:
        return self.quantize.embedding.weight

    def encode_latent(self, x: torch.Tensor) -> torch.Tensor:
        """Pre-quantisation vectors [B, h, w, embed_dim]."""
        return self.quant_conv(self.encoder(x)).permute(0, 2, 3, 1)

    @torch.no_grad()
    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Images [B, 3, H, W] in [-1, 1] -> codes [B, h, w] (nearest raw codebook row by squared L2)."""
        return nearest_rows(self.encode_latent(x), self.codebook)

    @torch.no_grad()
    def decode_code(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes [B, h, w] (row-major grid) -> images [B, out_ch, 16h, 16w] in about [-1, 1] (not clamped)."""
        z_q = self.quantize.embedding(codes).permute(0, 3, 1, 2)
        return self.decoder(self.post_quant_conv(z_q))


def _short(keys) -> str:
    keys = sorted(keys)
    return ", ".join(keys[:4]) + (f" (+{len(keys) - 4} more)" if len(keys) > 4 else "")


def build_vqgan(spec: VQGANSpec, state_dict: dict, path: str | Path, yaml_path: str | Path = "vqgan.yaml",
                device: str | torch.device = "cpu") -> VQGAN:
    """The VQGAN of `spec` holding `state_dict` (read from `path`). The model's own keys (encoder., decoder.,
    quantize., quant_conv., post_quant_conv.) must match exactly; the training keys beside them (loss.*: the
    discriminator and LPIPS) are dropped, as the authors' non-strict load ignores them. A missing, extra or
    misshaped key is one line naming the file and the key."""
    from lantern.engine.models.checkpoint import no_init, parse_device

    device = parse_device(device) if isinstance(device, str) else device  # "auto", or a one-line error
    with no_init():
        model = VQGAN(spec)
    expected = model.state_dict()
    sd = {k: v for k, v in state_dict.items() if k.startswith(MODULES)}
    missing, extra = set(expected) - set(sd), set(sd) - set(expected)
    if missing:
        raise UserError(f"VQGAN checkpoint {path} lacks {_short(missing)}; it does not match {yaml_path} "
                        "(or is not a taming VQGAN checkpoint)")
    if extra:
        raise UserError(f"VQGAN checkpoint {path} has {_short(extra)}, which the architecture of {yaml_path} does "
                        "not (check ddconfig: ch_mult, num_res_blocks, attn_resolutions)")
    for k, v in expected.items():
        t = sd[k]
        if not isinstance(t, torch.Tensor) or t.shape != v.shape:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise UserError(f"VQGAN checkpoint {path}: {k} is {got} but {yaml_path} implies {tuple(v.shape)}")
        if not t.is_floating_point():
            raise UserError(f"VQGAN checkpoint {path}: {k} holds {t.dtype} values, not floats")
    model.load_state_dict({k: sd[k].float() for k in expected}, strict=True)
    return model.to(device).eval()


# -- the Lightning container ------------------------------------------------------------------------------------
# A Lightning checkpoint pickles, beside "state_dict", training state (callbacks keyed by their class, optimizer
# states, hyperparameters) that torch's weights-only loader refuses. Its fallback below rebuilds tensors and plain
# containers only, and stands an inert object in for every other class the file names: nothing in the file is run.

class _Inert:
    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        pass

    def __call__(self, *args, **kwargs):
        return _Inert()


_SAFE = {
    "collections": {"OrderedDict"},
    "builtins": {"set", "frozenset", "tuple", "list", "dict", "slice", "complex", "bytearray"},
    "torch": {"Size", "device", "float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8",
              "uint8", "bool"},
}


class _TensorsOnly(pickle.Unpickler):
    def find_class(self, module, name):
        if module == "torch._utils" and name.startswith("_rebuild_"):
            return super().find_class(module, name)
        if module == "torch._tensor" and name == "_rebuild_from_type_v2":
            return super().find_class(module, name)
        if name in _SAFE.get(module, ()):
            return super().find_class(module, name)
        return type(f"Inert_{name}", (_Inert,), {})


_TENSORS_ONLY = types.SimpleNamespace(Unpickler=_TensorsOnly, load=lambda f, **kw: _TensorsOnly(f, **kw).load(),
                                      __name__="lantern_tensors_only")


def read_lightning_state_dict(path: str | Path, what: str = "VQGAN checkpoint") -> dict:
    """The "state_dict" of a Lightning checkpoint (or a raw / {"model": ...} state dict), on the CPU."""
    from lantern.engine.models.checkpoint import extract_state_dict
    from lantern.io import not_a_file

    path = Path(path)
    if not path.is_file():
        raise not_a_file(what, path, "; give the vqgan.ckpt of the model's tokenizer folder")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except Exception:  # noqa: BLE001 - Lightning's training state, or a broken file: the fallback tells which
            try:
                obj = torch.load(path, map_location="cpu", weights_only=False, pickle_module=_TENSORS_ONLY)
            except Exception as e:  # noqa: BLE001 - a truncated or foreign file: one line whatever the cause
                detail = (str(e).strip().splitlines() or [type(e).__name__])[0][:120]
                raise UserError(f"{what} {path} is unreadable: not a torch file, or truncated ({detail})") \
                    from None
    if not isinstance(obj, dict):
        raise UserError(f"{what} {path} holds a {type(obj).__name__}, not a mapping of tensors; give a checkpoint")
    sd = extract_state_dict(obj, path)
    return {k: v for k, v in sd.items() if isinstance(v, torch.Tensor)}
