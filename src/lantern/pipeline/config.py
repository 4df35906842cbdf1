"""Validate a pipeline config against workflow/schemas/config.schema.yaml, fill defaults, and check semantics.

Every failure is one UserError line naming the key and the fix, raised before any job starts.
"""

from __future__ import annotations

import copy
import json
import math
import sys
from pathlib import Path

import jsonschema
import yaml

from lantern.errors import UserError
from lantern.metrics.hpsv2 import HPSv2Params, check_hpsv2
from lantern.params import check_device_name
from lantern.pipeline.config_inputs import (check_chameleon_inputs, check_chameleon_methods, check_llamagen_inputs,
                                            check_outdir, check_vq_downsample)

SCHEMA = Path(__file__).resolve().parents[3] / "workflow" / "schemas" / "config.schema.yaml"


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
        return UserError(f"config: {where} = {err.instance!r} is not allowed; use one of "
                         f"{', '.join(map(_yaml_word, err.validator_value))}")
    if err.validator == "type":
        kind = str(err.validator_value)
        article = "an" if kind[0] in "aeiou" else "a"
        return UserError(f"config: {where} = {err.instance!r} has the wrong type; it must be {article} {kind}")
    if err.validator == "required":
        return UserError(f"config: {where} is missing {err.message.split()[0]}; add it")
    return UserError(f"config: {where}: {err.message}")


def _yaml_word(value) -> str:
    """A value as a YAML file spells it: true / false / null, not Python's True / False / None."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _check_integers(node, schema: dict, path: tuple = ()) -> None:
    """JSON Schema counts 4.0 as an integer; a config that writes a float where an integer belongs is a mistake
    (a count or a size typed by hand, or a computed value), so it stops here with the integer to write."""
    if isinstance(node, dict):
        for key, sub in schema.get("properties", {}).items():
            if key in node:
                _check_integers(node[key], sub, (*path, key))
    elif isinstance(node, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(node):
            _check_integers(item, schema["items"], (*path, i))
    elif isinstance(node, float) and schema.get("type") == "integer":
        fix = f"write {int(node)}" if node.is_integer() else "write a whole number"
        raise UserError(f"config: {_key(path)} = {node!r} must be an integer; {fix}")


def codebook_size(cfg: dict) -> int:
    if cfg["world"] == "llamagen":  # read from the file (checked to exist before the methods are)
        from lantern.engine.rules.neighbours import read_codebook

        try:
            return int(read_codebook(cfg["llamagen"]["vq_ckpt"]).shape[0])
        except UserError as e:
            raise UserError(f"config: llamagen.vq_ckpt: {e}") from None
    if cfg["world"] == "chameleon":  # the family's VQGAN: 8192 codes
        from lantern.engine.models.chameleon import IMAGE_CODES

        return IMAGE_CODES
    from lantern.hparams import VQParams

    return int(cfg["toy"]["vq"].get("codebook_size", VQParams().codebook_size))


def _fill_llamagen(cfg: dict) -> None:
    """Defaults that depend on the model type: one condition token for c2i, 120 caption positions for t2i."""
    lg = cfg["llamagen"]
    t2i = lg["model_type"] == "t2i"
    lg.setdefault("cls_token_num", 120 if t2i else 1)
    lg["drafter"].setdefault("layout", "captions" if t2i else "classes")


def image_tokens(cfg: dict) -> int:
    lg = cfg["llamagen"]
    return (lg["image_size"] // lg["downsample"]) ** 2


def chameleon_pixels(cfg: dict) -> int:
    """The Chameleon world's image side: chameleon.pixels, else its family's (Anole 512, Lumina-mGPT 768)."""
    from lantern.worlds.chameleon.world import DEFAULT_PIXELS

    ch = cfg["chameleon"]
    return ch.get("pixels") or DEFAULT_PIXELS[ch["family"]]


def target_spec(cfg: dict) -> dict:
    """The llamagen target as data (`--target-spec` of every job that loads it; checked against the file's tensors)."""
    lg = cfg["llamagen"]
    spec = {"model_type": lg["model_type"], "gpt_size": lg["gpt_size"], "image_tokens": image_tokens(cfg),
            "cls_token_num": lg["cls_token_num"]}
    if lg["model_type"] == "c2i":
        spec["num_classes"] = lg["num_classes"]
    return spec


def drafter_source(cfg: dict) -> str:
    """Where the llamagen world's drafter comes from: a ready file, the authors' release, or training."""
    lg = cfg["llamagen"]
    return "file" if lg["drafter_ckpt"] else "authors" if lg["authors_drafter"] else "train"


def target_source(cfg: dict) -> str:
    """Where the llamagen target comes from: an upstream-layout file, or the LANTERN authors' HF-format target (its
    folder with config.json and weights, or its model.safetensors / pytorch_model.bin beside that config.json),
    which the convert_target rule converts."""
    from lantern.worlds.llamagen.hf import is_authors_target

    path = cfg["llamagen"]["gpt_ckpt"]
    return "authors" if path and is_authors_target(path) else "file"


def _read_json(path: Path, key: str) -> dict:
    try:
        obj = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"config: {key}: {path} is not readable JSON ({type(e).__name__}); download it again") from None
    if not isinstance(obj, dict):
        raise UserError(f"config: {key}: {path} holds no JSON object; download it again")
    return obj


