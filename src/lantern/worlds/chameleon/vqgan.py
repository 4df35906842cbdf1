"""Chameleon's VQGAN from its released files, unchanged: `tokenizer/vqgan.yaml` + `tokenizer/vqgan.ckpt` (the same
two files for Anole and Lumina-mGPT), pixels in and out as the authors convert them, and the neighbour table of its
codebook.

- `read_vqgan(ckpt, yaml)` -> (VQGANSpec, state dict): the one reader of this layout; the engine builds and checks
  the network (lantern.engine.models.vqgan.build_vqgan). `load_vqgan` does both.
- Pixels out (Meta's image_tokenizer): clamp to [-1, 1], (x + 1) / 2, times 255, uint8 by TRUNCATION, not rounding.
- Pixels in: RGBA (any mode with transparency) composited on white, x / 255 * 2 - 1 in float64, then fp32 (as
  numpy then torch do there); nearest code by squared L2 to the raw codebook rows. No resizing: the caller crops.
- `build_neighbour_table(ckpt, params)`: the codebook through `lantern neighbours`' own builder and file format,
  so the acceptance rules read it unchanged (the authors' rule: raw Euclidean distances, self excluded, ascending).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import yaml
from PIL import Image

from lantern.errors import UserError
from lantern.engine.models.vqgan import VQGAN, VQGANSpec, build_vqgan, read_lightning_state_dict
from lantern.engine.rules.neighbours import CODEBOOK_KEY, NeighbourParams, build_table

INT_KEYS = ("z_channels", "ch", "num_res_blocks", "resolution", "in_channels", "out_ch")


def _positive_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def read_spec(yaml_path: str | Path) -> VQGANSpec:
    """model.params of vqgan.yaml (embed_dim, n_embed, ddconfig; lossconfig and the rest ignored)."""
    yaml_path = Path(yaml_path)
    if not yaml_path.is_file():
        raise UserError(f"VQGAN config {yaml_path} does not exist; give the vqgan.yaml beside vqgan.ckpt "
                        "(the model's tokenizer folder)")
    try:
        cfg = yaml.safe_load(yaml_path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise UserError(f"VQGAN config {yaml_path} is not YAML ({type(e).__name__}); give Chameleon's vqgan.yaml") \
            from None
    model = cfg.get("model") if isinstance(cfg, dict) else None
    params = model.get("params") if isinstance(model, dict) else None
    if not isinstance(params, dict):
        raise UserError(f"VQGAN config {yaml_path} has no model.params mapping; give Chameleon's vqgan.yaml")
    dd = params.get("ddconfig")
    if not isinstance(dd, dict):
        raise UserError(f"VQGAN config {yaml_path} has no model.params.ddconfig mapping")
    for key in ("embed_dim", "n_embed"):
        if not _positive_int(params.get(key)):
            raise UserError(f"VQGAN config {yaml_path}: model.params.{key} = {params.get(key)!r} must be a positive "
                            "integer")
    for key in ("z_channels", "ch", "num_res_blocks"):
        if not _positive_int(dd.get(key)):
            raise UserError(f"VQGAN config {yaml_path}: model.params.ddconfig.{key} = {dd.get(key)!r} must be a "
                            "positive integer")
    for key in ("resolution", "in_channels", "out_ch"):
        if key in dd and not _positive_int(dd[key]):
            raise UserError(f"VQGAN config {yaml_path}: model.params.ddconfig.{key} = {dd[key]!r} must be a "
                            "positive integer")
    mult, attn = dd.get("ch_mult"), dd.get("attn_resolutions", [])
    if not (isinstance(mult, list) and mult and all(_positive_int(m) for m in mult)):
        raise UserError(f"VQGAN config {yaml_path}: model.params.ddconfig.ch_mult = {mult!r} must be a list of "
                        "positive integers")
    if not (isinstance(attn, list) and all(_positive_int(r) for r in attn)):
        raise UserError(f"VQGAN config {yaml_path}: model.params.ddconfig.attn_resolutions = {attn!r} must be a "
                        "list of resolutions")
    if dd.get("double_z", False):
        raise UserError(f"VQGAN config {yaml_path}: model.params.ddconfig.double_z is true, which a VQ tokenizer "
                        "never sets (it doubles the latent of a KL autoencoder); this is not a VQGAN config")
    widths = {dd["ch"] * m for m in mult} | {dd["ch"]}
    if any(w % 32 for w in widths):
        raise UserError(f"VQGAN config {yaml_path}: ddconfig.ch x ch_mult gives widths {sorted(widths)}; taming's "
                        "GroupNorm needs each to be a multiple of 32")
    dropout = dd.get("dropout", 0.0)
    return VQGANSpec(embed_dim=params["embed_dim"], n_embed=params["n_embed"], z_channels=dd["z_channels"],
                     ch=dd["ch"], ch_mult=tuple(mult), num_res_blocks=dd["num_res_blocks"],
                     attn_resolutions=tuple(attn), resolution=dd.get("resolution", 256),
                     in_channels=dd.get("in_channels", 3), out_ch=dd.get("out_ch", 3),
                     dropout=float(dropout) if isinstance(dropout, (int, float)) else 0.0)


def default_yaml(ckpt_path: str | Path) -> Path:
    return Path(ckpt_path).with_name("vqgan.yaml")


def read_vqgan(ckpt_path: str | Path, yaml_path: str | Path | None = None) -> tuple[VQGANSpec, dict]:
    """(spec, state dict) of Chameleon's VQGAN files; yaml_path defaults to vqgan.yaml beside the checkpoint."""
    spec = read_spec(yaml_path or default_yaml(ckpt_path))
    return spec, read_lightning_state_dict(ckpt_path)


