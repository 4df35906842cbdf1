"""Sampling spread of the set metrics: a bootstrap over the generated images, on features already extracted.

A sweep point's FID or precision is one draw: another seed gives other images and another number. The spread of
that number, not one vanilla-vs-control pair, says which method differences are real. Each resample draws the
generated images with replacement (the reference set stays fixed: every point shares it) and recomputes:
- FID from the resample's mean and covariance, against the reference statistics;
- precision as the share of resampled images inside the reference manifold (each image's indicator is fixed);
- recall as the share of reference images inside the union of the resampled images' k-NN balls, each ball keeping
  its radius from the full set (a duplicated image would otherwise shrink its own radius to zero).
The standard error is the resamples' standard deviation. KID is left out: its unbiased estimator counts a duplicated
image against itself, and torch-fidelity's kid_std already reports its subset spread.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor


def resamples(n: int, count: int, seed: int) -> np.ndarray:
    """[count, n] image indices drawn with replacement, the same for every point of a run (seeded)."""
    return np.random.default_rng(seed).integers(0, n, size=(count, n))


def _psd_sqrt(sigma: Tensor) -> Tensor:
    w, v = torch.linalg.eigh(sigma)
    return (v * w.clamp(min=0).sqrt()) @ v.T


def fid_se(gen: Tensor, ref_mu: np.ndarray, ref_sigma: np.ndarray, draws: np.ndarray) -> float:
    """Bootstrap standard error of FID(gen, reference statistics)."""
    return float(np.std(fid_values(gen, ref_mu, ref_sigma, draws), ddof=1))


def fid_values(gen: Tensor, ref_mu: np.ndarray, ref_sigma: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """FID of each resample gen[idx]. With A = S_r^(1/2) and Y = (x - mean) A / sqrt(n - 1), Y^T Y = A S_g A, so
    tr sqrt(S_g S_r) = sum sqrt(eig(Y^T Y)) = sum sqrt(eig(Y Y^T)): one symmetric eigendecomposition per resample,
    of the smaller of d x d and n x n (a few hundred images of 2048-d Inception features need no 2048 x 2048 one).
    On the GPU when there is one."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = gen.to(device, torch.float64)
    mu_r = torch.as_tensor(np.asarray(ref_mu, np.float64), device=device)
    sig_r = torch.as_tensor(np.asarray(ref_sigma, np.float64), device=device)
    root = _psd_sqrt(sig_r)
    values = []
    for idx in draws:
        x = g[torch.as_tensor(idx, device=device)]
        mu = x.mean(0)
        y = (x - mu) @ root / math.sqrt(len(idx) - 1)
        gram = y @ y.T if y.shape[0] < y.shape[1] else y.T @ y
        tr_covmean = torch.linalg.eigvalsh(gram).clamp(min=0).sqrt().sum()
        tr_sig = (x - mu).pow(2).sum() / (len(idx) - 1)
        values.append(float((mu - mu_r).pow(2).sum() + tr_sig + sig_r.trace() - 2 * tr_covmean))
    return np.array(values)


def prc_se(gen: Tensor, ref: Tensor, neighborhood: int, draws: np.ndarray, chunk: int = 1024) -> tuple[float, float]:
    """Bootstrap standard errors of (precision, recall)."""
    precision, recall = prc_values(gen, ref, neighborhood, draws, chunk)
    return float(np.std(precision, ddof=1)), float(np.std(recall, ddof=1))


def knn_radii(x: Tensor, neighborhood: int, chunk: int) -> Tensor:
    """Each row's distance to its k-th nearest other row (k = neighborhood; the row itself is the 0th), computed
    `chunk` rows at a time: memory ~ chunk x len(x) x 8 bytes x a few, never len(x)^2 (50k ImageNet-val
    references: 18.6 GiB for one full float64 distance matrix)."""
    out = torch.empty(len(x), dtype=x.dtype, device=x.device)  # written in place: no small tensor between the
    for lo in range(0, len(x), chunk):  # blocks, which would keep glibc from reusing the freed block (RSS growth)
        out[lo : lo + chunk] = torch.cdist(x[lo : lo + chunk], x).kthvalue(neighborhood + 1, dim=1).values
    return out


def prc_values(gen: Tensor, ref: Tensor, neighborhood: int, draws: np.ndarray,
               chunk: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """(precision, recall) of each resample in torch-fidelity's convention (k-NN balls, k = neighborhood, the point
    itself excluded), every generated ball keeping its full-set radius. Distances are computed `chunk` rows at a
    time (on the GPU when there is one); which generated balls hold which reference image is kept as index pairs,
    as many as there are such memberships (about k x the generated images), not an n_ref x n_gen matrix."""
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"distance chunk={chunk!r} must be a positive number of rows")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    g, r = gen.to(device, torch.float64), ref.to(device, torch.float64)
    radius_g, radius_r = knn_radii(g, neighborhood, chunk), knn_radii(r, neighborhood, chunk)
    inside_ref = torch.zeros(len(g), dtype=torch.bool, device=device)  # generated j lies in the reference manifold
    pairs = []  # (reference i, generated j): i lies in j's ball
    for lo in range(0, len(r), chunk):
        d_rg = torch.cdist(r[lo : lo + chunk], g)  # [chunk, n_gen]
        inside_ref |= (d_rg <= radius_r[lo : lo + chunk, None]).any(0)
        i, j = torch.nonzero(d_rg <= radius_g[None, :], as_tuple=True)
        pairs.append(torch.stack([i + lo, j]).to("cpu", torch.int32))
        del d_rg
    ref_of, gen_of = torch.cat(pairs, 1).numpy()
    inside_ref = inside_ref.cpu().numpy()
    precision = np.array([inside_ref[idx].mean() for idx in draws])
    recall = []
    for idx in draws:
        drawn = np.zeros(len(g), dtype=bool)
        drawn[idx] = True
        covered = np.zeros(len(r), dtype=bool)
        covered[ref_of[drawn[gen_of]]] = True
        recall.append(covered.mean())
    return precision, np.array(recall)
