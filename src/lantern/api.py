"""LANTERN from Python: load a world once, generate images with any registered method, read per-image stats.

    import lantern
    world = lantern.load_world("toy")
    out = lantern.generate(world, ["ring", "star"], "lantern", delta=0.1, k=3, seed=0)
    out.images[0].save("ring.png"); print(out.tau)

The public names are `lantern.__all__`. Everything here calls the engine and the method registry
(engine/methods.py): a method is validated by the same code, with the same one-line messages, as a config's
sweep entry, and image i of a call draws from the generator seeded from (seed, i), as `lantern sample` does, so
the same settings give the pipeline's images.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from lantern.errors import UserError

# models/toy/ of this checkout: the shipped toy world (src/lantern/api.py -> the repository root)
TOY_ROOT = Path(__file__).resolve().parents[2] / "models" / "toy"
# The default run's sampling (config/config.yaml `sampling:`); any key given to `generate` replaces its default.
DEFAULT_SAMPLING = {"cfg_scale": 2.0, "cfg_interval": -1, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
# The config's `neighbours:` defaults: the table the pipeline builds for every relaxed method.
NEIGHBOURS_METRIC, NEIGHBOURS_MAX_K = "l2", 200


class World:
    """The models of one world, loaded once on one device and dtype: `target` (the LlamaGen-family GPT), `vq` (its
    tokenizer), `drafter` (None when the world has none: only plain AR and Jacobi drafting run), the neighbour table
    of the relaxed methods (loaded, or built from the VQ codebook on first use, `max_k` columns), and for the toy
    world its `class_names`. A world of another family (lantern.api_chameleon) also gives its `layout` (forced
    structural tokens, engine/models/layout.py), `prompts` (conditions -> (cond, cond_mask, what each stats row
    says)), `pixels` (codes [1, N] -> uint8 [1, H, W, 3]) and its authors' `sampling` defaults."""

    def __init__(self, name: str, target: nn.Module, vq: nn.Module, drafter: nn.Module | None = None,
                 neighbours: Tensor | None = None, max_k: int | None = None, metric: str = NEIGHBOURS_METRIC,
                 class_names: Sequence[str] | None = None, t5: tuple | None = None, layout=None, prompts=None,
                 pixels=None, sampling: dict | None = None):
        from lantern.engine.rules.neighbours import NeighbourParams

        NeighbourParams(metric=metric)  # l2 or cosine, with the config's message
        self.name, self.target, self.vq, self.drafter = name, target, vq, drafter
        self.layout, self._prompts, self._pixels, self.sampling = layout, prompts, pixels, dict(sampling or {})
        self.device = target.output.weight.device
        self.class_names = tuple(class_names) if class_names else None
        self.metric, self._t5 = metric, t5
        self._table = None if neighbours is None else neighbours.to(self.device)
        codes = vq.quantize.embedding.weight.shape[0]
        if neighbours is not None:
            max_k = neighbours.shape[1]
        elif max_k is None:  # the config's default, or every other code of a smaller codebook
            max_k = min(NEIGHBOURS_MAX_K, codes - 1)
        elif isinstance(max_k, bool) or not isinstance(max_k, int) or not 1 <= max_k <= codes - 1:
            raise UserError(f"neighbours_k = {max_k} must be between 1 and {codes - 1} (the other codes of the "
                            f"{codes}-code VQ codebook); lower it")
        self.max_k = max_k

    @property
    def model_type(self) -> str:
        """c2i (class ids, or class names for the toy world) or t2i (captions; a Chameleon target's text prompts)."""
        return getattr(self.target.args, "model_type", "t2i")

    def neighbour_table(self, width: int) -> Tensor:
        """The first `width` columns of the neighbour table on the world's device ([codes, width], nearest first);
        built from the VQ codebook on first use, as `lantern neighbours` builds it (its first columns are the same
        whatever max_k)."""
        if width > self.max_k:
            raise UserError(f"the method reads {width} neighbours per code, but this world's table holds "
                            f"max_k = {self.max_k}; load it with neighbours_k >= {width}")
        if self._table is None:
            from lantern.engine.rules.neighbours import nearest_neighbours

            codebook = self.vq.quantize.embedding.weight.detach()
            self._table = nearest_neighbours(codebook, self.max_k, self.metric).to(self.device)
        return self._table[:, :width]

    def __repr__(self) -> str:
        a = self.target.args
        drafter = "a drafter" if self.drafter is not None else "no drafter"
        return (f"World({self.name!r}: {self.model_type} {type(self.target).__name__} {a.n_layer} layers x {a.dim}, "
                f"{a.image_tokens if self.layout is None else self.layout.codes} tokens, "
                f"{a.vocab_size} codes, {drafter}, on {self.device})")


