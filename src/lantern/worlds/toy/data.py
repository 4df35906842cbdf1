"""The toy world's images: 16 procedural shape classes on textured, noisy backgrounds, with captions.

Texture and pixel noise are what make the next-token distributions of a model trained on these images flat
(token selection ambiguity); the clean control world turns them off:
    DataParams(background_gradient=False, texture_amplitude=0.0, noise_sigma=0.0)
Every image depends only on (seed, index): its random draws come from its own generator, so generating indices
[a, b) gives exactly the slice [a, b) of a bigger set, and sharding never changes an image.
"""

from __future__ import annotations

import argparse
import dataclasses
import math

import numpy as np
import torch
import torch.nn.functional as F

from lantern.errors import UserError
from lantern.hparams import CLASS_NAMES, DataParams  # noqa: F401 (CLASS_NAMES: read from here by the toy modules)
from lantern.params import params_from
from lantern.io import load_torch, read_structured, save_torch


# name -> RGB in [0, 1]; shapes and backgrounds draw from the same palette, never the same colour twice per image
COLOURS = {
    "red": (0.85, 0.12, 0.10), "orange": (0.95, 0.55, 0.10), "yellow": (0.95, 0.90, 0.20),
    "green": (0.15, 0.65, 0.20), "cyan": (0.20, 0.80, 0.85), "blue": (0.15, 0.25, 0.85),
    "purple": (0.55, 0.20, 0.70), "pink": (0.95, 0.55, 0.75), "white": (0.95, 0.95, 0.95),
    "black": (0.08, 0.08, 0.08),
}
COLOUR_NAMES = tuple(COLOURS)
PALETTE = torch.tensor([COLOURS[c] for c in COLOUR_NAMES])
SUPERSAMPLE = 2  # shapes are rasterised at 2x and box-filtered, so edges are anti-aliased


def _draw(seed: int, index: int, params: DataParams) -> tuple[np.ndarray, np.ndarray]:
    """All random numbers of one image, from a generator seeded by (seed, index) only."""
    rng = np.random.default_rng((seed, index))
    u = rng.random(12)
    colours = rng.permutation(len(COLOUR_NAMES))[:3]  # shape, background start, background end
    noise = rng.standard_normal((3, params.image_size, params.image_size), dtype=np.float32)
    return np.concatenate([u, colours]), noise


