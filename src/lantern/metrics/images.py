"""Image sets to score: PNG/JPEG files from one or more folders (e.g. the shards of one sweep point), or the uint8
images of a `lantern make-data` file (the toy world's reference set, no PNG round trip needed: PNG is lossless)."""

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

from ..errors import UserError

IMAGE_EXTS = "png,jpg,jpeg"


def _transforms(resolution: int):
    """torch-fidelity's own folder pipeline (samples_resize_and_crop), applied to every set alike."""
    steps = [T.Resize(resolution), T.CenterCrop(resolution)] if resolution else []
    return T.Compose(steps + [TransformPILtoRGBTensor()])


def describe_resize(resolution: int) -> str:
    return f"torchvision Resize({resolution}, bilinear, antialias) + CenterCrop({resolution})" if resolution else "none"


class _TensorImages(Dataset):
    def __init__(self, images: torch.Tensor, resolution: int):
        self.images, self.resolution, self.tf = images, resolution, _transforms(resolution)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.tf(TF.to_pil_image(self.images[i])) if self.resolution else self.images[i]


class ImageSet:
    def __init__(self, source: str, files: list[str] | None = None, images: torch.Tensor | None = None):
        self.source, self.files, self.images = source, files, images

    @classmethod
    def from_folders(cls, folders: list[str | os.PathLike], what: str) -> "ImageSet":
        files = []
        for folder in folders:
            if not os.path.isdir(folder):
                raise UserError(f"{what} folder not found: {folder}")
            found = glob_samples_paths(str(folder), False, IMAGE_EXTS, None, verbose=False)
            if not found:
                raise UserError(f"{what} folder {folder} holds no images ({IMAGE_EXTS})")
            files += found
        names = [os.path.basename(f) for f in files]
        if len(set(names)) != len(names):
            raise UserError(f"{what}: the same file name appears in two folders of {', '.join(map(str, folders))}")
        return cls(", ".join(map(str, folders)), files=files)

    @classmethod
    def from_path(cls, path: str | os.PathLike, what: str) -> "ImageSet":
        """A folder of images, or a `lantern make-data` file."""
        if os.path.isfile(path):
            from ..data import load_data

            images = load_data(path, what)["images"]
            if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] != 3:
                raise UserError(f"{what} {path}: images must be uint8 [N, 3, H, W], got {images.dtype} "
                                f"{tuple(images.shape)}")
            return cls(str(path), images=images)
        return cls.from_folders([path], what)

    def __len__(self) -> int:
        return len(self.files) if self.files is not None else len(self.images)

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) of the first image."""
        if self.images is not None:
            return int(self.images.shape[-1]), int(self.images.shape[-2])
        with Image.open(self.files[0]) as im:
            return im.size

    def fingerprint(self) -> str:
        """Content hash: a cache keyed on it can never serve features of a different set."""
        h = hashlib.sha256()
        if self.images is not None:
            h.update(str(tuple(self.images.shape)).encode() + self.images.contiguous().numpy().tobytes())
            return h.hexdigest()
        for f in sorted(self.files, key=os.path.basename):
            h.update(os.path.basename(f).encode() + b"\0" + Path(f).read_bytes())
        return h.hexdigest()

    def dataset(self, resolution: int = 0) -> Dataset:
        """uint8 [3, H, W] items, as torch-fidelity wants them."""
        if self.images is not None:
            return _TensorImages(self.images, resolution)
        return ImagesPathDataset(self.files, _transforms(resolution))

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


def read_image(path: str | os.PathLike) -> torch.Tensor:
    with Image.open(path) as im:
        return TF.pil_to_tensor(im.convert("RGB"))