@dataclasses.dataclass
class Images:
    """What `generate` returns: `pixels` [B, H, W, 3] uint8, `tokens` [B, N] (CPU int64), and `stats`, one dict per
    image (image_index, seed, label or caption, tau, target_forwards, drafter_forwards, accepted_total,
    time_total_s and its draft / verify / other parts, batch_size, ...: the columns of `lantern sample`'s stats.csv);
    `method` is the validated method spec and `point` its name in the pipeline's tables."""

    pixels: np.ndarray
    tokens: Tensor
    stats: list[dict]
    method: dict
    point: str

    @property
    def images(self) -> list:
        """The images as PIL images."""
        from PIL import Image

        return [Image.fromarray(p) for p in self.pixels]

    @property
    def tau(self) -> float:
        """Mean tokens per target forward over the images (1.0 for plain AR)."""
        return float(np.mean([s["tau"] for s in self.stats]))

    @property
    def seconds(self) -> float:
        """Decoding time of all the images (the sum of their time_total_s; a batch's wall time is split evenly)."""
        return float(sum(s["time_total_s"] for s in self.stats))

    def grid(self, columns: int = 8):
        """The images in one PIL image, `columns` per row, in order."""
        from PIL import Image

        n, h, w, _ = self.pixels.shape
        columns = max(1, min(columns, n))
        rows = -(-n // columns)
        canvas = np.full((rows * h, columns * w, 3), 255, dtype=np.uint8)
        for i, p in enumerate(self.pixels):
            r, c = divmod(i, columns)
            canvas[r * h : (r + 1) * h, c * w : (c + 1) * w] = p
        return Image.fromarray(canvas)


# -- loading ----------------------------------------------------------------------------------------------------
def _placement(device: str, dtype: str) -> torch.device:
    from lantern.engine.models.checkpoint import parse_device, parse_dtype
    from lantern.pipeline.determinism import configure

    parse_dtype(dtype)
    where = parse_device(device)
    configure(where)  # the pipeline's deterministic CUDA kernels, before any of them runs
    return where


def load_world(name: str = "toy", device: str = "auto", dtype: str = "fp32", neighbours_k: int | None = None):
    """The shipped toy world (models/toy/default: its target, VQ and drafter, the models `make run` uses), on
    `device` (auto: CUDA when available) in `dtype` (fp32, bf16, fp16). Its neighbour table is built from the VQ
    codebook on first use, with `neighbours_k` columns (default: the config's neighbours.max_k, 200). On CUDA it
    turns on the pipeline's deterministic kernels for the process (pipeline/determinism.py), as `load_llamagen`
    does. Returns a `World`."""
    from lantern.engine.models.drafter import load_drafter
    from lantern.hparams import CLASS_NAMES
    from lantern.worlds.llamagen.upstream import load_gpt, load_vq

    if name != "toy":
        raise UserError(f"world {name!r} is not shipped; use load_world('toy'), or load_llamagen(gpt_ckpt=..., "
                        "vq_ckpt=...) for LlamaGen files")
    root = TOY_ROOT / "default"
    if not (root / "target.pt").is_file():
        raise UserError(f"the toy world is not at {root}; it ships in the repository's models/toy/ (install lantern "
                        "from its source checkout)")
    where = _placement(device, dtype)
    target = load_gpt(root / "target.pt", dtype=dtype, device=str(where))
    vq = load_vq(root / "vq.pt", device=str(where))
    drafter = load_drafter(root / "drafter.pt", target)
    return World("toy", target, vq, drafter, max_k=neighbours_k,
                 class_names=CLASS_NAMES[: target.args.num_classes])


def _gpt(source, spec: dict, dtype: str, where: torch.device):
    """A GPT from an upstream file, our own file, the authors' HF target, or a model object in memory (upstream's
    `Transformer` or ours): each layout's reader (worlds/llamagen/) gives (args, state dict), the engine builds it."""
    from lantern.engine.models.checkpoint import build
    from lantern.engine.models.model import GPT
    from lantern.worlds.llamagen import hf, upstream

    if isinstance(source, nn.Module):
        what = f"gpt_ckpt (a {type(source).__name__} object)"
        args, sd = upstream.read_gpt_object(source, spec, what)
    elif isinstance(source, (str, os.PathLike)) and hf.is_authors_target(source):
        what = Path(source)
        if not ((what if what.is_dir() else what.parent) / "config.json").is_file():
            raise UserError(f"gpt_ckpt {what} is a folder without config.json; give an upstream GPT file, or the "
                            "authors' HF target folder (config.json + weights)")
        try:  # the reader names its input --src, as `lantern convert` calls it
            args, sd = hf.read_authors_target(what, spec)
        except UserError as e:
            raise UserError(f"gpt_ckpt (the authors' HF target): {e}") from None
    else:
        what = _file(source, "gpt_ckpt")
        args, sd = upstream.read_gpt(what, spec or None)
    return build(GPT, args, sd, what, dtype, where)


def _vq(source, where: torch.device):
    """A VQ from a file, or a VQModel object in memory (ours, or upstream's: its config read from its tensors)."""
    from lantern.engine.models.checkpoint import build
    from lantern.engine.models.vq import VQModel
    from lantern.worlds.llamagen import upstream

    if isinstance(source, VQModel):
        return source.to(where).eval()
    if isinstance(source, nn.Module):
        what = f"vq_ckpt (a {type(source).__name__} object)"
        args, sd = upstream.read_vq_object(source, what)
    else:
        what = _file(source, "vq_ckpt")
        args, sd = upstream.read_vq(what)
    return build(VQModel, args, sd, what, None, where)


def _file(path, key: str) -> str:
    from lantern.io import not_a_file

    if not isinstance(path, (str, os.PathLike)):
        raise UserError(f"{key} = {type(path).__name__} object; give a file path or a model object (an nn.Module)")
    if not Path(path).is_file():
        raise not_a_file(key, path)
    return str(path)


def load_llamagen(gpt_ckpt, vq_ckpt, drafter_ckpt: str | None = None, authors_drafter: str | None = None,
                  neighbours: str | None = None, neighbours_k: int | None = None, metric: str | None = None,
                  model_type: str | None = None, gpt_size=None, num_classes: int | None = None,
                  image_size: int | None = None, downsample: int = 16, cls_token_num: int | None = None,
                  t5: str | None = None, device: str = "auto", dtype: str = "fp32"):
    """A LlamaGen world from files or from models already in memory; the names are the config's llamagen keys.

    gpt_ckpt: an upstream GPT file (c2i_B_256.pt ...), a file of this project, the LANTERN authors' HF-format target
    folder (converted in memory), or the GPT object itself (upstream's `Transformer`, or a
    `lantern.engine.models.model.GPT`), mapped through the same checks as a file; vq_ckpt: the VQ file
    or object (upstream's `VQModel`). drafter_ckpt: a drafter of this project (`lantern train-drafter`, `lantern
    convert`); authors_drafter: the LANTERN authors' drafter folder (config.json + weights), converted in memory.
    neighbours: a table from `lantern neighbours` (else built from the codebook on first use, `neighbours_k`
    columns, default 200 or every other code of a smaller codebook; `metric` l2 (default) or cosine, checked against
    a loaded table's). model_type, gpt_size, num_classes, image_size / downsample, cls_token_num: the
    target spec, checked against the weights (an upstream file carries no config). t5: a local flan-t5 folder, for
    t2i prompts given as text. Returns a `World`.
    """
    from lantern.engine.models.drafter import load_drafter
    from lantern.engine.rules.neighbours import load_neighbours
    from lantern.io import load_torch

    if drafter_ckpt and authors_drafter:
        raise UserError("give drafter_ckpt or authors_drafter, not both")
    if image_size and (isinstance(downsample, bool) or not isinstance(downsample, int) or downsample < 1
                       or image_size % downsample):
        raise UserError(f"llamagen.image_size = {image_size} is not a multiple of llamagen.downsample = {downsample}")
    spec = {"model_type": model_type, "gpt_size": gpt_size, "num_classes": num_classes,
            "cls_token_num": cls_token_num,
            "image_tokens": (image_size // downsample) ** 2 if image_size else None}
    spec = {k: v for k, v in spec.items() if v is not None}
    where = _placement(device, dtype)
    target = _gpt(gpt_ckpt, spec, dtype, where)
    vq = _vq(vq_ckpt, where)
    codes = vq.quantize.embedding.weight.shape[0]
    if target.args.vocab_size != codes:  # a larger codebook's neighbours would point past the target's vocabulary
        raise UserError(f"vq_ckpt's codebook holds {codes} codes, but gpt_ckpt's vocabulary is "
                        f"{target.args.vocab_size}; give the VQ the GPT was trained with")
    drafter = None
    if drafter_ckpt:
        drafter = load_drafter(_file(drafter_ckpt, "drafter_ckpt"), target)
    elif authors_drafter:
        from lantern.engine.models.drafter import build_drafter
        from lantern.worlds.llamagen.hf import read_authors_drafter

        try:  # the reader names its input --src, as `lantern convert` calls it
            options, sd = read_authors_drafter(authors_drafter, target.args)
        except UserError as e:
            raise UserError(f"authors_drafter: {e}") from None
        drafter = build_drafter(target.args, options, sd, target, authors_drafter)
    # a left-padded caption position's target state, read by the drafter: the authors' rule for their drafter
    target.pad_semantics = "authors" if authors_drafter else "upstream"
    table = None
    if neighbours:
        path = _file(neighbours, "neighbours")
        stored = load_torch(path, "neighbour table", "lantern neighbours").get("meta") or {}
        table = load_neighbours(path, vq.quantize.embedding.weight.detach().float().cpu(), stored.get("k", 1), metric)
        metric = stored.get("metric", metric)
    t5_models = None
    if t5:
        from lantern.engine.models.checkpoint import parse_dtype
        from lantern.worlds.llamagen.captions import load_t5

        if target.args.model_type != "t2i":
            raise UserError("t5 is for text-to-image targets; this GPT is class-conditional (c2i): leave t5 out")
        t5_models = load_t5(t5, where, parse_dtype(dtype))
    return World("llamagen", target, vq, drafter, table, max_k=neighbours_k, metric=metric or NEIGHBOURS_METRIC,
                 t5=t5_models)


# -- generating -------------------------------------------------------------------------------------------------
def methods() -> str:
    """Every decoding method family and drafting kind with its parameters, as `lantern methods` prints them."""
    from lantern.engine.methods import describe

    return describe()


def method_spec(method: str | dict, max_k: int | None = None, **params: Any) -> dict:
    """A method as the config's sweep entries give it (`"lantern"` with delta=0.1, k=3, drafting="chain", ...; or
    the whole entry as a dict), validated by the registry with the config's own one-line messages, defaults filled.
    `max_k`: the neighbour table's width, which bounds k as neighbours.max_k does."""
    from lantern.engine.methods import normalize, rule

    if isinstance(method, dict):
        if params:
            raise UserError(f"give the method as a dict or as a name with parameters, not both (got {sorted(params)})")
        entry = dict(method)
    elif isinstance(method, str):
        entry = {"name": method, **params}
    else:
        raise UserError(f"method = {method!r} must be a method name such as 'lantern' or a dict spec; see "
                        "lantern.methods()")
    context = {} if max_k is None else {"max_k": max_k}
    spec = normalize(entry, "method", context)
    if max_k is not None and spec.get("residual") in ("reference", "lumina") and rule(spec).table_width > max_k:
        width = rule(spec).table_width
        raise UserError(f"method reads the {width} nearest codes (the authors' residual zeroes k + 1 = {width}), "
                        f"but neighbours.max_k = {max_k}; lower k or load the world with neighbours_k >= {width}")
    return spec


def _sampling(sampling: dict | None, mode: str):
    from lantern.engine.decoding.sampling import SamplingParams
    from lantern.params import params_from
    from lantern.pipeline.sample import GREEDY

    if mode not in ("sampling", "greedy"):
        raise UserError(f"mode = {mode!r} is not a decoding mode; use sampling or greedy")
    if sampling is not None and not isinstance(sampling, dict):
        raise UserError(f"sampling = {sampling!r} must be a dict such as {{'cfg_scale': 2.0, 'top_k': 0}}")
    return params_from({**DEFAULT_SAMPLING, **(sampling or {}), **(GREEDY if mode == "greedy" else {})},
                       SamplingParams, "sampling.")


def _integer(value) -> int | None:
    """`value` as an int when it is an integer: a Python int, a numpy integer, or a 0-d integer tensor or array
    (what users pass: list(np.arange(4)), torch.tensor(3)); None otherwise (bools are not integers here)."""
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (Tensor, np.ndarray)):
        if value.ndim != 0 or value.dtype in (torch.bool, np.bool_):
            return None
        value = value.item()
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    return int(value) if isinstance(value, numbers.Integral) else None


def _conditions(world: World, conditions) -> tuple[Tensor, Tensor | None, list[dict]]:
    """(cond, cond_mask, what each image's stats row says about its condition) for `conditions`."""
    a = world.target.args
    if world._prompts is not None:
        return world._prompts(conditions)
    if a.model_type == "t2i":
        return _captions(world, conditions)
    if isinstance(conditions, (str, numbers.Number, np.generic)) or (
            isinstance(conditions, (Tensor, np.ndarray)) and conditions.ndim == 0):
        conditions = [conditions]
    if isinstance(conditions, (Tensor, np.ndarray)):
        conditions = conditions.tolist()
    if not isinstance(conditions, Sequence) or not conditions:
        raise UserError(f"conditions = {conditions!r} must be a non-empty list of class ids (or class names of the "
                        "toy world), one per image")
    labels = []
    for c in conditions:
        if isinstance(c, str):
            if world.class_names is None:
                raise UserError(f"class {c!r}: this world's classes have no names; give class ids "
                                f"0..{a.num_classes - 1}")
            if c not in world.class_names:
                raise UserError(f"class {c!r} is not a class of the {world.name} world; use one of "
                                f"{', '.join(world.class_names)} (or ids 0..{a.num_classes - 1})")
            c = world.class_names.index(c)
        label = _integer(c)
        if label is None or not 0 <= label < a.num_classes:
            raise UserError(f"class {c!r} is not a class id of this target; use 0..{a.num_classes - 1}")
        labels.append(label)
    return torch.tensor(labels, device=world.device), None, [{"label": c} for c in labels]


def _captions(world: World, conditions) -> tuple[Tensor, Tensor, list[dict]]:
    """t2i conditions: (features [B, T, C], mask [B, T]) as `lantern encode-captions` writes them, or prompts (text)
    with a world loaded with t5."""
    a = world.target.args
    dtype = world.target.output.weight.dtype
    if isinstance(conditions, str):
        conditions = [conditions]
    if isinstance(conditions, Sequence) and conditions and all(isinstance(c, str) for c in conditions):
        if world._t5 is None:
            raise UserError("prompts as text need a T5 encoder: load the world with load_llamagen(..., t5=<local "
                            "flan-t5 folder>), or pass caption features (features [B, T, C], mask [B, T])")
        from lantern.worlds.llamagen.captions import encode_t5

        features, mask = encode_t5(*world._t5, list(conditions), a.cls_token_num, 8)
        described = [{"caption": c} for c in conditions]
    elif isinstance(conditions, tuple) and len(conditions) == 2 and all(isinstance(t, Tensor) for t in conditions):
        features, mask = conditions
        described = [{"caption_row": i} for i in range(len(features))]
    else:
        raise UserError("a text-to-image world takes prompts (a list of strings, with t5 loaded) or caption "
                        "features as a tuple (features [B, T, C], mask [B, T])")
    if features.ndim != 3 or tuple(features.shape[1:]) != (a.cls_token_num, a.caption_dim) \
            or tuple(mask.shape) != tuple(features.shape[:2]):
        raise UserError(f"caption features {tuple(features.shape)} with mask {tuple(mask.shape)}: the target reads "
                        f"[B, {a.cls_token_num}, {a.caption_dim}] with a [B, {a.cls_token_num}] mask")
    return features.to(world.device, dtype), mask.to(world.device).bool(), described


def _decoder(world: World, spec: dict, params, compile: bool):
    """(cond, generators, cond_mask) -> (tokens, [ImageStats]) for a validated spec, on the world's models."""
    from lantern.engine.methods import drafting, needs_drafter, rule, speculative

    if not speculative(spec):
        from lantern.engine.decoding.generate import generate as ar

        return lambda cond, gens, mask: ar(world.target, cond, params, gens, mask, compile=compile,
                                           layout=world.layout)
    from lantern.engine.decoding.speculative import decode

    if needs_drafter(spec) and world.drafter is None:
        raise UserError(f"method {spec['name']} with {spec['drafting']} drafting needs a drafter; load the world with "
                        "drafter_ckpt or authors_drafter (or use drafting='jacobi', which needs none)")
    accept, draft = rule(spec), drafting(spec)
    table = world.neighbour_table(accept.table_width) if accept.table_width else None
    drafter = world.drafter if needs_drafter(spec) else None
    return lambda cond, gens, mask: decode(world.target, drafter, cond, params, accept, draft, gens, table, mask,
                                           compile=compile, layout=world.layout)


def generate(world: World, conditions, method: str | dict = "vanilla", *, seed: int = 0, first_index: int = 0,
             mode: str = "sampling", sampling: dict | None = None, batch_size: int = 1, compile: bool | str = "auto",
             warmup: bool = False, progress: bool = False, **params: Any) -> Images:
    """Generate one image per condition with `method` and return them with their tokens and stats (`Images`).

    conditions: class ids (or the toy world's class names: world.class_names); for a t2i world, prompts (a world
    loaded with t5) or caption features (features [B, T, C], mask [B, T]). method: a registered family name
    (`lantern.methods()`) with its parameters as keywords (delta=0.1, k=3, drafting="chain", gamma=4, ...), or a
    whole spec dict as in the config. Image i (first_index + position) draws from the generator seeded from
    (seed, i), in batches of `batch_size` aligned to the image index, exactly as `lantern sample --seed --start
    --batch-size`, so two methods given one seed share each image's random stream (batch 1, the default, times
    each image alone: the paper's latency; larger batches give throughput). mode: sampling, or greedy
    (argmax over the CFG-mixed logits, as the pipeline's greedy mode). sampling: cfg_scale, cfg_interval,
    temperature, top_k, top_p (defaults: the default run's, CFG 2; a Chameleon world's: its authors', CFG 3, top-k
    2000). compile: torch.compile the verify / decode step (auto: on CUDA, except for a world whose layout forces
    tokens, whose rounds run eager). warmup: first decode one image untimed (compiled: the first batch), so one-time costs
    stay out of the times.
    progress: print images done, images/s, ETA and tau so far to stderr.
    """
    from lantern.engine.decoding.compiled import resolve
    from lantern.engine.decoding.kinds import layout_supported
    from lantern.engine.methods import drafting, point_name, speculative
    from lantern.engine.decoding.sampling import image_generator, image_seed
    from lantern.pipeline.progress import Progress
    from lantern.pipeline.sample import aligned_batches, to_uint8

    if not isinstance(world, World):
        raise UserError(f"world = {type(world).__name__} object; load one with lantern.load_world('toy') or "
                        "lantern.load_llamagen(...)")
    checked = {}
    for name, value, low in (("batch_size", batch_size, 1), ("seed", seed, 0), ("first_index", first_index, 0)):
        checked[name] = _integer(value)
        if checked[name] is None or checked[name] < low:
            raise UserError(f"{name} = {value!r} must be an integer >= {low}")
    batch_size, seed, first_index = checked["batch_size"], checked["seed"], checked["first_index"]
    spec = method_spec(method, world.max_k, **params)
    if sampling is not None and not isinstance(sampling, dict):
        raise UserError(f"sampling = {sampling!r} must be a dict such as {{'cfg_scale': 2.0, 'top_k': 0}}")
    sampling_params = _sampling({**world.sampling, **(sampling or {})}, mode)
    cond, mask, described = _conditions(world, conditions)
    if world.layout is not None and compile in ("auto", None) and speculative(spec) and \
            not layout_supported(drafting(spec), True):
        compile = False  # the engine's compiled rounds do not take forced tokens for this kind (plain AR compiles)
    compiled = resolve({"true": True, "false": False}.get(compile, compile), world.device)
    run = _decoder(world, spec, sampling_params, compiled)
    n = len(cond)
    batches = aligned_batches(first_index, first_index + n, batch_size)
    at = lambda batch: [i - first_index for i in batch]  # noqa: E731 - image index -> row of cond
    if warmup:  # as `lantern sample`: eager costs are per process (one image pays them), compiled graphs per shape
        rows = at(batches[0] if compiled else batches[0][:1])
        run(cond[rows], [image_generator(seed, first_index + r) for r in rows], None if mask is None else mask[rows])
    pixels, tokens, stats = [], [], []
    shown = Progress(n, point_name(spec), quiet=not progress)
    for batch in batches:
        rows = at(batch)
        out, batch_stats = run(cond[rows], [image_generator(seed, i) for i in batch],
                               None if mask is None else mask[rows])
        for b, i in enumerate(batch):
            with torch.no_grad():  # one image at a time, as `lantern sample`: its pixels never depend on the batch
                codes = out[b : b + 1].to(world.device)
                pixels.append((to_uint8(world.vq.decode_code(codes)) if world._pixels is None
                               else world._pixels(codes))[0])
            stats.append({"image_index": i, "seed": image_seed(seed, i), **described[i - first_index],
                          "method": spec["name"], "mode": mode, **batch_stats[b].row()})
        tokens.append(out.cpu())
        shown.update(len(batch), [s.tau for s in batch_stats])
    shown.close()
    return Images(np.stack(pixels), torch.cat(tokens), stats, spec, point_name(spec))