def _require_target(cfg: dict) -> None:
    """llamagen.gpt_ckpt: an upstream file, or the authors' HF target with its config.json and weights."""
    from lantern.worlds.llamagen.hf import INDEX_FILES, WEIGHT_FILES

    path = cfg["llamagen"]["gpt_ckpt"]
    if target_source(cfg) == "file":
        _require_file("llamagen.gpt_ckpt", path)
        return
    folder = Path(path) if Path(path).is_dir() else Path(path).parent
    if not (folder / "config.json").is_file() or not any((folder / n).is_file() for n in WEIGHT_FILES + INDEX_FILES):
        raise UserError(f"config: llamagen.gpt_ckpt = {path} is a folder without config.json and "
                        f"{' / '.join(WEIGHT_FILES)}; give the authors' HF target folder or an upstream .pt file")


def _authors_config(path: str, key: str) -> dict:
    """config.json of one of the authors' HF folders (or beside one of their weight files)."""
    folder = Path(path) if Path(path).is_dir() else Path(path).parent
    return _read_json(folder / "config.json", key) if (folder / "config.json").is_file() else {}


def _check_authors_files(cfg: dict) -> None:
    """What the authors' config.json files state, against the recipe, before any job: the HF target's kind,
    vocabulary and token grid (a stage-II target run as stage I decodes 256 tokens on a 16 x 16 grid), and the
    drafter's stage (input_type t2i: stage I, t2i2: stage II)."""
    from types import SimpleNamespace

    from lantern.worlds.llamagen.hf import check_drafter_config

    lg = cfg["llamagen"]
    want = SimpleNamespace(model_type=lg["model_type"], image_tokens=image_tokens(cfg), rope_base=10000.0)
    if target_source(cfg) == "authors":
        hf = _authors_config(lg["gpt_ckpt"], "llamagen.gpt_ckpt")
        kind = {"t2i2": "t2i"}.get(hf.get("input_type"), hf.get("input_type"))
        if kind not in (None, want.model_type):
            raise UserError(f"config: llamagen.gpt_ckpt {lg['gpt_ckpt']} is a {kind} target (config.json input_type), "
                            f"but llamagen.model_type = {want.model_type}; set llamagen.model_type: {kind}")
        tokens = hf.get("block_size")
        if tokens is not None and tokens != want.image_tokens:
            raise UserError(f"config: llamagen.gpt_ckpt {lg['gpt_ckpt']} was trained for {tokens} image tokens "
                            f"(config.json block_size), but llamagen.image_size / downsample give {want.image_tokens}; "
                            "set the image size it was trained for (stage I: 256, stage II: 512)")
        codes = codebook_size(cfg)
        if hf.get("vocab_size") not in (None, codes):
            raise UserError(f"config: llamagen.gpt_ckpt {lg['gpt_ckpt']} predicts {hf['vocab_size']} codes, but "
                            f"llamagen.vq_ckpt {lg['vq_ckpt']} has a codebook of {codes}; give the VQ the GPT was "
                            "trained with")
        base = hf.get("rope_base", hf.get("rope_theta"))
        want.rope_base = float(base) if base is not None else want.rope_base
    if drafter_source(cfg) == "authors" and any(m["name"] != "vanilla" for m in cfg["sweep"]["methods"]):
        check_drafter_config(_authors_config(lg["authors_drafter"], "llamagen.authors_drafter"), want,
                             f"config: llamagen.authors_drafter {lg['authors_drafter']}: its config.json", "the target")


