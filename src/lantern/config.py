"""Validate a pipeline config against workflow/schemas/config.schema.yaml, fill defaults, and check semantics.

Every failure is one UserError line naming the key and the fix, raised before any job starts.
"""

from __future__ import annotations

import copy
import itertools
import sys
from pathlib import Path

import jsonschema
import yaml

from .errors import UserError

SCHEMA = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"
LLAMAGEN_CODEBOOK = 16384


def load_schema(path: Path = SCHEMA) -> dict:
    return yaml.safe_load(path.read_text())


def _fill_defaults(node: dict, schema: dict) -> None:
    for key, sub in schema.get("properties", {}).items():
        if key not in node and "default" in sub:
            node[key] = copy.deepcopy(sub["default"])
        if isinstance(node.get(key), dict) and sub.get("type") == "object":
            _fill_defaults(node[key], sub)
        if isinstance(node.get(key), list) and isinstance(sub.get("items"), dict):
            for item in node[key]:
                if isinstance(item, dict):
                    _fill_defaults(item, sub["items"])


def _key(path) -> str:
    return ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in path).replace(".[", "[") or "<top level>"


def _schema_error(err: jsonschema.ValidationError) -> UserError:
    where = _key(err.absolute_path)
    if err.validator == "additionalProperties":
        allowed = sorted(err.schema.get("properties", {}))
        extra = sorted(set(err.instance) - set(allowed))
        return UserError(f"config: unknown key {where}.{extra[0]}; allowed keys there: {', '.join(allowed)}".replace("<top level>.", ""))
    if err.validator == "enum":
        return UserError(f"config: {where} = {err.instance!r} is not allowed; use one of {', '.join(map(str, err.validator_value))}")
    if err.validator == "type":
        return UserError(f"config: {where} = {err.instance!r} has the wrong type; it must be a {err.validator_value}")
    if err.validator == "required":
        return UserError(f"config: {where} is missing {err.message.split()[0]}; add it")
    return UserError(f"config: {where}: {err.message}")


def as_list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def codebook_size(cfg: dict) -> int:
    if cfg["world"] == "llamagen":
        return LLAMAGEN_CODEBOOK
    from .train_vq import VQParams

    return int(cfg["toy"]["vq"].get("codebook_size", VQParams().codebook_size))


def _check_methods(cfg: dict) -> None:
    max_k = cfg["neighbours"]["max_k"]
    if max_k > codebook_size(cfg) - 1:
        raise UserError(
            f"config: neighbours.max_k = {max_k} exceeds the codebook's {codebook_size(cfg) - 1} other codes; lower it"
        )
    for i, m in enumerate(cfg["sweep"]["methods"]):
        where = f"sweep.methods[{i}]"
        needs = {"lantern": ("delta", "k"), "lanternpp": ("lam", "k")}.get(m["name"], ())
        for key in needs:
            if key not in m:
                raise UserError(f"config: {where} ({m['name']}) needs {key}; add e.g. {key}: [{'0.1' if key == 'delta' else '2' if key == 'lam' else '10'}]")
        for key, values in ((k, as_list(m[k])) for k in ("gamma", "delta", "lam", "k") if k in m):
            for v in values:
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise UserError(f"config: {where}.{key} = {v!r} must be a number (or a list of numbers)")
                if key == "delta" and v < 0:
                    raise UserError(f"config: {where}.delta = {v} is negative; the TV budget delta must be >= 0")
                if key == "lam" and v <= 1:
                    raise UserError(f"config: {where}.lam = {v} must be > 1 (lam = 1 is exact decoding; use name: exact)")
                if key == "k" and (v < 0 or v != int(v)):
                    raise UserError(f"config: {where}.k = {v} must be a non-negative integer")
                if key == "k" and v > max_k:
                    raise UserError(
                        f"config: {where}.k = {v} is larger than neighbours.max_k = {max_k}"
                        f" (codebook size {codebook_size(cfg)}); lower k or raise neighbours.max_k"
                    )
                if key == "gamma" and (v < 1 or v != int(v)):
                    raise UserError(f"config: {where}.gamma = {v} must be a positive integer")


def _check_paths(cfg: dict) -> None:
    if cfg["metrics"]["fid_extractor"] == "clip" and cfg["metrics"]["clip_model"] != "toy":
        raise UserError("config: metrics.fid_extractor = clip uses the toy CLIP's image tower; with a published CLIP "
                        "set metrics.fid_extractor: inception-v3-compat and metrics.inception_weights")
    required = []
    if cfg["world"] == "llamagen":
        required += [("llamagen.gpt_ckpt", cfg["llamagen"]["gpt_ckpt"]), ("llamagen.vq_ckpt", cfg["llamagen"]["vq_ckpt"])]
        if any(m["name"] != "vanilla" for m in cfg["sweep"]["methods"]):
            required.append(("llamagen.drafter_ckpt", cfg["llamagen"]["drafter_ckpt"]))
    if cfg["metrics"]["fid_extractor"] == "inception-v3-compat":
        required.append(("metrics.inception_weights", cfg["metrics"]["inception_weights"]))
    if cfg["metrics"]["clip_model"] != "toy":
        required.append(("metrics.clip_ckpt", cfg["metrics"]["clip_ckpt"]))
    for key, value in required:
        if not value:
            raise UserError(f"config: {key} is empty; set it to the checkpoint file on disk")
        if not Path(value).is_file():
            raise UserError(f"config: {key} = {value} does not exist; download the file there or fix the path")


