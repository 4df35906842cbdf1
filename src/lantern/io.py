"""Atomic file output: nothing half-written is ever left where a finished file is expected."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterator

import yaml

from lantern.errors import UserError


_UMASK = os.umask(0o022)
os.umask(_UMASK)


# A full disk or a quota: whatever file is being written, the fix is room on its file system.
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
# Permission denied, a read-only file system: the fix is the folder's permissions or another outdir.
NO_ACCESS = (errno.EACCES, errno.EPERM, errno.EROFS)


def disk_error(e: OSError, path: str | os.PathLike | None = None, elsewhere: str = "set outdir to") -> UserError | None:
    """The one line for an OSError of a full or unwritable disk (None for any other OSError): the path, and what
    to free or fix. `path`: the file being written (else the error's own file name); `elsewhere`: how the user
    points the write at another folder (the pipeline's outdir, or a command's flag: "give --out")."""
    where = Path(path) if path else Path(e.filename) if e.filename else None
    at = f" {where}" if where else ""
    if e.errno in NO_SPACE:
        folder = where.parent if where else Path.cwd()
        return UserError(f"cannot write{at}: no space left on the device ({errno.errorcode[e.errno]}); free space on "
                         f"the file system of {folder} (`df -h {folder}`) or {elsewhere} a disk with room, then run "
                         "again (finished files are kept, nothing half-written was left)")
    if e.errno in NO_ACCESS:
        name = {errno.EROFS: "read-only file system"}.get(e.errno, "permission denied")
        if path is None:  # the CLI's net: the failing call may have been a read as well as a write
            return UserError(f"cannot access{at}: {name} ({errno.errorcode[e.errno]}); make it and its folder "
                             f"accessible to this user (chmod / chown), or {elsewhere} a writable folder")
        return UserError(f"cannot write{at}: {name} ({errno.errorcode[e.errno]}); make {where.parent} writable for "
                         f"this user (chmod / chown) or {elsewhere} a writable folder")
    return None


def fsync_folder(folder: str | os.PathLike) -> None:
    """Make a folder's entries (a file created or renamed in it) durable: without it a power cut can lose a rename
    that had returned. A file system that cannot sync a folder (some network mounts) is left to its own promise."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def fsync_file(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, elsewhere: str = "set outdir to") -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it onto `path` only if the block succeeds, durably: the file's
    bytes are synced before the rename and its folder before and after it, so after a power cut `path` is either the
    old file or the whole new one, never an empty or short file under the finished name. A full or unwritable disk
    is one UserError naming `path` (the temporary file is removed, `path` left as it was); `elsewhere` is how the
    user writes it elsewhere (disk_error)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
    except OSError as e:
        raise (disk_error(e, path, elsewhere) or e) from None
    tmp = Path(tmp)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes files private; results are ordinary files
        fsync_file(tmp)  # the bytes reach the disk before the name points at them
        fsync_folder(path.parent)  # and the temporary entry with them
        os.replace(tmp, path)
        fsync_folder(path.parent)  # the rename itself
    except OSError as e:
        # a write into the temporary file names it (or nothing): the user's file is `path`
        error = disk_error(e, path, elsewhere) if e.errno in NO_SPACE or e.filename in (None, str(tmp)) else None
        if error is None:
            raise
        raise error from None
    finally:
        tmp.unlink(missing_ok=True)


def not_a_file(what: str, path: str | os.PathLike, fix: str = "") -> UserError:
    """The line for a path that is no file: a folder where a file belongs says so, rather than "does not exist"."""
    path = Path(path)
    if path.is_dir():
        return UserError(f"{what} {path} is a folder, not a file; give the file itself (e.g. {path}/<name>)")
    return UserError(f"{what} {path} does not exist{fix}")


def save_torch(obj: Any, path: str | os.PathLike) -> None:
    """torch.save, atomically and byte-reproducibly: torch names the archive's root folder after the file it
    writes, so saving straight to a temporary name would make two saves of the same object differ."""
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    with atomic_path(path) as tmp:
        tmp.write_bytes(buf.getvalue())


def load_torch(path: str | os.PathLike, what: str, maker: str = "", mmap: bool = False) -> dict:
    """The one reader of user-given torch files: a missing, unreadable or foreign file (a text file named .pt, a
    pickle of arbitrary objects, a truncated archive, a list instead of a mapping) is one UserError line."""
    import torch

    path = Path(path)
    fix = f"; make it with `{maker}`" if maker else "; check the path"
    if not path.is_file():
        raise not_a_file(what, path, fix)
    try:
        with warnings.catch_warnings():  # e.g. torch's note on a foreign pickle's protocol: the error says it all
            warnings.simplefilter("ignore")
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:  # noqa: BLE001 - whatever torch or pickle raises, the user's answer is the same
        if mmap:  # a legacy (non-zip) torch file cannot be mapped: read it whole, which names any other problem
            return load_torch(path, what, maker)
        detail = (str(e).strip().split(". ")[0].splitlines() or [type(e).__name__])[0][:120]
        raise UserError(f"{what} {path} is unreadable: not a torch file of tensors, or truncated ({detail})") from None
    if not isinstance(obj, dict):
        raise UserError(f"{what} {path} holds a {type(obj).__name__}, not a mapping of tensors{fix}")
    return obj



def read_resume(path: Path | None, identity: dict, job: str) -> dict | None:
    """A training job's resume checkpoint at `path` when it belongs to this run (its "identity" equals `identity`),
    else None: a foreign or broken one is said on stderr and ignored, and training starts afresh and overwrites it."""
    if path is None or not path.is_file():
        return None
    try:
        state = load_torch(path, f"{job} resume checkpoint")
    except UserError as e:
        print(f"{job}: ignoring {e}; starting afresh", file=sys.stderr, flush=True)
        return None
    if state.get("identity") != identity:
        print(f"{job}: {path} is another run's checkpoint (other params, model or data); starting afresh",
              file=sys.stderr, flush=True)
        return None
    print(f"{job}: resuming from {path} at step {state['step']}", file=sys.stderr, flush=True)
    return state

def read_csv(path: str | os.PathLike, what: str, fix: str, **kw):
    """pandas.read_csv, where a file that is not a readable CSV (binary, not UTF-8, ragged rows, empty) is one
    UserError naming it and `fix`."""
    import pandas as pd

    try:
        return pd.read_csv(path, **kw)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as e:
        detail = (str(e).strip().splitlines() or [type(e).__name__])[0][:120]
        raise UserError(f"{what} {path} is not a readable CSV ({detail}); {fix}") from None


def image_error(path: str | os.PathLike, e: Exception, what: str = "image") -> UserError:
    """The one line for an image PIL cannot read: unknown format, truncated, corrupt, or a decompression bomb."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(e, UnidentifiedImageError):
        detail = "not an image format PIL knows"
    elif isinstance(e, Image.DecompressionBombError):
        detail = str(e).split(", could be")[0]  # "Image size (N pixels) exceeds limit of M pixels"
    else:
        detail = (str(e).strip().splitlines() or [type(e).__name__])[0][:120]
    return UserError(f"{what} {path} is not a readable image ({detail}); remove or replace it")


def check_image(path: str | os.PathLike, what: str = "image") -> None:
    """Read an image file's header and check its data without decoding the pixels (PIL's verify: PNG chunk
    checksums, truncation), so a broken file stops a job before its work rather than in the middle of it."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            im.verify()
    except Exception as e:  # noqa: BLE001 - PIL raises OSError, SyntaxError, ValueError, DecompressionBombError, ...
        raise image_error(path, e, what) from None


def write_json(path: str | os.PathLike, obj: Any) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def read_structured(text_or_path: str | None, flag: str = "--params") -> dict:
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
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1}: {getattr(e, 'problem', '')})" if mark else ""
        raise UserError(f"{flag} {text_or_path[:60]!r} is neither an existing file nor valid JSON/YAML{where}") from None
    if obj is None:
        return {}
    if not isinstance(obj, dict):
        raise UserError(f"{flag} must be a mapping of names to values, got {type(obj).__name__}")
    return obj


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