def _check_sweep(cfg: dict) -> None:
    sweep = cfg["sweep"]
    if not sweep["methods"]:
        raise UserError("config: sweep.methods is empty; list at least one method, e.g. - name: vanilla")
    if not sweep["modes"]:
        raise UserError("config: sweep.modes is empty; use [sampling], [greedy] or both")
    twice = sorted({m for m in sweep["modes"] if sweep["modes"].count(m) > 1})
    if twice:
        raise UserError(f"config: sweep.modes lists {twice[0]} twice; list each mode once")
    if sweep["shards"] > sweep["n_images"]:
        raise UserError(f"config: sweep.shards = {sweep['shards']} is more than sweep.n_images = {sweep['n_images']}; "
                        "every shard needs an image: lower shards")
    ranges = shard_ranges(sweep["n_images"], sweep["shards"], shard_alignment(sweep))
    if any(lo == hi for lo, hi in ranges):
        raise UserError(f"config: sweep.shards = {sweep['shards']} leaves a shard without images once shard "
                        f"boundaries fall on multiples of the batch size ({shard_alignment(sweep)}): lower shards or "
                        "sweep.batch_size")
    align = shard_alignment(sweep)
    # latency_images caps at a mode's images, as mode_images caps n_images (config.yaml's 32 under an overlay's
    # n_images: 4 decodes all 4 alone); only where batches follow the images decoded alone must they end on a batch
    # boundary, since the batches start there
    batched = [m for m in sweep["modes"] if sweep["latency_images"] < mode_images(sweep, m)]
    if batched and sweep["latency_images"] % align:
        raise UserError(f"config: sweep.latency_images = {sweep['latency_images']} must be a multiple of every mode's "
                        f"batch size ({align}) when {batched[0]} decodes more images ({mode_images(sweep, batched[0])}): "
                        "the images decoded alone are not decoded again in batches, which start where they end")
    # A mode that does not run keeps its entry unread: a layered config (smoke.yaml, --config sweep=...) that drops
    # greedy from modes cannot delete config.yaml's mode_images.greedy, as Snakemake merges dictionaries.
    for mode, m in sweep.get("mode_images", {}).items():
        if mode not in sweep["modes"] or m is None:
            continue
        if m < sweep["shards"]:
            raise UserError(f"config: sweep.mode_images.{mode} = {m} is fewer than sweep.shards ({sweep['shards']}): "
                            f"every shard needs an image; raise mode_images.{mode} or lower shards")
        m = mode_images(sweep, mode)
        wanted = [hi - lo for lo, hi in shard_ranges(m, sweep["shards"])]
        too_many = [(j, hi - lo, c) for j, ((lo, hi), c) in enumerate(zip(ranges, wanted)) if c > hi - lo]
        if too_many:
            j, size, c = too_many[0]
            raise UserError(f"config: sweep.mode_images.{mode} = {m} puts {c} images in shard {j}, which holds "
                            f"{size} of the sweep's n_images; lower mode_images.{mode} or raise n_images")


def proximity_codebooks(cfg: dict) -> dict[str, int]:
    """The codebook of every world `lantern proximity` runs on (its job names: toy-default, toy-clean, llamagen, or
    a Chameleon world's family: its VQGAN's)."""
    if cfg["world"] == "chameleon":
        return {cfg["chameleon"]["family"]: codebook_size(cfg)}
    if cfg["world"] == "llamagen":
        return {"llamagen": codebook_size(cfg)}
    from lantern.hparams import VQParams

    worlds = ("default", "clean") if cfg["toy"]["clean_world"] else ("default",)
    return {f"toy-{w}": int(vq_params(cfg, w).get("codebook_size", VQParams().codebook_size)) for w in worlds}


def _check_proximity(cfg: dict) -> None:
    """proximity.ranks, checked here rather than by the proximity job, after toy data, neighbours and tokenize ran:
    distinct, and each rank an existing neighbour in every world's codebook (the m-th nearest of codes - 1 others).
    Every world's table is built with max(neighbours.max_k, the largest rank) columns, so max_k is checked too."""
    prox = cfg["proximity"]
    if not prox["enabled"]:
        return
    ranks = prox["ranks"]
    twice = [m for i, m in enumerate(ranks) if m in ranks[:i]]
    if twice:
        raise UserError(f"config: proximity.ranks = {json.dumps(ranks)} lists {twice[0]} twice; list each rank once")
    top = max([m for m in ranks if m != "random"], default=0)
    for world, codes in proximity_codebooks(cfg).items():
        if top > codes - 1:
            raise UserError(f"config: proximity.ranks holds {top}, but the {world} world's codebook has {codes} codes "
                            f"({codes - 1} neighbours per code); keep proximity.ranks at or below {codes - 1}")
        if cfg["neighbours"]["max_k"] > codes - 1:
            raise UserError(f"config: neighbours.max_k = {cfg['neighbours']['max_k']} exceeds the {codes - 1} other "
                            f"codes of the {world} world's codebook, whose proximity table has max_k columns; lower "
                            "neighbours.max_k or set proximity.enabled: false")


