"""What a finished generation shard holds, recorded in its manifest and checked before anything reads it.

`lantern sample` writes `images` into the shard's manifest.json: the image count, the sha256 of every PNG (taken
from the bytes it encoded, not reread from the disk) and its size; and `stats_table`: stats.csv's rows, size and
sha256.
`lantern evaluate`, `lantern tables` and `lantern figure samples` call `verify_shard` first, so a shard that lost,
gained or changed an image stops them in one line naming the shard and how to redraw it (images are a function of
the config and the seed: a redraw is byte-identical), instead of a metrics row computed on fewer images. Evaluate
checks every image's bytes, the samples figure those it shows, the tables (which read no pixel) the count.
Manifests written before the record existed are checked by count only (their start..end range).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from lantern.errors import UserError
from lantern.io import sha256_file

RECORD = "images"  # the manifest's key
STATS_RECORD = "stats_table"  # stats.csv's record


def image_name(i: int) -> str:
    return f"{i:06d}.png"


def image_record(shard: Path, start: int, end: int, written: dict[str, str] | None = None) -> dict:
    """The manifest's record of shard images start..end - 1: `written` (name -> sha256 of the bytes encoded when
    each image was written), checked against the files now there, and their sizes. A file that no longer holds its
    bytes (a crash between write and disk) is one UserError: recording its digest now would make it verify.
    written=None: the files' own digests (a shard assembled by hand)."""
    folder = shard / "images"
    if written is None:
        written = {image_name(i): sha256_file(folder / image_name(i)) for i in range(start, end)}
    for i in range(start, end):
        name = image_name(i)
        if written.get(name) is None or sha256_file(folder / name) != written[name]:
            raise UserError(f"{folder / name} does not hold the image written for it; run the same command again "
                            "(the finished images that verify are kept, this one is redrawn)")
    names = [image_name(i) for i in range(start, end)]
    return {"count": len(names), "sha256": {n: written[n] for n in names},
            "bytes": {n: (folder / n).stat().st_size for n in names}}


def stats_record(path: Path, rows: int) -> dict:
    """The manifest's record of stats.csv, for the check before a run's first job (lantern.pipeline.verify)."""
    return {"rows": rows, "bytes": path.stat().st_size, "sha256": sha256_file(path)}


def redraw(shard: Path) -> str:
    # --forcerun rather than deleting the shard: Snakemake does not remake a missing input of outputs it holds up to
    # date (tables, figures), while a forced job reruns with everything computed from it. With `=`, the option takes
    # one value (a bare --forcerun would swallow the targets after it).
    return (f"redraw it and what was computed from it: add `--forcerun={shard}` to the same snakemake command (its "
            "images are deterministic, so the redraw is byte-identical)")


# A result computed from shards (a metrics file, the tables): the pipeline's check before its first job sets a
# damaged one aside and marks a missing one's consumers out of date, so the same command remakes it.
RECOMPUTE = ("run the same snakemake command again (its check before the first job sets the file aside, or marks "
             "what reads it out of date, and recomputes it)")


def read_manifest(shard: Path) -> dict:
    path = shard / "manifest.json"
    if not path.is_file():
        raise UserError(f"shard {shard} has no manifest.json, so it is not a finished `lantern sample` shard; "
                        f"{redraw(shard)}")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not valid JSON ({type(e).__name__}); {redraw(shard)}") from None
    if not isinstance(manifest, dict):
        raise UserError(f"{path} is not a `lantern sample` manifest; {redraw(shard)}")
    return manifest


def expected_images(manifest: dict) -> dict[str, str | None]:
    """name -> sha256 (None where the manifest predates digests and only its range says what it holds)."""
    record = manifest.get(RECORD)
    if isinstance(record, dict) and isinstance(record.get("sha256"), dict):
        return dict(record["sha256"])
    start, end = manifest.get("start"), manifest.get("end")
    if isinstance(start, int) and isinstance(end, int):
        return {image_name(i): None for i in range(start, end)}
    return {}


def verify_shard(shard: str | Path, digests: bool | Iterable[str] = True) -> dict:
    """The shard's manifest, after checking that its images folder holds exactly the images it records, and that
    the images in `digests` (True: all, False: none, or a collection of names) hold the recorded bytes. One
    UserError line otherwise. Hashing reads every byte (a 30 000-image LlamaGen point is gigabytes): the readers of
    pixels check what they read, the tables, which read no pixel, check the count."""
    shard = Path(shard)
    manifest = read_manifest(shard)
    want = expected_images(manifest)
    if not want:
        return manifest
    folder = shard / "images"
    have = {p.name for p in folder.glob("*.png")} if folder.is_dir() else set()
    missing, extra = sorted(set(want) - have), sorted(have - set(want))
    if missing:
        raise UserError(f"shard {shard} holds {len(want) - len(missing)} of the {len(want)} images its manifest "
                        f"records ({len(missing)} missing, e.g. images/{missing[0]}); {redraw(shard)}")
    if extra:
        raise UserError(f"shard {shard} holds {len(extra)} image(s) its manifest does not record (e.g. "
                        f"images/{extra[0]}); {redraw(shard)}")
    check = set(want) if digests is True else set() if digests is False else set(digests) & set(want)
    for name in sorted(check):
        if (digest := want[name]) is not None and sha256_file(folder / name) != digest:
            raise UserError(f"shard {shard}: images/{name} is not the image its manifest records (sha256 "
                            f"differs); {redraw(shard)}")
    return manifest


def shard_of(images_folder: str | Path) -> Path | None:
    """The shard an `--images` folder belongs to (`<shard>/images` beside a manifest.json), else None: a folder of
    the user's own images has no record to check."""
    folder = Path(images_folder)
    return folder.parent if folder.name == "images" and (folder.parent / "manifest.json").is_file() else None