def load_vqgan(ckpt_path: str | Path, yaml_path: str | Path | None = None, device: str | torch.device = "cpu") -> VQGAN:
    """The VQGAN (eval, fp32: the authors decode in fp32) of vqgan.ckpt + vqgan.yaml, every key checked."""
    from lantern.engine.models.checkpoint import parse_device

    device = parse_device(device) if isinstance(device, str) else device  # before reading ~300 MB
    yaml_path = yaml_path or default_yaml(ckpt_path)
    spec, sd = read_vqgan(ckpt_path, yaml_path)
    return build_vqgan(spec, sd, ckpt_path, yaml_path, device)


def read_codebook(ckpt_path: str | Path, yaml_path: str | Path | None = None) -> torch.Tensor:
    """The raw [n_embed, embed_dim] codebook, checked against the config without building the network."""
    yaml_path = yaml_path or default_yaml(ckpt_path)
    spec, sd = read_vqgan(ckpt_path, yaml_path)
    cb = sd.get(CODEBOOK_KEY)
    if cb is None:
        raise UserError(f"VQGAN checkpoint {ckpt_path} lacks {CODEBOOK_KEY}; it is not a taming VQGAN checkpoint")
    if tuple(cb.shape) != (spec.n_embed, spec.embed_dim):
        raise UserError(f"VQGAN checkpoint {ckpt_path}: {CODEBOOK_KEY} is {tuple(cb.shape)} but {yaml_path} implies "
                        f"{(spec.n_embed, spec.embed_dim)}")
    cb = cb.float()
    if not torch.isfinite(cb).all():
        raise UserError(f"VQGAN checkpoint {ckpt_path}: the codebook holds NaN or inf values; the file is broken")
    return cb


def build_neighbour_table(ckpt_path: str | Path, params: NeighbourParams,
                          yaml_path: str | Path | None = None) -> dict:
    """`lantern neighbours`' table ({"neighbours", "meta"}) of this codebook; save it with lantern.io.save_torch and
    load it with lantern.engine.rules.neighbours.load_neighbours(path, codebook, k)."""
    return build_table(read_codebook(ckpt_path, yaml_path), params, source=str(ckpt_path))


# -- pixels -------------------------------------------------------------------------------------------------------

def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """Decoder output [B, 3, H, W] -> uint8 [B, H, W, 3]: clamp to [-1, 1], (x + 1) / 2 * 255, then truncation (the
    authors' numpy astype(uint8)), in fp32."""
    x = (images.float().clamp(-1.0, 1.0) + 1.0) / 2.0
    return (x.permute(0, 2, 3, 1) * 255).to(torch.uint8)


def decode_codes(model: VQGAN, codes: torch.Tensor) -> torch.Tensor:
    """Code grids [B, h, w] (or [B, h * w] of a square grid) -> uint8 images [B, 16h, 16w, 3]."""
    if codes.ndim == 2:
        side = int(round(codes.shape[1] ** 0.5))
        if side * side != codes.shape[1]:
            raise ValueError(f"{codes.shape[1]} codes are not a square grid; pass them as [B, h, w]")
        codes = codes.reshape(codes.shape[0], side, side)
    n = model.spec.n_embed
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= n):
        raise ValueError(f"codes must lie in 0..{n - 1} (token ids minus the image-token offset)")
    return to_uint8(model.decode_code(codes.long()))


def whiten(image: Image.Image) -> Image.Image:
    """RGB as is; any transparency composited on white ((1 - a) * 255 + a * rgb, truncated to uint8)."""
    if image.mode == "RGB":
        return image
    rgba = np.asarray(image.convert("RGBA"))
    if not (rgba[:, :, 3] < 255).any():
        return image.convert("RGB")
    alpha = rgba[:, :, 3:] / 255.0
    return Image.fromarray(((1 - alpha) * 255 + alpha * rgba[:, :, :3]).astype(np.uint8), "RGB")


def pixels_in(image: Image.Image) -> torch.Tensor:
    """A PIL image -> the VQGAN's input [3, H, W] in [-1, 1] (fp32)."""
    arr = np.asarray(whiten(image)) / 255.0 * 2 - 1
    return torch.from_numpy(arr).permute(2, 0, 1).float()


def encode_images(model: VQGAN, images: list[Image.Image]) -> torch.Tensor:
    """Equal-sized PIL images (sides multiples of 16) -> codes [B, h, w] (0..n_embed - 1; token id = code + 4)."""
    step = model.spec.downsample
    sizes = {im.size for im in images}
    if len(sizes) != 1:
        raise ValueError(f"encode_images takes images of one size; got {sorted(sizes)}")
    (w, h), = sizes
    if w % step or h % step:
        raise ValueError(f"image size {w}x{h} is not a multiple of the VQGAN's stride {step}; crop first")
    device = model.codebook.device
    x = torch.stack([pixels_in(im) for im in images]).to(device)
    return model.encode(x)
