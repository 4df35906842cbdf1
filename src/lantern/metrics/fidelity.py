"""FID, KID and precision/recall through torch-fidelity, with the feature extractor chosen by config.

Every number comes from `torch_fidelity.calculate_metrics`; this module only picks the extractor, checks inputs,
keys the reference-feature cache and records the protocol. input1 is always the generated set, input2 the reference
(torch-fidelity's precision = share of generated samples inside the reference manifold).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch_fidelity
from torch_fidelity.registry import FEATURE_EXTRACTORS_REGISTRY
from torch_fidelity.utils import create_feature_extractor

from ..errors import UserError
from ..io import sha256_file
from .images import ImageSet, describe_resize

# torch-fidelity's own extractors download their weights when no file is given: here a file is always required.
BUILTIN_WEIGHTS = {
    "inception-v3-compat": "weights-inception-2015-12-05-6726825d.pth from "
    "https://github.com/toshas/torch-fidelity/releases/download/v0.2.0/",
    "vgg16": "a torchvision vgg16 state dict, e.g. vgg16-397923af.pth (torchvision IMAGENET1K_V1)",
}
# how each extractor resizes internally (recorded in the protocol)
INTERNAL_RESIZE = {
    "inception-v3-compat": "TF1-compatible bilinear to 299x299",
    "vgg16": "TF1-compatible bilinear to 224x224",
}
# domain extractors: name -> "module:class", imported and registered on first use
DOMAIN_EXTRACTORS = {
    "toyclip": "lantern.metrics.clip:ToyClipFeatures",
}


@dataclass
class FidelityParams:
    extractor: str = "inception-v3-compat"  # torch-fidelity extractor name, or a domain one ("toyclip")
    weights_path: str = ""  # extractor weights file (Inception: weights-inception-2015-12-05-6726825d.pth)
    prc_extractor: str = ""  # precision/recall extractor; "" = same as `extractor` (paper: "vgg16")
    prc_weights_path: str = ""
    resolution: int = 0  # 0: images as stored (both sets must share one size); else resize + center-crop both
    kid_subset_size: int = 1000  # clamped to the smaller set
    kid_subsets: int = 100
    prc_neighborhood: int = 3
    batch_size: int = 64
    cache_dir: str = ""  # reference features/statistics cache; "" = never cache
    seed: int = 2020  # torch-fidelity rng_seed (KID subsets)

    def __post_init__(self):
        if self.resolution < 0 or self.kid_subsets < 1 or self.prc_neighborhood < 1 or self.batch_size < 1:
            raise UserError("fidelity resolution must be >= 0 and kid_subsets, prc_neighborhood, batch_size >= 1")
        if self.kid_subset_size < 2:
            raise UserError(f"fidelity kid_subset_size must be >= 2, got {self.kid_subset_size}")


def register_extractor(name: str, cls) -> None:
    """Register a torch-fidelity feature extractor once; registering the same class again is a no-op."""
    if FEATURE_EXTRACTORS_REGISTRY.get(name) is cls:
        return
    if name in FEATURE_EXTRACTORS_REGISTRY:
        raise UserError(f"feature extractor name {name!r} is already taken by {FEATURE_EXTRACTORS_REGISTRY[name]}")
    torch_fidelity.register_feature_extractor(name, cls)


def _ensure_registered(name: str) -> None:
    if name in DOMAIN_EXTRACTORS:
        module, cls = DOMAIN_EXTRACTORS[name].split(":")
        register_extractor(name, getattr(__import__(module, fromlist=[cls]), cls))
    if name not in FEATURE_EXTRACTORS_REGISTRY:
        known = sorted(set(FEATURE_EXTRACTORS_REGISTRY) | set(DOMAIN_EXTRACTORS))
        raise UserError(f"unknown feature extractor {name!r}; choose one of: {', '.join(known)}")


def _weights_hint(extractor: str) -> str:
    if extractor in DOMAIN_EXTRACTORS:
        return "the checkpoint written by `lantern train-clip`"
    return BUILTIN_WEIGHTS.get(extractor, f"torch-fidelity's {extractor} weights file")


def _is_domain(name: str) -> bool:
    """Extractors registered by this project or a user (not torch-fidelity's own, which download weights)."""
    cls = FEATURE_EXTRACTORS_REGISTRY.get(name)
    return cls is not None and not cls.__module__.startswith("torch_fidelity.")


def check_weights(extractor: str, weights_path: str, key: str) -> str:
    """Validate the weights file of `extractor`; returns its sha256 ("none" for an extractor that needs no file)."""
    if not weights_path:
        if _is_domain(extractor) and extractor not in DOMAIN_EXTRACTORS:
            return "none"  # a user-registered extractor that carries its own weights
        raise UserError(f"{key} is empty: the {extractor} extractor needs a local weights file "
                        f"({_weights_hint(extractor)}); nothing is downloaded")
    if not os.path.isfile(weights_path):
        raise UserError(f"{extractor} weights not found at {weights_path}: put {_weights_hint(extractor)} there, "
                        f"or point {key} at where it is")
    return sha256_file(weights_path)


def _describe_resize(extractor: str, resolution: int) -> str:
    cls = FEATURE_EXTRACTORS_REGISTRY.get(extractor)
    internal = INTERNAL_RESIZE.get(extractor) or getattr(cls, "internal_resize", "see the extractor")
    return f"{describe_resize(resolution)}; then {extractor}: {internal}"


def _try_build(extractor: str, weights_path: str, key: str) -> None:
    """Construct the extractor once up front, so a wrong weights file fails before any feature extraction."""
    try:
        create_feature_extractor(extractor, [_default_layer(extractor)], cuda=False,
                                 feature_extractor_weights_path=weights_path or None, verbose=False)
    except (RuntimeError, KeyError, ValueError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"cannot load {extractor} weights from {weights_path} ({key}): {first}") from None


def _default_layer(extractor: str) -> str:
    return FEATURE_EXTRACTORS_REGISTRY[extractor].get_default_feature_layer_for_metric("fid")


def fidelity_metrics(generated: ImageSet, reference: ImageSet, p: FidelityParams, verbose: bool = False) -> dict:
    """FID, KID and precision/recall of the generated set against the reference set, plus their protocol."""
    n_gen, n_ref = len(generated), len(reference)
    if min(n_gen, n_ref) < 2:
        raise UserError(f"FID/KID need at least 2 images per set, got {n_gen} generated and {n_ref} reference")
    if not p.resolution and generated.size != reference.size:
        (gw, gh), (rw, rh) = generated.size, reference.size
        raise UserError(f"generated images are {gw}x{gh} but reference images are {rw}x{rh}: set "
                        f"fidelity.resolution to compare both at one size")
    prc_extractor = p.prc_extractor or p.extractor
    prc_weights = p.prc_weights_path if p.prc_extractor else p.weights_path
    for name in {p.extractor, prc_extractor}:
        _ensure_registered(name)
    sha = check_weights(p.extractor, p.weights_path, "fidelity.weights_path")
    prc_sha = check_weights(prc_extractor, prc_weights, "fidelity.prc_weights_path") if p.prc_extractor else sha
    _try_build(p.extractor, p.weights_path, "fidelity.weights_path")
    separate_prc = (prc_extractor, prc_weights) != (p.extractor, p.weights_path)
    if separate_prc:
        _try_build(prc_extractor, prc_weights, "fidelity.prc_weights_path")

    res = f"{p.resolution}x{p.resolution}" if p.resolution else "x".join(map(str, generated.size))
    ref_key = reference.fingerprint()[:16]
    kid_subset_size = min(p.kid_subset_size, n_gen, n_ref)
    common = dict(
        input1=generated.dataset(p.resolution), input2=reference.dataset(p.resolution),
        cuda=torch.cuda.is_available(), batch_size=p.batch_size, save_cpu_ram=True, verbose=verbose,
        rng_seed=p.seed, cache=bool(p.cache_dir), cache_root=p.cache_dir or None,
        kid_subset_size=kid_subset_size, kid_subsets=p.kid_subsets, prc_neighborhood=p.prc_neighborhood,
    )

    def run(extractor, weights, weights_sha, **metrics):
        # one cache entry per (reference content, extractor, weights checksum, resolution); torch-fidelity appends
        # the extractor name and feature layer to this name
        cache_name = f"ref-{ref_key}-w{weights_sha[:16]}-r{res}" if p.cache_dir else None
        return torch_fidelity.calculate_metrics(**common, **metrics, feature_extractor=extractor,
                                                feature_extractor_weights_path=weights or None,
                                                input2_cache_name=cache_name)

    out = run(p.extractor, p.weights_path, sha, fid=True, kid=True, prc=not separate_prc)
    if separate_prc:
        out.update(run(prc_extractor, prc_weights, prc_sha, prc=True))
    return {
        "fid": out["frechet_inception_distance"],
        "kid_mean": out["kernel_inception_distance_mean"],
        "kid_std": out["kernel_inception_distance_std"],
        "precision": out["precision"],
        "recall": out["recall"],
        "f_score": out["f_score"],
        "fid_backend": f"torch-fidelity {torch_fidelity.__version__}",
        "fid_extractor": p.extractor,
        "fid_feature_layer": _default_layer(p.extractor),
        "fid_weights_sha256": sha,
        "prc_extractor": prc_extractor,
        "prc_weights_sha256": prc_sha,
        "prc_neighborhood": p.prc_neighborhood,
        "kid_subset_size": kid_subset_size,
        "kid_subsets": p.kid_subsets,
        "n_generated": n_gen,
        "n_reference": n_ref,
        "reference": reference.source,
        "reference_sha256_16": ref_key,
        "resolution": res,
        "resize_filter": _describe_resize(p.extractor, p.resolution),
        "fidelity_seed": p.seed,
    }