def _check_metric_sizes(cfg: dict) -> None:
    """Every point of every mode gets the 2 images FID and KID need (else `lantern evaluate` fails after the whole
    sweep was drawn). Precision / recall (k = 3 nearest neighbours in each set) need 4; `lantern evaluate` marks
    them skipped, with the reason, below that."""
    sweep = cfg["sweep"]
    for mode in sweep["modes"]:
        m = sweep.get("mode_images", {}).get(mode)
        key, n = (f"sweep.mode_images.{mode}", m) if m is not None else ("sweep.n_images", sweep["n_images"])
        if n < 2:
            raise UserError(f"config: {key} = {n} gives each {mode} point {n} image; FID and KID need at least 2 "
                            f"(precision / recall 4): raise {key}")


def _check_table_width(cfg: dict, points: dict[str, dict]) -> None:
    """Every point's rule finds the neighbour columns it reads: the reference residual zeroes the k + 1 nearest
    codes, one more than k (else generation stops after the neighbours were built)."""
    from lantern.engine.methods import rule

    max_k = cfg["neighbours"]["max_k"]
    for name, spec in points.items():
        # only the reference residual reads beyond k (expanding the grid checked k <= max_k): other points need not
        # build their rule, which would import torch
        if spec.get("residual") != "reference" or spec["k"] + 1 <= max_k:
            continue
        width = rule(spec).table_width
        if width > max_k:
            raise UserError(f"config: sweep point {name} reads the {width} nearest codes (the reference residual "
                            f"zeroes k + 1 = {width}), but neighbours.max_k = {max_k}; set neighbours.max_k: {width}")


def _check_methods(cfg: dict) -> None:
    """Every method entry through the registry (engine/methods.py), which also refuses two entries naming one point."""
    _check_sweep(cfg)
    max_k = cfg["neighbours"]["max_k"]
    if max_k > codebook_size(cfg) - 1:
        raise UserError(
            f"config: neighbours.max_k = {max_k} exceeds the codebook's {codebook_size(cfg) - 1} other codes; lower it"
        )
    _check_table_width(cfg, expand_methods(cfg))


def _require_file(key: str, value: str) -> None:
    if not value:
        raise UserError(f"config: {key} is empty; set it to the file on disk")
    if Path(value).is_dir():
        raise UserError(f"config: {key} = {value} is a folder, not a file; give the file itself (e.g. {value}/<name>)")
    if not Path(value).is_file():
        raise UserError(f"config: {key} = {value} does not exist; place the file there or fix the path")


def _require_folder(key: str, value: str, what: str) -> None:
    if not Path(value).is_dir():
        raise UserError(f"config: {key} = {value} is not a folder; point it at {what}")


def _check_llamagen(cfg: dict) -> None:
    """The llamagen world: its files exist (in the order a run needs them) and its keys agree with each other."""
    lg = cfg["llamagen"]
    t2i = lg["model_type"] == "t2i"
    if lg["image_size"] % lg["downsample"]:
        raise UserError(f"config: llamagen.image_size = {lg['image_size']} is not a multiple of llamagen.downsample")
    if not t2i and lg["cls_token_num"] != 1:
        raise UserError(f"config: llamagen.cls_token_num = {lg['cls_token_num']}, but a c2i model has one condition "
                        "token; remove the key or set it to 1")
    _require_target(cfg)
    _require_file("llamagen.vq_ckpt", lg["vq_ckpt"])
    if t2i:
        if lg["t5"]["max_length"] != lg["cls_token_num"]:
            raise UserError(f"config: llamagen.t5.max_length = {lg['t5']['max_length']} must equal "
                            f"llamagen.cls_token_num = {lg['cls_token_num']} (upstream: both 120)")
        prompts, t5 = lg["prompts"], lg["t5"]
        if prompts["file"]:
            _require_file("llamagen.prompts.file", prompts["file"])
        elif prompts["coco_captions"]:
            _require_file("llamagen.prompts.coco_captions", prompts["coco_captions"])
        else:
            raise UserError("config: a t2i run needs prompts: set llamagen.prompts.file (CSV/JSONL of id, caption) "
                            "or llamagen.prompts.coco_captions (captions_val2017.json)")
        if t5["path"]:
            _require_folder("llamagen.t5.path", t5["path"], "a local flan-t5-xl folder (config, weights, tokenizer)")
        elif t5["features"]:
            _require_folder("llamagen.t5.features", t5["features"], "a folder of precomputed <id>.npy caption features")
        else:
            raise UserError("config: a t2i run needs caption features: set llamagen.t5.path (a local flan-t5-xl "
                            "folder) or llamagen.t5.features (precomputed <id>.npy files)")
    if not any(m["name"] != "vanilla" for m in cfg["sweep"]["methods"]):
        return
    source = drafter_source(cfg)
    if source == "file":
        _require_file("llamagen.drafter_ckpt", lg["drafter_ckpt"])
    elif source == "authors":
        if not Path(lg["authors_drafter"]).exists():
            raise UserError(f"config: llamagen.authors_drafter = {lg['authors_drafter']} does not exist; place the "
                            "authors' drafter folder (or file) there or fix the path")
    elif not lg["drafter"]["images"]:
        raise UserError("config: speculative methods need a drafter: set llamagen.drafter_ckpt, "
                        "llamagen.authors_drafter, or llamagen.drafter.images (a folder to train one on)")
    else:
        if lg["drafter"]["shards"] > lg["drafter"]["n_images"]:
            raise UserError(f"config: llamagen.drafter.shards = {lg['drafter']['shards']} is more than "
                            f"llamagen.drafter.n_images = {lg['drafter']['n_images']}; lower shards")
        _require_folder("llamagen.drafter.images", lg["drafter"]["images"],
                        "class folders (c2i) or images with captions.csv (t2i) to train a drafter on")
        want = "captions" if t2i else "classes"
        if lg["drafter"]["layout"] != want:
            raise UserError(f"config: llamagen.drafter.layout = {lg['drafter']['layout']} cannot condition a "
                            f"{lg['model_type']} target; use layout: {want}")