def validate_config(config: dict, schema: dict | None = None) -> dict:
    """Return a validated copy of `config` with every default filled in."""
    cfg = copy.deepcopy(dict(config))
    schema = schema or load_schema()
    _fill_defaults(cfg, schema)
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(cfg), key=lambda e: list(e.absolute_path))
    if errors:
        raise _schema_error(jsonschema.exceptions.best_match(errors))
    _check_methods(cfg)
    _check_paths(cfg)
    return cfg


def expand_methods(cfg: dict) -> dict[str, dict]:
    """Sweep points as data: name -> method spec, list values of a method expanded into a grid."""
    points: dict[str, dict] = {}
    grid_keys = ("gamma", "delta", "lam", "k")
    for m in cfg["sweep"]["methods"]:
        if m["name"] == "vanilla":
            points["vanilla"] = {"name": "vanilla", "seed": cfg["seed"]}
            points["vanilla-control"] = {"name": "vanilla", "seed": cfg["sweep"]["control_seed"]}
            continue
        keys = [k for k in grid_keys if k in m]
        for values in itertools.product(*(as_list(m[k]) for k in keys)):
            spec = {**m, **dict(zip(keys, values)), "seed": cfg["seed"]}
            spec = {k: v for k, v in spec.items() if not (k == "tree" and spec["drafting"] != "static")}
            points[point_name(spec)] = spec
    return points


# The noise-free control world: the same shapes, no gradient, texture or pixel noise.
CLEAN_WORLD = {"background_gradient": False, "texture_amplitude": 0.0, "noise_sigma": 0.0}


def data_params(cfg: dict, world: str = "default") -> dict:
    """`lantern make-data --params` of a toy world (split sizes are separate arguments)."""
    base = {k: v for k, v in cfg["toy"]["data"].items() if k not in ("n_train", "n_val")}
    return {**base, **CLEAN_WORLD} if world == "clean" else base


def target_params(cfg: dict, world: str = "default") -> dict:
    """`lantern train-gpt --params` of a toy world: toy.target, with toy.clean_target over it for the clean world."""
    base = dict(cfg["toy"]["target"])
    return {**base, **cfg["toy"]["clean_target"]} if world == "clean" else base


def evaluate_params(cfg: dict, clip_weights: str) -> dict:
    """`lantern evaluate --params` of a config: the extractor for FID / KID / precision-recall and the CLIP model,
    `clip_weights` being the CLIP checkpoint (the toy CLIP's, or metrics.clip_ckpt)."""
    m = cfg["metrics"]
    toy_clip = m["clip_model"] == "toy"
    if m["fid_extractor"] == "clip":
        fidelity = {"extractor": "toyclip" if toy_clip else "clip", "weights_path": clip_weights}
    else:
        fidelity = {"extractor": "inception-v3-compat", "weights_path": m["inception_weights"]}
    fidelity["cache_dir"] = f"{cfg['outdir']}/metrics/reference_cache"
    clip = {"model": "" if toy_clip else m["clip_model"], "weights_path": clip_weights, "prompt_prefix": m["prompt_prefix"]}
    return {"fidelity": fidelity, "clip": clip}


def point_name(spec: dict) -> str:
    parts = [spec["name"], spec.get("drafting", "chain")]
    if spec.get("drafting", "chain") == "chain":
        parts.append(f"g{spec['gamma']}")
    elif spec["drafting"] == "static":
        parts.append(spec.get("tree", "naive_extend_57"))
        if spec.get("tree") == "chain":
            parts.append(f"g{spec['gamma']}")
    else:
        parts += [f"{tag}{spec[key]}" for key, tag in (("total_tokens", "n"), ("depth", "depth"), ("top_k", "top")) if key in spec]
    for key, tag in (("delta", "d"), ("lam", "l"), ("k", "k")):
        if key in spec:
            parts.append(f"{tag}{spec[key]}")
    if spec["name"] == "lantern" and spec.get("residual", "bounded") != "bounded":
        parts.append(spec["residual"])
    return "-".join(map(str, parts))


def main(argv: list[str]) -> None:
    """`lantern check-config FILE [FILE ...]`: validate config files (later files override earlier ones)."""
    if not argv:
        raise UserError("usage: lantern check-config config/config.yaml [override.yaml ...]")
    merged: dict = {}
    for path in argv:
        if not Path(path).is_file():
            raise UserError(f"config file {path} does not exist")
        merged.update(yaml.safe_load(Path(path).read_text()) or {})
    cfg = validate_config(merged)
    print(f"config OK: {len(expand_methods(cfg))} sweep points x {len(cfg['sweep']['modes'])} modes", file=sys.stdout)
