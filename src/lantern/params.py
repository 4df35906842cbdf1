"""--params mappings -> (nested) hyperparameter dataclasses, with one-line errors naming the bad key."""

from __future__ import annotations

import dataclasses
import typing

from lantern.errors import UserError


def params_from(mapping: dict, cls, where: str = ""):
    """Build dataclass `cls` from `mapping`; nested dataclass fields take nested mappings ("fidelity.extractor")."""
    if not isinstance(mapping, dict):
        raise UserError(f"{where.rstrip('.') or 'params'} must be a mapping, got {type(mapping).__name__}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(mapping) - set(names))
    if unknown:
        raise UserError(f"unknown key {where}{unknown[0]}; valid keys{' of ' + where.rstrip('.') if where else ''}: "
                        f"{', '.join(names)}")
    kwargs = {}
    for key, value in mapping.items():
        kind = hints[key]
        if dataclasses.is_dataclass(kind):
            kwargs[key] = params_from(value, kind, f"{where}{key}.")
            continue
        ok = {bool: lambda v: isinstance(v, bool),
              int: lambda v: isinstance(v, int) and not isinstance(v, bool),
              float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
              str: lambda v: isinstance(v, str)}.get(kind, lambda v: True)
        if not ok(value):
            raise UserError(f"{where}{key} = {value!r} must be of type {kind.__name__}")
        kwargs[key] = float(value) if kind is float else value
    return cls(**kwargs)


def check_threads(threads: int, what: str) -> None:
    """A training job's torch thread count: >= 0, where 0 keeps torch's default."""
    if threads < 0:
        raise UserError(f"{what} threads={threads} must be >= 0 (0: torch's default)")


# The thread protocol of the trainers whose params carry `threads` (classifier, CLIP, drafter): --threads overrides
# the params' count, and the count torch then runs is what the params record, since a CPU run's rounding depends on it.
def add_threads_arg(ap) -> None:
    ap.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads (0: torch's default); overrides the params' threads")


def with_threads(p, threads: int | None):
    """`p` with --threads in place of its own count (its dataclass checks the value again)."""
    return p if threads is None else dataclasses.replace(p, threads=threads)


def use_threads(p):
    """Set torch's thread count from `p` (0 keeps torch's default); `p` recording the count torch runs."""
    import torch  # here, not at the top: the config check imports this module and stays torch-free

    if p.threads > 0:
        torch.set_num_threads(p.threads)
    return dataclasses.replace(p, threads=torch.get_num_threads())


def check_layer_indices(layers) -> tuple[int, ...]:
    """A drafter's feature_layers (DrafterParams, DrafterOptions) as a tuple: increasing layer indices >= 0."""
    if (not isinstance(layers, (list, tuple)) or any(isinstance(i, bool) or not isinstance(i, int) for i in layers)
            or any(i < 0 for i in layers) or list(layers) != sorted(set(layers))):
        raise UserError(f"drafter feature_layers={layers!r} must be increasing target layer indices >= 0 "
                        "(e.g. [7, 15, 23]), or [] for none")
    return tuple(layers)


def check_feature_layers(layers, n_layer: int) -> None:
    """feature_layers must name layers of an n_layer target below its last, whose output h_t is read anyway."""
    if layers and max(layers) >= n_layer - 1:
        example = sorted({max(q * n_layer // 4 - 1, 0) for q in (1, 2, 3)} - {n_layer - 1, n_layer})
        hint = f"e.g. {example}" if example else "or [] (it has no layer below its last)"
        raise UserError(f"drafter feature_layers {list(layers)} must lie below the target's last layer ({n_layer - 1}: "
                        f"its output is h_t, read anyway); pick layers of its {n_layer}, {hint}")


# The one place device strings are checked (the config's `device` and every subcommand's --device, through
# engine.models.checkpoint.parse_device): torch accepts mps, xpu, meta and more, which the decoders were never run on, and
# those ended in a PyTorch traceback halfway through a job. No torch here: the config check runs at every start.
DEVICES = "auto, cpu, cuda or cuda:<index>"


def check_device_name(name, where: str = "device") -> str:
    """`name` when it is auto, cpu, cuda or cuda:N; otherwise one UserError line naming `where`."""
    import re

    if isinstance(name, str) and re.fullmatch(r"auto|cpu|cuda(:[0-9]+)?", name):
        return name
    said = f"{where} {name!r}" if where.startswith("--") else f"{where} = {name!r}"  # a flag, or a config key
    kind = str(name).split(":")[0].strip().lower()
    if kind in ("mps", "xpu", "hip", "xla", "meta", "hpu", "mtia", "ipu", "vulkan", "maia", "privateuseone", "lazy"):
        raise UserError(f"{said}: {kind} devices are not supported; use {DEVICES}")
    raise UserError(f"{said} is not a supported device; use {DEVICES}")
