"""The reference side of FID / KID / precision-recall: images (a folder or a `lantern make-data` file), or
precomputed FID statistics in an .npz with `mu` and `sigma` (the ADM / LlamaGen evaluator layout, e.g.
VIRTUAL_imagenet256_labeled.npz). Statistics carry no per-image features, so only FID can use them."""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass

import numpy as np

from lantern.errors import UserError
from lantern.io import sha256_file
from lantern.metrics.images import ImageSet

STATISTICS_KIND = "FID statistics (mu, sigma)"


@dataclass(frozen=True)
class FidStatistics:
    source: str
    mu: np.ndarray  # [D] float64
    sigma: np.ndarray  # [D, D] float64
    sha256: str
    kind: str = STATISTICS_KIND

    @classmethod
    def load(cls, path: str | os.PathLike, what: str = "reference") -> "FidStatistics":
        if not os.path.isfile(path):
            raise UserError(f"{what} statistics file not found: {path}")
        if not zipfile.is_zipfile(path):
            raise UserError(f"{what} {path} is not an .npz archive; give FID statistics saved by np.savez(mu=, sigma=)")
        try:
            # members load on access: an ADM file's bundled images (arr_0, gigabytes) are never read
            with np.load(path, allow_pickle=False) as npz:
                keys = list(npz.files)
                if not {"mu", "sigma"} <= set(keys):
                    raise UserError(f"{what} {path} has no mu and sigma arrays (it holds {', '.join(keys) or 'none'}); "
                                    f"give FID statistics (mu, sigma), an image folder or a make-data file")
                mu, sigma = npz["mu"].astype(np.float64), npz["sigma"].astype(np.float64)
        except (OSError, ValueError, zipfile.BadZipFile) as e:
            raise UserError(f"cannot read {what} {path} as an .npz of FID statistics: {e}") from None
        d = mu.shape[0] if mu.ndim == 1 else -1
        if d < 2 or sigma.shape != (d, d):
            raise UserError(f"{what} {path}: mu must be [D] and sigma [D, D], got {mu.shape} and {sigma.shape}")
        if not (np.isfinite(mu).all() and np.isfinite(sigma).all()):
            raise UserError(f"{what} {path}: mu or sigma holds NaN or inf; recompute the statistics")
        return cls(str(path), mu, sigma, sha256_file(path))


def load_reference(path: str | os.PathLike, what: str = "reference") -> ImageSet | FidStatistics:
    """An .npz is statistics; a folder or any other file is images (see ImageSet.from_path)."""
    if str(path).lower().endswith(".npz"):
        return FidStatistics.load(path, what)
    return ImageSet.from_path(path, what)
