"""Image sets to score: PNG/JPEG files from one or more folders (the shards of one sweep point, or a reference folder
searched recursively), or the uint8 images of a `lantern make-data` file (the toy world's reference set, no PNG round
trip needed: PNG is lossless). Both sets pass through one PIL resize + centre crop when a resolution is set."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import torch
import torchvision.transforms as T
import torchvision.transforms.functional as TF
from PIL import Image
from torch.utils.data import Dataset
from torch_fidelity.datasets import ImagesPathDataset, TransformPILtoRGBTensor
from torch_fidelity.utils import glob_samples_paths

from lantern.errors import UserError
from lantern.io import check_image, image_error

IMAGE_EXTS = "png,jpg,jpeg"  # matched case-insensitively (ImageNet's .JPEG included)
# what PIL raises for a file it cannot decode (unknown format and truncation are OSErrors)
BROKEN_IMAGE = (OSError, SyntaxError, Image.DecompressionBombError)
RESIZE_FILTERS = {"lanczos": Image.Resampling.LANCZOS, "bicubic": Image.Resampling.BICUBIC,
                  "bilinear": Image.Resampling.BILINEAR}


class ResizeCentreCrop:
    """PIL resize of the short side to `size`, then the central size x size crop (offsets rounded down, as ADM's
    center_crop_arr). An image already size x size comes back pixel-identical: PIL copies on a same-size resize."""

    def __init__(self, size: int, resize_filter: str):
        self.size, self.resample = size, RESIZE_FILTERS[resize_filter]

    def __call__(self, im: Image.Image) -> Image.Image:
        w, h = im.size
        scale = self.size / min(w, h)
        im = im.resize((max(self.size, round(w * scale)), max(self.size, round(h * scale))), self.resample)
        left, top = (im.width - self.size) // 2, (im.height - self.size) // 2
        return im.crop((left, top, left + self.size, top + self.size))


def _transforms(resolution: int, resize_filter: str):
    steps = [ResizeCentreCrop(resolution, resize_filter)] if resolution else []
    return T.Compose(steps + [TransformPILtoRGBTensor()])


class _TensorImages(Dataset):
    def __init__(self, images: torch.Tensor, resolution: int, resize_filter: str):
        self.images, self.resolution, self.tf = images, resolution, _transforms(resolution, resize_filter)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.tf(TF.to_pil_image(self.images[i])) if self.resolution else self.images[i]


class ImageSet:
    """`names`: each file's path relative to its folder (the fingerprint's key, so a moved copy hashes the same)."""

    def __init__(self, source: str, files: list[str] | None = None, images: torch.Tensor | None = None,
                 names: list[str] | None = None):
        self.source, self.files, self.images = source, files, images
        self.names = names if names is not None or files is None else [os.path.basename(f) for f in files]

    @classmethod
    def from_folders(cls, folders: list[str | os.PathLike], what: str, recursive: bool = False) -> "ImageSet":
        files, names = [], []
        for folder in folders:
            if not os.path.isdir(folder):
                raise UserError(f"{what} folder not found: {folder}")
            found = glob_samples_paths(str(folder), recursive, IMAGE_EXTS, None, verbose=False)
            if not found:
                raise UserError(f"{what} folder {folder} holds no images ({IMAGE_EXTS}"
                                f"{', subfolders searched' if recursive else ''})")
            files += found
            names += [os.path.relpath(f, folder) for f in found]
        if len(set(names)) != len(names):
            raise UserError(f"{what}: the same file name appears in two folders of {', '.join(map(str, folders))}")
        for f in files:  # a broken file stops here, not in the middle of feature extraction
            check_image(f, f"{what} file")
        return cls(", ".join(map(str, folders)), files=files, names=names)

    @classmethod
    def from_path(cls, path: str | os.PathLike, what: str) -> "ImageSet":
        """A folder of images (subfolders included, as ImageNet's class folders), or a `lantern make-data` file."""
        if os.path.isfile(path):
            from lantern.worlds.toy.data import load_data

            images = load_data(path, what)["images"]
            if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] != 3:
                raise UserError(f"{what} {path}: images must be uint8 [N, 3, H, W], got {images.dtype} "
                                f"{tuple(images.shape)}")
            return cls(str(path), images=images)
        return cls.from_folders([path], what, recursive=True)

    @property
    def kind(self) -> str:
        return "make-data file" if self.images is not None else "image folder"

    def __len__(self) -> int:
        return len(self.files) if self.files is not None else len(self.images)

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) of the first image."""
        if self.images is not None:
            return int(self.images.shape[-1]), int(self.images.shape[-2])
        try:
            with Image.open(self.files[0]) as im:
                return im.size
        except BROKEN_IMAGE as e:
            raise image_error(self.files[0], e) from None

    def fingerprint(self) -> str:
        """Content hash: a cache keyed on it can never serve features of a different set."""
        h = hashlib.sha256()
        if self.images is not None:
            h.update(str(tuple(self.images.shape)).encode() + self.images.contiguous().numpy().tobytes())
            return h.hexdigest()
        for name, f in sorted(zip(self.names, self.files)):
            h.update(name.encode() + b"\0" + Path(f).read_bytes())
        return h.hexdigest()

    def dataset(self, resolution: int = 0, resize_filter: str = "lanczos") -> Dataset:
        """uint8 [3, H, W] items, as torch-fidelity wants them."""
        if self.images is not None:
            return _TensorImages(self.images, resolution, resize_filter)
        return _CheckedImagesPathDataset(self.files, _transforms(resolution, resize_filter))

    def indices(self) -> list[int]:
        """Image index of every file, from the digits of its name (`lantern sample` writes 000123.png)."""
        if self.images is not None:
            return list(range(len(self.images)))
        out = []
        for f in self.files:
            digits = re.findall(r"\d+", Path(f).stem)
            if not digits:
                raise UserError(f"image file {f} has no index in its name; name generated images like 000123.png")
            out.append(int(digits[-1]))
        if len(set(out)) != len(out):
            raise UserError(f"two generated images share one index in {self.source}")
        return out

    def batch(self, lo: int, hi: int) -> torch.Tensor:
        """uint8 [hi - lo, 3, H, W] at stored size."""
        if self.images is not None:
            return self.images[lo:hi]
        return torch.stack([read_image(f) for f in self.files[lo:hi]])


class _CheckedImagesPathDataset(ImagesPathDataset):
    """torch-fidelity's image files dataset, where a file that fails to decode is one UserError naming it."""

    def __getitem__(self, i):
        try:
            return super().__getitem__(i)
        except BROKEN_IMAGE as e:
            raise image_error(self.files[i], e) from None


def read_image(path: str | os.PathLike) -> torch.Tensor:
    try:
        with Image.open(path) as im:
            return TF.pil_to_tensor(im.convert("RGB"))
    except BROKEN_IMAGE as e:
        raise image_error(path, e) from None
