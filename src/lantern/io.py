"""Atomic file output: nothing half-written is ever left where a finished file is expected."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

import yaml

from lantern.errors import UserError


_UMASK = os.umask(0o022)
os.umask(_UMASK)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it onto `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes files private; results are ordinary files
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def save_torch(obj: Any, path: str | os.PathLike) -> None:
    """torch.save, atomically and byte-reproducibly: torch names the archive's root folder after the file it
    writes, so saving straight to a temporary name would make two saves of the same object differ."""
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    with atomic_path(path) as tmp:
        tmp.write_bytes(buf.getvalue())


def write_json(path: str | os.PathLike, obj: Any) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def read_structured(text_or_path: str | None) -> dict:
    """Parse a JSON/YAML mapping given inline or as a file path (used for --params arguments)."""
    if not text_or_path:
        return {}
    if os.path.exists(text_or_path):
        text = Path(text_or_path).read_text()
    else:
        text = text_or_path
    try:
        obj = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise UserError(f"--params is neither an existing file nor valid JSON/YAML: {e}") from None
    if obj is None:
        return {}
    if not isinstance(obj, dict):
        raise UserError(f"--params must be a mapping of names to values, got {type(obj).__name__}")
    return obj


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
