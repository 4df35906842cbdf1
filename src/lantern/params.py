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