def _mask(cls: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Inside-test of shape `cls` in its own frame (unit radius, rotated and centred)."""
    r = torch.sqrt(x * x + y * y)
    phi = torch.atan2(y, x)
    name = CLASS_NAMES[cls]
    if name == "circle":
        return r <= 0.9
    if name == "ellipse":
        return (x / 1.0) ** 2 + (y / 0.5) ** 2 <= 1
    if name in ("triangle", "pentagon", "hexagon"):
        n = {"triangle": 3, "pentagon": 5, "hexagon": 6}[name]
        # regular n-gon of circumradius 1: distance to the nearest edge normal within the point's sector
        a = torch.remainder(phi, 2 * math.pi / n) - math.pi / n
        return r * torch.cos(a) <= math.cos(math.pi / n)
    if name == "square":
        return torch.maximum(x.abs(), y.abs()) <= 0.72
    if name == "star":
        n, inner = 5, 0.42
        a = torch.remainder(phi, 2 * math.pi / n)
        a = torch.minimum(a, 2 * math.pi / n - a)  # fold onto [0, pi/n]: tip at 0, notch at pi/n
        px, py = r * torch.cos(a), r * torch.sin(a)
        tx, ty = inner * math.cos(math.pi / n), inner * math.sin(math.pi / n)
        # inside if on the origin's side of the line tip (1, 0) -> notch (tx, ty)
        return (tx - 1) * py - ty * (px - 1) >= 0
    if name == "cross":
        return ((x.abs() <= 0.3) & (y.abs() <= 1)) | ((y.abs() <= 0.3) & (x.abs() <= 1))
    if name == "ring":
        return (r <= 1) & (r >= 0.55)
    if name == "crescent":
        return (r <= 1) & ((x - 0.5) ** 2 + y * y >= 0.8 ** 2)
    if name == "heart":
        hx, hy = x * 1.25, -y * 1.25 + 0.15
        return (hx * hx + hy * hy - 1) ** 3 - hx * hx * hy ** 3 <= 0
    if name == "semicircle":
        return (r <= 1) & (y >= -0.1) & (x * x + (y + 0.1) ** 2 <= 1)
    if name == "arrow":
        shaft = (x >= -1) & (x <= 0.1) & (y.abs() <= 0.22)
        head = (x >= 0.0) & (x <= 1) & (y.abs() <= 0.75 * (1 - x))
        return shaft | head
    if name == "L-shape":
        return ((x >= -0.8) & (x <= -0.3) & (y.abs() <= 0.9)) | ((x >= -0.8) & (x <= 0.8) & (y >= 0.4) & (y <= 0.9))
    if name == "T-shape":
        return ((x.abs() <= 0.9) & (y >= -0.9) & (y <= -0.4)) | ((x.abs() <= 0.25) & (y >= -0.9) & (y <= 0.9))
    if name == "frame":
        m = torch.maximum(x.abs(), y.abs())
        return (m <= 0.85) & (m >= 0.5)
    raise AssertionError(name)


def _render(u: torch.Tensor, labels: torch.Tensor, noise: torch.Tensor, p: DataParams) -> torch.Tensor:
    """Vectorised rasteriser. u: [B, 15] per-image draws (12 uniforms + 3 colour ids) -> float images [B, 3, H, W]."""
    B, S = u.shape[0], p.image_size
    col, bg0, bg1 = (u[:, 12 + k].long() for k in range(3))

    # background: gradient along a random direction between two dimmed palette colours, plus stripes
    coords = (torch.arange(S, dtype=torch.float32) + 0.5) / S  # pixel centres in (0, 1)
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")
    dim = lambda c: 0.5 + p.background_dim * (PALETTE[c] - 0.5)  # noqa: E731
    c0 = dim(bg0)
    c1 = dim(bg1) if p.background_gradient else c0
    ga = u[:, 0:1, None] * 2 * math.pi
    t = (xx - 0.5) * torch.cos(ga) + (yy - 0.5) * torch.sin(ga)  # [B, S, S], in about [-0.7, 0.7]
    t = (t / math.sqrt(0.5) + 1) / 2
    img = c0[:, :, None, None] * (1 - t[:, None]) + c1[:, :, None, None] * t[:, None]
    if p.texture_amplitude > 0:
        sa = u[:, 1:2, None] * math.pi
        freq = p.min_stripes + u[:, 2:3, None] * (p.max_stripes - p.min_stripes)
        phase = u[:, 3:4, None] * 2 * math.pi
        stripes = torch.sin(2 * math.pi * freq * (xx * torch.cos(sa) + yy * torch.sin(sa)) + phase)
        img = img + p.texture_amplitude * stripes[:, None]

    # shape: rasterised at SUPERSAMPLE x resolution in its own rotated, scaled frame, box-filtered to coverage
    size = (p.min_size + u[:, 4] * (p.max_size - p.min_size))[:, None, None]
    cx = (size[:, 0, 0] + u[:, 5] * (1 - 2 * size[:, 0, 0]))[:, None, None]
    cy = (size[:, 0, 0] + u[:, 6] * (1 - 2 * size[:, 0, 0]))[:, None, None]
    rot = (u[:, 7] * 2 * math.pi)[:, None, None]
    fine = (torch.arange(S * SUPERSAMPLE, dtype=torch.float32) + 0.5) / (S * SUPERSAMPLE)
    fy, fx = torch.meshgrid(fine, fine, indexing="ij")
    dx, dy = fx - cx, fy - cy
    lx = (dx * torch.cos(rot) + dy * torch.sin(rot)) / size
    ly = (-dx * torch.sin(rot) + dy * torch.cos(rot)) / size
    inside = torch.zeros(B, S * SUPERSAMPLE, S * SUPERSAMPLE)
    for c in labels.unique().tolist():
        rows = labels == c
        inside[rows] = _mask(c, lx[rows], ly[rows]).float()
    alpha = F.avg_pool2d(inside[:, None], SUPERSAMPLE)  # [B, 1, S, S]
    jitter = (u[:, 8:11] - 0.5) * 2 * p.colour_jitter
    fg = (PALETTE[col] + jitter).clamp(0, 1)[:, :, None, None]
    img = img * (1 - alpha) + fg * alpha
    if p.noise_sigma > 0:
        img = img + p.noise_sigma * noise
    return img.clamp(0, 1)


def caption(label: int, colours: tuple[int, int, int], params: DataParams) -> str:
    shape, b0, b1 = (COLOUR_NAMES[c] for c in colours)
    bg = f"{b0}-to-{b1}" if params.background_gradient else b0
    texture = "striped" if params.texture_amplitude > 0 else "plain"
    article = "an" if shape[0] in "aeiou" else "a"
    return f"{article} {shape} {CLASS_NAMES[label]} on a {bg} {texture} background"


def make_dataset(n: int, seed: int, params: DataParams | None = None, start: int = 0, chunk: int = 4096) -> dict:
    """Images [start, start + n) of the world (seed, params): uint8 images [n, 3, H, W], labels [n], captions."""
    params = params or DataParams()
    if n < 0 or start < 0:
        raise UserError(f"make_dataset needs n >= 0 and start >= 0, got n={n}, start={start}")
    S = params.image_size
    images = torch.empty(n, 3, S, S, dtype=torch.uint8)
    labels = torch.empty(n, dtype=torch.long)
    captions: list[str] = []
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        draws = [_draw(seed, start + i, params) for i in range(lo, hi)]
        u = torch.from_numpy(np.stack([d[0] for d in draws])).float()
        noise = torch.from_numpy(np.stack([d[1] for d in draws]))
        # the class comes from the same per-image draws, so it too depends on (seed, index) only
        lab = (u[:, 11] * params.num_classes).long().clamp_max(params.num_classes - 1)
        img = _render(u, lab, noise, params)
        images[lo:hi] = (img * 255).round().to(torch.uint8)
        labels[lo:hi] = lab
        ids = u[:, 12:15].long().tolist()
        captions += [caption(int(l), tuple(c), params) for l, c in zip(lab.tolist(), ids)]
    return dict(images=images, labels=labels, captions=captions)


def load_data(path, what: str = "data file") -> dict:
    """Read a `lantern make-data` file, with a clear error when it is missing or something else."""
    obj = load_torch(path, what, "lantern make-data")
    if not {"images", "labels", "captions"} <= set(obj):
        raise UserError(f"{what} {path} is not a `lantern make-data` file (needs images, labels, captions)")
    return obj


def to_unit(images: torch.Tensor) -> torch.Tensor:
    """uint8 [B, 3, H, W] -> float in [-1, 1], the VQ's input range."""
    return images.float() / 127.5 - 1


@torch.no_grad()
def reconstruct(vq, images: torch.Tensor, batch: int = 256) -> torch.Tensor:
    """uint8 images -> uint8 VQ reconstructions (encode to codes, decode), as generated images are made (the toy
    CLIP and classifier train on them too)."""
    out = []
    for lo in range(0, len(images), batch):
        x = vq.decode_code(vq.encode(to_unit(images[lo : lo + batch])))
        out.append(((x.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8))
    return torch.cat(out)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="lantern make-data", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output torch file: images uint8 [n,3,H,W], labels, captions")
    ap.add_argument("--n", type=int, required=True, help="number of images")
    ap.add_argument("--seed", type=int, required=True, help="world seed; image i depends on (seed, start + i)")
    ap.add_argument("--start", type=int, default=0, help="index of the first image (held-out splits use an offset)")
    ap.add_argument("--params", default=None, help="DataParams as inline JSON/YAML or a file path")
    args = ap.parse_args(argv)
    params = params_from(read_structured(args.params), DataParams)
    if args.n <= 0:
        raise UserError(f"--n must be positive, got {args.n}")
    data = make_dataset(args.n, args.seed, params, start=args.start)
    data.update(seed=args.seed, start=args.start, params=dataclasses.asdict(params),
                class_names=list(CLASS_NAMES[: params.num_classes]))
    save_torch(data, args.out)
    print(f"wrote {args.n} images ({params.image_size}px, {params.num_classes} classes) to {args.out}")