def _check_llamagen_checkpoints(cfg: dict) -> None:
    """What the jobs would refuse in the llamagen world's files, found before any job: the GPT must be a LlamaGen GPT
    that agrees with the llamagen keys and the VQ's codebook, and a drafter file must be a drafter for it. Only the
    files' headers are read (the tensors stay on disk, memory-mapped); the VQ's codebook was read with the methods."""
    from lantern.engine.models.drafter import check_drafter_target, read_drafter
    from lantern.worlds.llamagen.upstream import read_gpt

    lg = cfg["llamagen"]
    _check_authors_files(cfg)
    if target_source(cfg) == "authors":
        return  # the convert_target rule checks its tensors (config.json's kind, grid and vocabulary were checked)
    path = lg["gpt_ckpt"]
    try:
        args, _ = read_gpt(path, target_spec(cfg), mmap=True)
    except UserError as e:
        raise UserError(f"config: llamagen.gpt_ckpt: {e}") from None
    codes = codebook_size(cfg)
    if args.vocab_size != codes:
        raise UserError(f"config: llamagen.gpt_ckpt {path} predicts {args.vocab_size} codes, but llamagen.vq_ckpt "
                        f"{lg['vq_ckpt']} has a codebook of {codes}; give the VQ the GPT was trained with")
    if drafter_source(cfg) == "file" and any(m["name"] != "vanilla" for m in cfg["sweep"]["methods"]):
        try:
            check_drafter_target(read_drafter(lg["drafter_ckpt"], mmap=True), args.to_dict(), lg["drafter_ckpt"])
        except UserError as e:
            raise UserError(f"config: llamagen.drafter_ckpt: {e}") from None


def _check_paths(cfg: dict) -> None:
    if cfg["metrics"]["bootstrap"] == 1:
        raise UserError("config: metrics.bootstrap = 1 gives no spread; use 0 (no standard errors) or >= 2 resamples")
    if cfg["metrics"]["fid_extractor"] == "clip" and cfg["metrics"]["clip_model"] != "toy":
        raise UserError("config: metrics.fid_extractor = clip uses the toy CLIP's image tower; with a published CLIP "
                        "set metrics.fid_extractor: inception-v3-compat and metrics.inception_weights")
    if cfg["world"] == "llamagen":
        _check_llamagen(cfg)
    m = cfg["metrics"]
    if cfg["world"] == "llamagen":
        if not m["reference"]:
            raise UserError("config: metrics.reference is empty; a llamagen run needs real images for FID: a folder "
                            "(e.g. COCO val2017) or an .npz of FID statistics")
        if not Path(m["reference"]).exists():
            raise UserError(f"config: metrics.reference = {m['reference']} does not exist; fix the path")
        if Path(m["reference"]).is_dir() and not m["resolution"]:
            raise UserError("config: metrics.resolution = 0 keeps every image's own size, but a real reference folder "
                            "mixes sizes; set metrics.resolution (the paper: 256)")
        if cfg["llamagen"]["model_type"] == "c2i" and m["class_names"] == "toy":
            raise UserError("config: metrics.class_names = toy names the toy world's classes; a llamagen c2i run "
                            "needs imagenet (or a file of one class name per line)")
        if m["reference"].endswith(".npz") and m["fid_extractor"] != "inception-v3-compat":
            raise UserError("config: metrics.reference is an .npz of Inception statistics; set metrics.fid_extractor: "
                            "inception-v3-compat (with metrics.inception_weights)")
    if m["fid_extractor"] == "inception-v3-compat":
        _require_file("metrics.inception_weights", m["inception_weights"])
    if m["vgg16_weights"]:
        _require_file("metrics.vgg16_weights", m["vgg16_weights"])
    if m["clip_model"] != "toy":
        _require_file("metrics.clip_ckpt", m["clip_ckpt"])
    if m["class_names"] not in ("toy", "imagenet"):
        _require_file("metrics.class_names", m["class_names"])
    _check_hpsv2(cfg)


