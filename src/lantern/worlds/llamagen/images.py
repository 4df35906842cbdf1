"""`lantern encode-images`: a folder of real images -> VQ codes, the drafter's real-image training data.

As the LANTERN authors prepared theirs: each image is centre-cropped ADM-style to the target resolution (LlamaGen's
`center_crop_arr`: BOX-halve while the short side is >= 2x the size, BICUBIC-resize the short side to the size,
crop the centre), scaled to [-1, 1] and encoded by the VQ. Two layouts:
  classes   root/<class>/**/<image>: classes sorted by name give the label index (torchvision ImageFolder order);
  captions  root/**/<image> plus root/captions.csv or root/captions.jsonl with fields `image` (path relative to
            root) and `caption`, one caption per image.
Images are taken in sorted path order and `--start/--end` select a slice of it, so shards run in parallel and
concatenated shards equal one unsharded run.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from lantern.errors import UserError
from lantern.io import check_image, image_error, save_torch
from lantern.worlds.llamagen.prompts import write_prompts

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".ppm", ".tif", ".tiff"}
CAPTION_FILES = ("captions.csv", "captions.jsonl")


def center_crop(image: Image.Image, size: int) -> Image.Image:
    """ADM / LlamaGen centre crop of an RGB image to size x size."""
    while min(image.size) >= 2 * size:
        image = image.resize(tuple(x // 2 for x in image.size), resample=Image.BOX)
    scale = size / min(image.size)
    image = image.resize(tuple(round(x * scale) for x in image.size), resample=Image.BICUBIC)
    arr = np.asarray(image)
    top, left = (arr.shape[0] - size) // 2, (arr.shape[1] - size) // 2
    return Image.fromarray(arr[top : top + size, left : left + size])


def _images_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def class_items(root: Path) -> tuple[list[str], list[int], list[str]]:
    """(relative image paths, labels, class names) of an ImageNet-style class-folder tree."""
    classes = sorted(d.name for d in root.iterdir() if d.is_dir())
    if not classes:
        raise UserError(f"--images {root} has no class folders; --layout classes expects {root}/<class>/<image>")
    paths, labels = [], []
    for label, name in enumerate(classes):
        for p in _images_under(root / name):
            paths.append(p.relative_to(root).as_posix())
            labels.append(label)
    return paths, labels, classes


def _caption_rows(path: Path) -> list[dict]:
    try:
        if path.suffix == ".csv":
            with open(path, newline="", encoding="utf-8") as f:
                return list(csv.DictReader(f))
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except (UnicodeDecodeError, json.JSONDecodeError, csv.Error) as e:
        raise UserError(f"{path} is unreadable ({type(e).__name__}: {e}); write UTF-8 rows with fields image, caption") from None


def caption_items(root: Path) -> tuple[list[str], list[str]]:
    """(relative image paths, captions) of a captioned folder, sorted by path."""
    found = [root / name for name in CAPTION_FILES if (root / name).is_file()]
    if len(found) != 1:
        what = "both" if found else "neither"
        raise UserError(f"--images {root} has {what} of {' and '.join(CAPTION_FILES)}; --layout captions needs exactly one")
    captions = {}
    for n, row in enumerate(_caption_rows(found[0]), start=1):
        if not isinstance(row, dict) or not isinstance(row.get("image"), str) or not isinstance(row.get("caption"), str):
            raise UserError(f"{found[0]} row {n} lacks a text `image` or `caption` field; every row needs both")
        rel = Path(row["image"]).as_posix()
        if rel in captions:
            raise UserError(f"{found[0]} lists image {rel} twice; keep one caption per image")
        if not (root / rel).is_file():
            raise UserError(f"{found[0]} row {n} names image {rel}, which is not under {root}")
        captions[rel] = row["caption"]
    if not captions:
        raise UserError(f"{found[0]} lists no images; add rows with fields image, caption")
    paths = sorted(captions)
    return paths, [captions[p] for p in paths]


def load_image(path: Path, size: int) -> torch.Tensor:
    """One image as float [3, size, size] in [-1, 1]."""
    try:
        with Image.open(path) as im:
            image = center_crop(im.convert("RGB"), size)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise image_error(path, e) from None
    return torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1).float() / 127.5 - 1


@torch.no_grad()
def encode_images(vq, paths: list[Path], size: int, batch: int) -> torch.Tensor:
    """VQ code indices [n, (size / downsample)^2] of the images, in order."""
    from tqdm import tqdm

    device = next(vq.parameters()).device
    chunks = []
    for lo in tqdm(range(0, len(paths), batch), desc="encode-images", mininterval=2.0):
        x = torch.stack([load_image(p, size) for p in paths[lo : lo + batch]]).to(device)
        chunks.append(vq.encode(x).cpu())
    return torch.cat(chunks)


def shard_range(start: int, end: int, count: int, root: Path) -> tuple[int, int]:
    if start < 0 or end <= start:
        raise UserError(f"--start {start} --end {end} is not a shard: need 0 <= start < end")
    if end > count:
        raise UserError(f"--end {end} exceeds the {count} images in {root}; lower the configured image count to <= {count}")
    return start, end


def main(argv: list[str]) -> None:
    from lantern.engine.models.checkpoint import parse_device
    from lantern.worlds.llamagen.upstream import load_vq

    ap = argparse.ArgumentParser(prog="lantern encode-images", description=__doc__.split("\n")[0])
    ap.add_argument("--images", required=True, help="image folder")
    ap.add_argument("--layout", required=True, choices=("classes", "captions"))
    ap.add_argument("--vq", required=True, help="VQ checkpoint (upstream vq_ds16_*.pt or ours)")
    ap.add_argument("--image-size", type=int, default=256, help="the target's resolution in pixels")
    ap.add_argument("--start", type=int, default=0, help="first image of this shard (sorted path order)")
    ap.add_argument("--end", type=int, required=True, help="one past the last image of this shard")
    ap.add_argument("--out", required=True, help="torch file: tokens, ids, labels or captions")
    ap.add_argument("--captions-out", default=None, help="CSV (id, caption) for `lantern encode-captions --prompts`")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--batch", type=int, default=16)
    a = ap.parse_args(argv)
    root = Path(a.images)
    if not root.is_dir():
        raise UserError(f"--images {root} is not a folder")
    if a.batch < 1:
        raise UserError(f"--batch {a.batch} must be >= 1")
    if a.captions_out and a.layout != "captions":
        raise UserError("--captions-out needs --layout captions (class folders carry no captions)")
    if a.layout == "classes":
        paths, labels, classes = class_items(root)
    else:
        paths, captions = caption_items(root)
    if not paths:
        raise UserError(f"--images {root} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
    lo, hi = shard_range(a.start, a.end, len(paths), root)
    for p in paths[lo:hi]:  # a broken file stops the job here, not after part of the shard was encoded
        check_image(root / p, "--images file")
    vq = load_vq(a.vq, device=str(parse_device(a.device)))
    if a.image_size < 1 or a.image_size % vq.args.downsample:
        raise UserError(f"--image-size {a.image_size} must be a positive multiple of the VQ's downsampling {vq.args.downsample}")
    ids = paths[lo:hi]
    tokens = encode_images(vq, [root / p for p in ids], a.image_size, a.batch)
    out = {"tokens": tokens, "ids": ids, "codebook_size": vq.args.codebook_size, "vq": str(a.vq), "source": str(root),
           "layout": a.layout, "image_size": a.image_size, "start": lo, "end": hi}
    if a.layout == "classes":
        out.update(labels=torch.tensor(labels[lo:hi], dtype=torch.long), classes=classes)
    else:
        out["captions"] = captions[lo:hi]
    save_torch(out, a.out)
    if a.captions_out:
        write_prompts(list(zip(ids, out["captions"])), a.captions_out)
    print(f"encoded images [{lo}, {hi}) of {len(paths)} in {root} into {tokens.shape[1]} tokens each -> {a.out}")
