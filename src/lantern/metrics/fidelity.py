"""FID, KID and precision/recall through torch-fidelity, with the feature extractor chosen by config.

Every number comes from torch-fidelity: its feature extraction (reference features cached as `calculate_metrics`
caches them) and its metric functions on those features (`fid_features_to_statistics` + `fid_statistics_to_metric`,
`kid_features_to_metric`, `prc_features_to_metric`; against stored FID statistics, the statistics file in place of the
reference features). This module picks the extractors, checks inputs, keys the reference-feature cache, records the
protocol, and adds each metric's standard error by a bootstrap over the generated images (bootstrap.py) on the same
features. input1 is always the generated set, input2 the reference
(torch-fidelity's precision = share of generated samples inside the reference manifold). Precision/recall use VGG16
features when `vgg16_weights` is given (as the papers), else the FID extractor's.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass

import numpy as np
import torch
import torch_fidelity
from torch import Tensor
from torch_fidelity.metric_fid import KEY_METRIC_FID, fid_features_to_statistics, fid_statistics_to_metric
from torch_fidelity.metric_kid import kid_features_to_metric
from torch_fidelity.metric_prc import prc_features_to_metric
from torch_fidelity.registry import FEATURE_EXTRACTORS_REGISTRY
from torch_fidelity.utils import create_feature_extractor, extract_featuresdict_from_input_id_cached

from lantern.errors import UserError
from lantern.io import sha256_file
from lantern.metrics.bootstrap import fid_se, prc_se, resamples
from lantern.metrics.images import RESIZE_FILTERS, ImageSet
from lantern.metrics.reference import FidStatistics

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
# the features behind published FID statistics (ADM / LlamaGen .npz: TF-Inception pool_3, 2048-d)
STATISTICS_EXTRACTOR = "inception-v3-compat"
# domain extractors: name -> "module:class", imported and registered on first use
DOMAIN_EXTRACTORS = {
    "toyclip": "lantern.metrics.clip:ToyClipFeatures",
}


@dataclass
class FidelityParams:
    extractor: str = "inception-v3-compat"  # torch-fidelity extractor name, or a domain one ("toyclip")
    weights_path: str = ""  # extractor weights file (Inception: weights-inception-2015-12-05-6726825d.pth)
    vgg16_weights: str = ""  # torchvision vgg16 state dict: precision/recall on VGG16 features (the papers'); "" = on
    #                          `extractor`'s features
    resolution: int = 0  # 0: images as stored (both sets must share one size); else resize + centre-crop both
    resize_filter: str = "lanczos"  # PIL filter of that resize: lanczos | bicubic | bilinear
    kid_subset_size: int = 1000  # clamped to the smaller set
    kid_subsets: int = 100
    prc_neighborhood: int = 3
    batch_size: int = 64
    cache_dir: str = ""  # reference features/statistics cache; "" = never cache
    seed: int = 2020  # torch-fidelity rng_seed (KID subsets) and the bootstrap's resamples
    bootstrap: int = 200  # resamples of the generated images for FID / precision / recall standard errors; 0 = none
    bootstrap_chunk: int = 1024  # feature rows per distance block of the precision / recall bootstrap (memory bound)

    def __post_init__(self):
        if self.bootstrap < 0 or self.bootstrap == 1:
            raise UserError(f"fidelity bootstrap = {self.bootstrap} must be 0 (no standard errors) or >= 2 resamples")
        chunk = self.bootstrap_chunk
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise UserError(f"fidelity bootstrap_chunk = {self.bootstrap_chunk!r} must be a positive number of rows")
        if self.resolution < 0 or self.kid_subsets < 1 or self.prc_neighborhood < 1 or self.batch_size < 1:
            raise UserError("fidelity resolution must be >= 0 and kid_subsets, prc_neighborhood, batch_size >= 1")
        if self.kid_subset_size < 2:
            raise UserError(f"fidelity kid_subset_size must be >= 2, got {self.kid_subset_size}")
        if self.resize_filter not in RESIZE_FILTERS:
            raise UserError(f"fidelity.resize_filter = {self.resize_filter!r} must be one of "
                            f"{', '.join(RESIZE_FILTERS)}")


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


def _input_resize(extractor: str) -> str:
    cls = FEATURE_EXTRACTORS_REGISTRY.get(extractor)
    return INTERNAL_RESIZE.get(extractor) or getattr(cls, "internal_resize", "see the extractor")


def _layer(extractor: str, metric: str) -> str:
    return FEATURE_EXTRACTORS_REGISTRY[extractor].get_default_feature_layer_for_metric(metric)


def _build(extractor: str, weights_path: str, key: str, metric: str):
    """Construct the extractor once up front, so a wrong weights file fails before any feature extraction."""
    try:
        return create_feature_extractor(extractor, [_layer(extractor, metric)], cuda=False,
                                        feature_extractor_weights_path=weights_path or None, verbose=False)
    except (RuntimeError, KeyError, ValueError, OSError, pickle.UnpicklingError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"cannot load {extractor} weights from {weights_path} ({key}): {first}") from None


def fid_feature_extractor(extractor: str, weights_path: str, key: str = "fidelity.weights_path"):
    """(net, weights sha256): the FID extractor as a module, uint8 [B, 3, H, W] -> (features [B, d],), for stages
    that need per-image features rather than set statistics (`lantern proximity`)."""
    _ensure_registered(extractor)
    sha = check_weights(extractor, weights_path, key)
    return _build(extractor, weights_path, key, "fid"), sha


def _check_statistics_dim(reference: FidStatistics, extractor: str, net) -> None:
    with torch.no_grad():
        dim = net(net.get_dummy_input_for_compile())[0].shape[1]
    if reference.mu.shape[0] != dim:
        raise UserError(f"reference {reference.source}: mu has {reference.mu.shape[0]} dims but {extractor} "
                        f"{_layer(extractor, 'fid')} features have {dim}; give statistics of those features")


def _features(extractor: str, weights: str, metric: str, input_ids: tuple[int, ...], **kwargs) -> list[Tensor]:
    """torch-fidelity features of inputs 1 (generated) and/or 2 (reference, cached under input2_cache_name)."""
    layer = _layer(extractor, metric)
    net = create_feature_extractor(extractor, [layer], cuda=kwargs["cuda"], verbose=kwargs["verbose"],
                                   feature_extractor_weights_path=weights or None)
    kwargs.update(feature_extractor=extractor, feature_extractor_weights_path=weights or None)
    return [extract_featuresdict_from_input_id_cached(i, net, **kwargs)[layer] for i in input_ids]


def _fid(gen: Tensor, reference: dict, verbose: bool) -> float:
    ours = fid_features_to_statistics(gen)
    if reference["mu"].dtype != ours["mu"].dtype:  # torch-fidelity's mu is float32, stored statistics float64
        ours = {k: np.asarray(v, dtype=np.float64) for k, v in ours.items()}
    return fid_statistics_to_metric(ours, reference, verbose)[KEY_METRIC_FID]


def fidelity_metrics(generated: ImageSet, reference: ImageSet | FidStatistics, p: FidelityParams,
                     verbose: bool = False) -> dict:
    """FID, KID and precision/recall of the generated set against the reference, plus their protocol. Against FID
    statistics only FID is computed; the other metrics are None and `fidelity_skipped` says why."""
    statistics = isinstance(reference, FidStatistics)
    n_gen, n_ref = len(generated), (None if statistics else len(reference))
    if n_gen < 2 or (n_ref is not None and n_ref < 2):
        raise UserError(f"FID/KID need at least 2 images per set, got {n_gen} generated"
                        + (f" and {n_ref} reference" if n_ref is not None else ""))
    if statistics and p.extractor != STATISTICS_EXTRACTOR:
        raise UserError(f"reference {reference.source} holds precomputed FID statistics, which (ADM / LlamaGen .npz) "
                        f"come from the TF Inception: set fidelity.extractor: {STATISTICS_EXTRACTOR} and its weights")
    if not statistics and not p.resolution and generated.size != reference.size:
        (gw, gh), (rw, rh) = generated.size, reference.size
        raise UserError(f"generated images are {gw}x{gh} but reference images are {rw}x{rh}: set "
                        f"fidelity.resolution to compare both at one size")
    use_vgg = bool(p.vgg16_weights) and not statistics
    prc_extractor, prc_weights = ("vgg16", p.vgg16_weights) if use_vgg else (p.extractor, p.weights_path)
    for name in {p.extractor, prc_extractor}:
        _ensure_registered(name)
    sha = check_weights(p.extractor, p.weights_path, "fidelity.weights_path")
    prc_sha = check_weights(prc_extractor, prc_weights, "fidelity.vgg16_weights") if use_vgg else sha
    net = _build(p.extractor, p.weights_path, "fidelity.weights_path", "fid")
    separate_prc = (prc_extractor, prc_weights) != (p.extractor, p.weights_path)
    if separate_prc:
        _build(prc_extractor, prc_weights, "fidelity.vgg16_weights", "prc")
    if statistics:
        _check_statistics_dim(reference, p.extractor, net)

    res = f"{p.resolution}x{p.resolution}" if p.resolution else "x".join(map(str, generated.size))
    ref_sha = reference.sha256 if statistics else reference.fingerprint()
    row = {
        "fid_backend": f"torch-fidelity {torch_fidelity.__version__}",
        "fid_extractor": p.extractor,
        "fid_feature_layer": _layer(p.extractor, "fid"),
        "fid_weights_sha256": sha,
        "fid_input_resize": _input_resize(p.extractor),
        "n_generated": n_gen,
        "n_reference": n_ref,
        "reference": reference.source,
        "reference_kind": reference.kind,
        "reference_sha256": ref_sha,
        "resolution": res,
        "resize_filter": f"PIL {p.resize_filter}" if p.resolution else "none",
        "crop": f"centre {res}" if p.resolution else "none",
        "fidelity_seed": p.seed,
    }
    cuda = torch.cuda.is_available()
    common = dict(input1=generated.dataset(p.resolution, p.resize_filter), cuda=cuda, batch_size=p.batch_size,
                  save_cpu_ram=True, verbose=verbose, rng_seed=p.seed)
    draws = resamples(n_gen, p.bootstrap, p.seed) if p.bootstrap else None
    spread = {"bootstrap_resamples": p.bootstrap,
              "se_method": "bootstrap over the generated images (reference fixed); precision / recall keep each "
                           "image's k-NN radius from the full sets" if p.bootstrap else "none"}
    if statistics:
        (gen,) = _features(p.extractor, p.weights_path, "fid", (1,), **common)
        ref_stats = {"mu": reference.mu, "sigma": reference.sigma}
        return {"fid": _fid(gen, ref_stats, verbose), "kid_mean": None, "kid_std": None, "precision": None,
                "recall": None, "f_score": None,
                "fid_se": fid_se(gen, reference.mu, reference.sigma, draws) if p.bootstrap else None,
                "precision_se": None, "recall_se": None, **spread,
                **row, "fid_reference_features": f"precomputed {reference.mu.shape[0]}-d mu/sigma; ADM / LlamaGen "
                f"files hold TF-Inception pool_3 statistics, which {STATISTICS_EXTRACTOR} reproduces",
                "fidelity_skipped": "kid, precision, recall: the reference holds FID statistics, not images",
                "prc_extractor": None, "prc_feature_layer": None, "prc_weights_sha256": None,
                "prc_input_resize": None, "prc_neighborhood": None, "kid_subset_size": None, "kid_subsets": None}

    kid_subset_size = min(p.kid_subset_size, n_gen, n_ref)
    common.update(input2=reference.dataset(p.resolution, p.resize_filter), cache=bool(p.cache_dir),
                  cache_root=p.cache_dir or None, kid_subset_size=kid_subset_size, kid_subsets=p.kid_subsets,
                  prc_neighborhood=p.prc_neighborhood)
    resize_key = f"r{res}-{p.resize_filter}" if p.resolution else f"r{res}"

    def features(extractor, weights, weights_sha, metric):
        # one cache entry per (reference content, extractor, weights checksum, resolution and filter); torch-fidelity
        # appends the extractor name and feature layer to this name
        cache_name = f"ref-{ref_sha[:16]}-w{weights_sha[:16]}-{resize_key}" if p.cache_dir else None
        return _features(extractor, weights, metric, (1, 2), **common, input2_cache_name=cache_name)

    gen, ref = features(p.extractor, p.weights_path, sha, "fid")
    fid_ref = fid_features_to_statistics(ref)
    out = {"fid": _fid(gen, fid_ref, verbose), **kid_features_to_metric(gen, ref, **common)}
    # precision / recall: each image's radius is the distance to its k-th nearest neighbour in its own set
    prc_skipped = min(n_gen, n_ref) <= p.prc_neighborhood
    if prc_skipped:
        out.update(precision=None, recall=None, f_score=None)
        spread.update(precision_se=None, recall_se=None)
    else:
        if separate_prc or _layer(p.extractor, "prc") != _layer(p.extractor, "fid"):
            gen_prc, ref_prc = features(prc_extractor, prc_weights, prc_sha, "prc")
        else:
            gen_prc, ref_prc = gen, ref
        out.update(prc_features_to_metric(gen_prc, ref_prc, **common))
        if p.bootstrap:
            spread.update(zip(("precision_se", "recall_se"),
                              prc_se(gen_prc, ref_prc, p.prc_neighborhood, draws, p.bootstrap_chunk)))
    if p.bootstrap:
        spread.update(fid_se=fid_se(gen, fid_ref["mu"], fid_ref["sigma"], draws))
    else:
        spread.update(fid_se=None, precision_se=None, recall_se=None)
    return {
        "fid": out["fid"],
        "kid_mean": out["kernel_inception_distance_mean"],
        "kid_std": out["kernel_inception_distance_std"],
        "precision": out["precision"],
        "recall": out["recall"],
        "f_score": out["f_score"],
        **spread,
        **row,
        "fid_reference_features": f"{p.extractor} on the reference images",
        "fidelity_skipped": (f"precision, recall: k = {p.prc_neighborhood} nearest neighbours need at least "
                             f"{p.prc_neighborhood + 1} images per set, got {n_gen} generated and {n_ref} reference"
                             if prc_skipped else "none"),
        "prc_extractor": prc_extractor,
        "prc_feature_layer": _layer(prc_extractor, "prc"),
        "prc_weights_sha256": prc_sha,
        "prc_input_resize": _input_resize(prc_extractor),
        "prc_neighborhood": p.prc_neighborhood,
        "kid_subset_size": kid_subset_size,
        "kid_subsets": p.kid_subsets,
    }