def _check_hpsv2(cfg: dict) -> None:
    """HPS v2.1 scores each image against its text prompt: a class-conditional world has none; and its weights file
    must be in place."""
    if not cfg["metrics"]["hpsv2"]["enabled"]:
        return
    if cfg["world"] == "toy" or (cfg["world"] == "llamagen" and cfg["llamagen"]["model_type"] == "c2i"):
        raise UserError(f"config: metrics.hpsv2.enabled: HPS v2.1 scores each image against its text prompt, but the "
                        f"{cfg['world']} world here is class-conditional; set metrics.hpsv2.enabled: false")
    try:
        check_hpsv2(HPSv2Params(**cfg["metrics"]["hpsv2"]), "metrics.hpsv2")
    except UserError as e:
        raise UserError(f"config: {e}") from None


def validate_config(config: dict, schema: dict | None = None) -> dict:
    """Return a validated copy of `config` with every default filled in."""
    cfg = copy.deepcopy(dict(config))
    schema = schema or load_schema()
    _fill_defaults(cfg, schema)
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(cfg), key=lambda e: list(e.absolute_path))
    if errors:
        raise _schema_error(jsonschema.exceptions.best_match(errors))
    _check_integers(cfg, schema)
    check_device_name(cfg["device"], "config: device")
    check_outdir(cfg)
    _fill_llamagen(cfg)
    if cfg["world"] == "chameleon":  # the recipe's methods, every missing file named, then what the engine runs
        _check_methods(cfg)
        check_chameleon_inputs(cfg)
        check_chameleon_methods(cfg, expand_methods(cfg))
    _check_paths(cfg)
    _check_methods(cfg)
    _check_metric_sizes(cfg)
    _check_toy_params(cfg)
    _check_proximity(cfg)
    if cfg["world"] == "llamagen":
        check_vq_downsample(cfg)
        _check_llamagen_checkpoints(cfg)
        check_llamagen_inputs(cfg, drafter_source(cfg), target_spec(cfg), target_source(cfg) == "authors")
    return cfg


def _check_toy_params(cfg: dict) -> None:
    """Build every toy hyperparameter group into the dataclass its command builds, so that a misspelt key or a bad
    value fails here, before any job, and not when the training or report job starts."""
    if cfg["world"] != "toy":
        return
    from lantern.hparams import (AmbiguityParams, ClassifierParams, DataParams, DrafterParams, GPTParams,
                                 TrainClipParams, VQParams)
    from lantern.params import check_feature_layers, params_from

    worlds = ("default", "clean") if cfg["toy"]["clean_world"] else ("default",)
    groups = [(f"toy.{key}" if world == "default" else f"toy.{key} (with toy.clean_{key}, clean world)", cls, get(cfg, world))
              for world in worlds
              for key, cls, get in (("data", DataParams, data_params), ("vq", VQParams, vq_params),
                                    ("target", GPTParams, target_params))]
    groups += [(f"toy.{key}", cls, cfg["toy"][key])
               for key, cls in (("drafter", DrafterParams), ("clip", TrainClipParams),
                                ("classifier", ClassifierParams), ("ambiguity", AmbiguityParams))]
    built = {}
    for where, cls, mapping in groups:
        try:
            built[where] = params_from(mapping, cls, f"{where.split(' ')[0]}.")
        except UserError as e:
            raise UserError(f"config: {where}: {e}") from None
    try:
        check_feature_layers(built["toy.drafter"].feature_layers, built["toy.target"].n_layer)
    except UserError as e:
        raise UserError(f"config: toy.drafter (toy.target.n_layer {built['toy.target'].n_layer}): {e}") from None


def expand_methods(cfg: dict) -> dict[str, dict]:
    """Sweep points as data: name -> method spec, list values of a method expanded into a grid."""
    from lantern.engine.methods import expand, mode_points

    try:
        points = expand(cfg["sweep"]["methods"], cfg["seed"], cfg["sweep"]["control_seed"],
                        {"max_k": cfg["neighbours"]["max_k"]})
    except UserError as e:
        raise UserError(f"config: {e}") from None
    for mode in cfg["sweep"]["modes"]:
        running = mode_points(points, mode)
        if "vanilla" in points and running and "vanilla" not in running:
            raise UserError(f"config: sweep.methods runs points in {mode} mode but vanilla's modes leave {mode} out; "
                            "every speed-up is relative to vanilla in its own mode, so drop vanilla's modes")
    return points


# The noise-free control world: the same shapes, no gradient, texture or pixel noise.
CLEAN_WORLD = {"background_gradient": False, "texture_amplitude": 0.0, "noise_sigma": 0.0}


def data_params(cfg: dict, world: str = "default") -> dict:
    """`lantern make-data --params` of a toy world (split sizes are separate arguments)."""
    base = {k: v for k, v in cfg["toy"]["data"].items() if k not in ("n_train", "n_val")}
    return {**base, **CLEAN_WORLD} if world == "clean" else base


def _world_params(cfg: dict, key: str, world: str) -> dict:
    """toy.<key> of a toy world, with toy.clean_<key> over it for the clean world."""
    base = dict(cfg["toy"][key])
    return {**base, **cfg["toy"].get(f"clean_{key}", {})} if world == "clean" else base


def vq_params(cfg: dict, world: str = "default") -> dict:
    """`lantern train-vq --params` of a toy world: toy.vq, with toy.clean_vq over it for the clean world."""
    return _world_params(cfg, "vq", world)


def target_params(cfg: dict, world: str = "default") -> dict:
    """`lantern train-gpt --params` of a toy world: toy.target, with toy.clean_target over it for the clean world
    (less extra_images, which sizes the target's data, not its model), and the data's class count: a target with
    more classes than its data would sample, and be asked for, classes it never saw."""
    from lantern.hparams import DataParams

    params = {k: v for k, v in _world_params(cfg, "target", world).items() if k != "extra_images"}
    classes = data_params(cfg, world).get("num_classes", DataParams.num_classes)
    if params.setdefault("num_classes", classes) != classes:
        raise UserError(f"config: toy.target.num_classes is {params['num_classes']} but toy.data.num_classes is "
                        f"{classes}; leave toy.target.num_classes out (it follows the data)")
    return params


def target_extra_images(cfg: dict, world: str = "default") -> int:
    """Images only the target trains on (split `extra`, after the validation split): the target overfits the
    training split's noise long before it learns its classes, and the VQ, CLIP and classifier need no more."""
    return int(_world_params(cfg, "target", world).get("extra_images", 0))


def shard_alignment(sweep: dict) -> int:
    """Shard boundaries fall on a multiple of every mode's batch size, so that a batch never straddles two shards
    (batches are aligned to the image index) and caption shards serve every mode."""
    return math.lcm(*sweep["batch_size"].values())


def shard_ranges(n: int, shards: int, align: int = 1) -> list[tuple[int, int]]:
    """Contiguous slices [lo, hi) of n images: shard j ends near (j + 1) n / shards, rounded down to `align`."""
    cuts = [0] + [(j * n // shards) // align * align for j in range(1, shards)] + [n]
    return list(zip(cuts, cuts[1:]))


def mode_images(sweep: dict, mode: str) -> int:
    """Images per point in `mode`: sweep.mode_images[mode] caps sweep.n_images, never demands more (config.yaml's
    {greedy: 32} under an overlay's n_images: 8 gives 8); null or absent: every image."""
    m = sweep.get("mode_images", {}).get(mode)
    return sweep["n_images"] if m is None else min(m, sweep["n_images"])


def mode_shard_ranges(sweep: dict, mode: str) -> list[tuple[int, int]]:
    """The image ranges of a mode's shards: the sweep's shard ranges (n_images; also with mode_images[mode] = null,
    how a config layered on one that limits the mode lifts the limit), or with sweep.mode_images[mode] = m
    fewer images, the first of each shard's range (m spread over the shards as shard_ranges spreads n_images), so
    that an image keeps its index, seed and caption shard whichever modes run."""
    base = shard_ranges(sweep["n_images"], sweep["shards"], shard_alignment(sweep))
    m = mode_images(sweep, mode)
    if m == sweep["n_images"]:
        return base
    counts = [hi - lo for lo, hi in shard_ranges(m, sweep["shards"])]
    return [(lo, lo + c) for (lo, _), c in zip(base, counts)]


def latency_counts(sweep: dict, mode: str) -> list[int]:
    """Per shard of `mode`, how many images its job decodes alone (`lantern sample --latency-images`, the first of
    its range): the mode's first sweep.latency_images images in index order, wherever the shards cut, so that
    sharding never changes which images are decoded alone."""
    left, counts = sweep["latency_images"], []
    for lo, hi in mode_shard_ranges(sweep, mode):
        counts.append(min(left, hi - lo))
        left -= counts[-1]
    return counts


def evaluate_params(cfg: dict, clip_weights: str, classifier_weights: str = "") -> dict:
    """`lantern evaluate --params` of a config: the extractor for FID / KID / precision-recall, the evaluation
    resize, and the CLIP model, `clip_weights` being the CLIP checkpoint (the toy CLIP's, or metrics.clip_ckpt);
    with `classifier_weights` (the toy world's classifier) also class accuracy; with metrics.hpsv2 enabled, HPS v2.1."""
    m = cfg["metrics"]
    toy_clip = m["clip_model"] == "toy"
    if m["fid_extractor"] == "clip":
        fidelity = {"extractor": "toyclip" if toy_clip else "clip", "weights_path": clip_weights}
    else:
        fidelity = {"extractor": "inception-v3-compat", "weights_path": m["inception_weights"]}
    fidelity.update(cache_dir=f"{cfg['outdir']}/metrics/reference_cache", resolution=m["resolution"],
                    resize_filter=m["resize_filter"], vgg16_weights=m["vgg16_weights"], bootstrap=m["bootstrap"],
                    bootstrap_chunk=m["bootstrap_chunk"])
    clip = {"model": "" if toy_clip else m["clip_model"], "weights_path": clip_weights,
            "prompt_prefix": m["prompt_prefix"], "class_names": m["class_names"]}
    classifier = {"classifier": {"weights_path": classifier_weights}} if classifier_weights else {}
    hpsv2 = {"hpsv2": dict(m["hpsv2"])} if m["hpsv2"]["enabled"] else {}
    return {"fidelity": fidelity, "clip": clip, **classifier, **hpsv2}


def merge_config(base: dict, over: dict) -> dict:
    """Merge `over` into `base` as Snakemake merges --configfile files: nested mappings key by key, others replaced."""
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merge_config(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


def main(argv: list[str]) -> None:
    """`lantern check-config FILE [FILE ...] [--config KEY=VALUE ...]`: validate config files (later files override
    earlier ones) and command-line overrides, merged as Snakemake merges --configfile and --config."""
    files, overrides = (argv[: argv.index("--config")], argv[argv.index("--config") + 1 :]) if "--config" in argv \
        else (argv, [])
    if not files:
        raise UserError("usage: lantern check-config config/config.yaml [override.yaml ...] [--config key=value ...]")
    if "--config" in argv and not overrides:
        raise UserError("--config needs at least one key=value (as snakemake's --config does); drop the flag or "
                        "add an override")
    merged: dict = {}
    for path in files:
        if Path(path).is_dir():
            raise UserError(f"config file {path} is not a file but a folder; give the YAML file")
        if not Path(path).is_file():
            raise UserError(f"config file {path} does not exist")
        try:
            loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            raise UserError(f"config file {path} is not UTF-8 text; save it as UTF-8") from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark else ""
            raise UserError(f"config file {path}{where} is not valid YAML: {getattr(e, 'problem', e)}") from None
        if loaded is None:  # Snakemake's --configfile refuses such a file (a WorkflowError): stop here the same way
            raise UserError(f"config file {path} holds no keys (empty, or every line commented out), which Snakemake "
                            "refuses; add a key (or {}) or leave the file out")
        if not isinstance(loaded, dict):
            raise UserError(f"config file {path} holds a {type(loaded).__name__}; a config is a mapping of keys")
        merge_config(merged, loaded)
    if overrides:
        from snakemake.cli import parse_config  # Snakemake's own parser: values typed exactly as a run sees them

        try:
            merge_config(merged, parse_config(overrides))
        except ValueError as e:
            raise UserError(f"--config {' '.join(overrides)}: {e}") from None
    cfg = validate_config(merged)
    from lantern.engine.methods import mode_points

    points = expand_methods(cfg)
    per_mode = ", ".join(f"{len(mode_points(points, m))} {m}" for m in cfg["sweep"]["modes"])
    print(f"config OK: sweep points per mode: {per_mode}", file=sys.stdout)
