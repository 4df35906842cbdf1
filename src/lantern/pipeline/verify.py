"""Before a run's first job: check the results already there against their records, and set aside what is damaged.

Snakemake sees a shard folder as finished whatever it holds, and does not remake a missing file whose readers are
up to date (a deleted metrics file stays deleted). So the Snakefile calls `check_before_jobs` while it is read, before
the DAG is built, and each item of the sweep is checked:
- a shard (gen/{mode}/{point}/shard{j}) against its manifest.json: the PNGs it records, no other, each of its size
  and digest; stats.csv of its recorded size and digest (or, under a manifest that predates that record, one row per
  image);
- a metrics file (metrics/{mode}/{point}.json): a JSON mapping whose `n_generated` is the image count of its shards;
- the tables (tables/*): all four there, sweep.csv one row per (mode, point) with its shards' image count,
  positions.csv n_tokens rows per point, depths.csv and summary.md readable.
Damaged PNGs of a shard whose manifest and stats.csv are sound are first redrawn from their rows' tokens by the VQ
(a Chameleon shard's: the VQGAN its manifest records) and kept when they hold their recorded sha256 (png_restorer):
nothing else changes then. Otherwise a damaged item is moved (never deleted) to <outdir>/damaged/<time>/, under its
own relative path; the results computed from a damaged or missing item get a modification time in 1970 (STALE_NS),
so Snakemake reruns them and, through them, remakes what is missing. One line per item says what was found and what
the run does about it.

Digests: the fast path (the default) trusts a file whose size is the recorded one and which is not newer than its
manifest, and hashes the others (under a manifest written before sizes were recorded, a PNG must also end in its
end chunk); LANTERN_VERIFY=digests hashes every image and stats table.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lantern.errors import UserError
from lantern.io import sha256_file
from lantern.metrics.shards import RECORD, STATS_RECORD, expected_images, read_manifest

TABLE_FILES = ("sweep.csv", "positions.csv", "depths.csv", "summary.md")
DIGESTS_ENV = "LANTERN_VERIFY"  # "digests": hash every file (else the fast path on sizes and times)
SET_ASIDE = "damaged"  # <outdir>/damaged/<time>/<path under outdir>
# the modification time of a result marked out of date: one second after the epoch, older than any input (not 0,
# which Snakemake reads as "no time" and would not compare)
STALE_NS = 1_000_000_000
# Snakemake options under which a run executes no job: nothing is checked or moved then
NO_JOBS = ("dryrun", "touch", "lint", "list_rules", "list_target_rules", "dag", "rulegraph", "filegraph", "d3dag",
           "summary", "detailed_summary", "archive", "cleanup_metadata", "cleanup_shadow", "unlock", "list_changes",
           "list_input_changes", "list_params_changes", "list_untracked", "delete_all_output", "delete_temp_output",
           "print_compilation", "generate_unit_tests", "containerize", "conda_create_envs_only",
           "conda_cleanup_envs", "list_conda_envs", "show_failed_logs", "report")


@dataclass
class Findings:
    """What the check found and did: the lines to print, and counts for its closing line."""

    lines: list[str] = field(default_factory=list)
    shards: int = 0
    images: int = 0
    hashed: int = 0


def png_entries(folder: Path) -> dict[str, os.DirEntry]:
    """The PNGs of a folder by name (scandir: one listing, and the entries' stat without building paths)."""
    try:
        with os.scandir(folder) as entries:
            return {e.name: e for e in entries if e.name.endswith(".png")}
    except (FileNotFoundError, NotADirectoryError):
        return {}


PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"  # every whole PNG's last 12 bytes: its empty IEND chunk


def png_ends(path: Path) -> bool:
    """Whether the file ends as a whole PNG does (one short read): what an image cut by a crash lacks."""
    try:
        with open(path, "rb") as f:
            f.seek(-len(PNG_END), os.SEEK_END)
            return f.read() == PNG_END
    except OSError:  # shorter than the end chunk
        return False


@dataclass
class ShardCheck:
    """A shard's check: `fault` (None: sound), the image count its manifest records, and `images`, the damaged
    images when they are all the damage (the manifest and stats.csv sound): those can be restored from their tokens."""

    fault: str | None
    count: int = 0
    images: list[str] = field(default_factory=list)
    manifest: dict = field(default_factory=dict)


def shard_fault(shard: Path, digests: bool, found: Findings) -> ShardCheck:
    try:
        manifest = read_manifest(shard)
    except UserError:
        path = shard / "manifest.json"
        return ShardCheck("it has no manifest.json" if not path.is_file() else
                          f"its manifest.json is not whole ({size(path)})")
    want = expected_images(manifest)
    if not want:
        return ShardCheck("its manifest.json records no images")
    made = (shard / "manifest.json").stat().st_mtime_ns
    folder = shard / "images"
    entries = png_entries(folder)
    if extra := sorted(set(entries) - set(want)):
        return ShardCheck(f"it holds {len(extra)} image(s) its manifest does not record (e.g. images/{extra[0]})")
    record = manifest.get(RECORD) if isinstance(manifest.get(RECORD), dict) else {}
    sizes = record.get("bytes") if isinstance(record.get("bytes"), dict) else {}
    found.images += len(want)
    damaged: dict[str, str] = {}  # name -> what is wrong with it
    if missing := sorted(set(want) - set(entries)):
        damaged.update((name, "") for name in missing)
        first = f"it lacks {len(missing)} of the {len(want)} images its manifest records (e.g. images/{missing[0]})"
    for name in sorted(set(want) & set(entries)):
        st = entries[name].stat()
        if name in sizes and st.st_size != sizes[name]:
            damaged[name] = f"images/{name} holds {st.st_size} bytes, its manifest records {sizes[name]}"
        elif name not in sizes and not png_ends(folder / name):  # a manifest from before sizes: a cut file shows
            damaged[name] = f"images/{name} is cut short (no PNG end chunk; {st.st_size} bytes)"
        elif want[name] is not None and (digests or st.st_mtime_ns > made):  # None: a manifest from before digests
            found.hashed += 1
            if sha256_file(folder / name) != want[name]:
                damaged[name] = f"images/{name} is not the image its manifest records (sha256 differs, " \
                                f"{st.st_size} bytes)"
    stats = stats_fault(shard, manifest, sorted(want), made, digests)
    if not damaged:
        return ShardCheck(stats, len(want), [], manifest)
    fault = first if missing else next(iter(damaged.values()))
    fault += f" ({len(damaged)} damaged images in all)" if len(damaged) > 1 and not missing else ""
    restorable = stats is None and all(want[name] is not None for name in damaged)
    return ShardCheck(fault, len(want), sorted(damaged) if restorable else [], manifest)


def png_restorer(vq_path: str, threads: int):
    """restore(shard, names, manifest) -> whether every named PNG was redrawn from the tokens its stats.csv row
    holds, decoded by the world's VQ alone as `lantern sample` decodes it, and found to hold its recorded sha256
    (then written under the manifest's time, so nothing that read the shard is rerun). The VQ: for a Chameleon
    shard, the VQGAN its manifest records (family, --vq, --vqgan-yaml, --pixels), decoded as its PNGs were
    (worlds/chameleon/world.pixels_of); else `vq_path`, the run's LlamaGen-family VQ (empty: none). Each is loaded
    on the first damaged image that needs it, never when nothing is damaged. A decode that differs (another device
    or thread count) restores nothing: the shard is then redrawn."""
    state: dict = {}

    def decoder(manifest: dict):
        """codes [1, N] -> uint8 [H, W, 3] of the shard's world, or None when it cannot be decoded here."""
        import torch

        world = manifest.get("chameleon")
        key = ("chameleon", json.dumps(world, sort_keys=True), manifest.get("vq")) if isinstance(world, dict) \
            else ("vq", vq_path)
        if key not in state:
            torch.set_num_threads(threads)  # the generate rule's, as its PNGs were decoded
            try:
                if isinstance(world, dict):
                    from lantern.worlds.chameleon.world import vqgan_pixels

                    pixels = vqgan_pixels(world["family"], manifest["vq"], world.get("vqgan_yaml"), world.get("pixels"))
                    state[key] = lambda codes: pixels(codes)[0]
                elif vq_path:
                    from lantern.pipeline.sample import to_uint8
                    from lantern.worlds.llamagen.upstream import load_vq

                    vq = load_vq(vq_path, device="cpu")
                    state[key] = lambda codes: to_uint8(vq.decode_code(codes))[0]
                else:
                    state[key] = None
            except (UserError, KeyError, TypeError, OSError):  # its files gone or unreadable: redraw instead
                state[key] = None
        return state[key]

    def restore(shard: Path, names: list[str], manifest: dict) -> bool:
        import hashlib

        import pandas as pd
        import torch

        from lantern.io import atomic_path
        from lantern.pipeline.sample import png_bytes

        pixels = decoder(manifest)
        if pixels is None:
            return False
        try:
            rows = pd.read_csv(shard / "stats.csv", usecols=["image_index", "tokens"], dtype={"tokens": str})
        except ValueError:  # no tokens column
            return False
        tokens = dict(zip(rows["image_index"], rows["tokens"]))
        want, data = expected_images(manifest), {}
        for name in names:
            try:
                codes = torch.tensor([[int(t) for t in str(tokens[int(name.removesuffix(".png"))]).split()]])
                with torch.no_grad():
                    png = png_bytes(pixels(codes))
            except (KeyError, ValueError, IndexError, RuntimeError):  # tokens this VQ cannot decode: redraw instead
                return False
            if hashlib.sha256(png).hexdigest() != want[name]:
                return False
            data[name] = png
        made = (shard / "manifest.json").stat().st_mtime_ns
        for name, png in data.items():
            with atomic_path(shard / "images" / name) as tmp:
                tmp.write_bytes(png)
            os.utime(shard / "images" / name, ns=(made, made))
        return True

    return restore


def stats_fault(shard: Path, manifest: dict, names: list[str], made: int, digests: bool) -> str | None:
    """Why a shard's stats.csv is not the table its manifest records (None: it is)."""
    path = shard / "stats.csv"
    if not path.is_file():
        return "it has no stats.csv"
    record = manifest.get(STATS_RECORD)
    st = path.stat()
    if isinstance(record, dict):
        if st.st_size == record.get("bytes") and st.st_mtime_ns <= made and not digests:
            return None
        if st.st_size == record.get("bytes") and sha256_file(path) == record.get("sha256"):
            return None
    rows = stats_rows(path)
    if rows is None:
        return f"its stats.csv is not a readable table ({st.st_size} bytes)"
    want = [int(n.removesuffix(".png")) for n in names]
    if len(rows) != len(want):
        what = "short" if len(rows) < len(want) else "long"
        return f"its stats.csv is {what}: {len(rows)} rows for the {len(want)} images its manifest records"
    if rows != want:
        return "its stats.csv's image_index column is not the images its manifest records"
    if isinstance(record, dict):
        return "its stats.csv is not the table its manifest records (sha256 differs)"
    return None


def stats_rows(path: Path) -> list[int] | None:
    import pandas as pd

    try:
        return [int(i) for i in pd.read_csv(path, usecols=["image_index"])["image_index"]]
    except (ValueError, pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError):
        return None


def size(path: Path) -> str:
    return f"{path.stat().st_size} bytes"


def metrics_fault(path: Path, n_images: int | None) -> str | None:
    """Why a metrics file is not a metrics row of its shards' images (None: it is)."""
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        return f"it is not valid JSON ({size(path)})"
    if not isinstance(values, dict):
        return f"it holds a {type(values).__name__}, not a metrics row"
    used = values.get("n_generated")
    if n_images is not None and used is not None and used != n_images:
        return f"it was computed on {used} images (n_generated), but its shards hold {n_images}"
    return None


def tables_fault(folder: Path, counts: Mapping[tuple[str, str], int]) -> str | None:
    """Why the tables are not one whole set for the points `counts` (mode, point -> images) (None: they are)."""
    import pandas as pd

    absent = [name for name in TABLE_FILES if not (folder / name).is_file()]
    if absent:
        return f"{', '.join(absent)} {'is' if len(absent) == 1 else 'are'} missing beside the others"
    try:
        sweep = pd.read_csv(folder / "sweep.csv", usecols=["mode", "point", "n_images", "n_tokens"])
        positions = pd.read_csv(folder / "positions.csv", usecols=["mode", "point"])
        pd.read_csv(folder / "depths.csv", usecols=["mode", "point", "depth", "steps"])
    except (ValueError, pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        return f"a table is not readable ({(str(e).splitlines() or [type(e).__name__])[0][:80]})"
    rows = {(m, p): int(n) for m, p, n in zip(sweep["mode"], sweep["point"], sweep["n_images"])}
    if len(sweep) != len(rows) or set(rows) != set(counts):
        return f"sweep.csv has {len(sweep)} rows, not one for each of the {len(counts)} points"
    if wrong := [f"{m}/{p}" for (m, p), n in counts.items() if n is not None and rows[(m, p)] != n]:
        return f"sweep.csv's n_images of {wrong[0]} is not its shards' image count"
    tokens = dict(zip(zip(sweep["mode"], sweep["point"]), sweep["n_tokens"]))
    per_point = positions.groupby(["mode", "point"]).size().to_dict()
    if per_point != {k: int(v) for k, v in tokens.items()}:
        return "positions.csv does not hold n_tokens rows for every point"
    if not (folder / "summary.md").read_text(encoding="utf-8", errors="replace").startswith("# Sweep summary"):
        return "summary.md is not a whole sweep summary"
    return None


class Repair:
    """Moves damaged items aside and marks stale ones out of date, saying one line for each."""

    def __init__(self, out: Path, found: Findings):
        self.out, self.found = out, found
        self.folder = out / SET_ASIDE / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())

    def set_aside(self, path: Path, why: str, remade: str) -> None:
        dest = self.folder / path.relative_to(self.out)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, dest)
        self.found.lines.append(f"{path}: {why}; set aside as {dest}; {remade}")

    def stale(self, paths: Sequence[Path]) -> str:
        """Give existing results a 1970 modification time: older than anything they read, so Snakemake reruns them
        (their bytes are untouched; the rerun rewrites them). Returns the words for the line: what was marked."""
        marked = []
        for path in paths:
            if path.is_file():
                os.utime(path, ns=(path.stat().st_atime_ns, STALE_NS))
                name = "the tables" if path.parent.name == "tables" else str(path.relative_to(self.out))
                marked += [name] if name not in marked else []
        return f" ({' and '.join(marked)}, marked out of date)" if marked else ""


def verify_results(out: str | Path, metrics: Mapping[str, Sequence[str]], tables: str | Path,
                   digests: bool = False, restore=None) -> Findings:
    """Check the shards and metrics files named in `metrics` (metrics file -> its point's shard folders) and the
    tables folder `tables`; set aside the damaged, mark what depends on a damaged or missing item out of date.
    Paths as the Snakefile names them (under `out`). `restore` (png_restorer): first try to redraw a shard's
    damaged images from their tokens, which keeps the shard (and its times) when they come out as recorded."""
    out, tables = Path(out), Path(tables)
    found = Findings()
    repair = Repair(out, found)
    table_files = [tables / name for name in TABLE_FILES]
    tables_exist = any(p.exists() for p in table_files)
    tables_stale = False
    counts: dict[tuple[str, str], int | None] = {}
    for metrics_file, shards in metrics.items():
        metrics_file = Path(metrics_file)
        key = (metrics_file.parent.name, metrics_file.stem)
        stale, n_images = False, 0
        for shard in map(Path, shards):
            readers = [metrics_file] + (table_files if tables_exist else [])
            if not shard.is_dir():
                stale |= metrics_file.exists() or tables_exist
                if metrics_file.exists() or tables_exist:
                    marked = repair.stale(readers)
                    found.lines.append(f"{shard}: missing; this run redraws it and recomputes what read it{marked}")
                continue
            found.shards += 1
            check = shard_fault(shard, digests, found)
            if check.fault is None:
                n_images += check.count
                continue
            if check.images and restore is not None and restore(shard, check.images, check.manifest):
                found.lines.append(f"{shard}: {check.fault}; restored {len(check.images)} image(s) from the tokens "
                                   "in its stats.csv, each holding its recorded sha256 again: nothing to redraw")
                n_images += check.count
                continue
            fault = check.fault
            stale = True
            marked = repair.stale(readers)
            repair.set_aside(shard, fault, f"this run redraws it (the same bytes) and recomputes what read it{marked}")
        counts[key] = None if stale else n_images
        tables_stale |= stale
        if stale:
            continue
        if not metrics_file.is_file():
            if tables_exist:
                marked = repair.stale(table_files)
                found.lines.append(f"{metrics_file}: missing; this run recomputes it and what read it{marked}")
                tables_stale = True
            continue
        if (fault := metrics_fault(metrics_file, n_images)) is not None:
            marked = repair.stale(table_files)
            repair.set_aside(metrics_file, fault, f"this run recomputes it and what read it{marked}")
            tables_stale = True
    if tables_exist and not tables_stale and (fault := tables_fault(tables, counts)) is not None:
        for path in table_files:
            if path.exists():
                repair.set_aside(path, f"the tables are damaged: {fault}", "this run remakes it")
    return found


def executes_jobs(argv: Sequence[str]) -> bool:
    """Whether this `snakemake` command line runs jobs (not a dry run, --lint, --unlock, --report, ...). A command
    line Snakemake's own parser cannot read (Snakemake driven from Python) is taken as one that runs no job."""
    from snakemake.cli import parse_args

    if not argv or not (Path(argv[0]).name == "snakemake" or Path(argv[0]).parent.name == "snakemake"):
        return False
    try:
        _, args = parse_args(list(argv[1:]))
    except (SystemExit, Exception):  # noqa: BLE001 - Snakemake reports its own command-line errors itself
        return False
    return not any(getattr(args, name, None) for name in NO_JOBS) or bool(getattr(args, "report_after_run", False))


def check_before_jobs(workflow, out: str, metrics: Mapping[str, Sequence[str]], tables: str, vq: str,
                      threads: int) -> None:
    """The Snakefile's call: in the main Snakemake process of a command that runs jobs, check the existing results
    and print one line per finding and a closing line with the time it took. `vq` and `threads`: the VQ and the
    CPU thread count of the generation jobs, to restore damaged images from their tokens (a Chameleon shard's
    VQGAN is the one its manifest records)."""
    if not workflow.is_main_process or not executes_jobs(sys.argv):
        return
    if any(Path(".snakemake", "locks").glob("*")):  # another Snakemake is at work here, or a killed one's lock
        print("lantern: existing results not checked: another Snakemake holds this folder (or a killed one left "
              "its lock: `snakemake --unlock`, then the same command)", file=sys.stderr)
        return
    digests = os.environ.get(DIGESTS_ENV, "") == "digests"
    started = time.monotonic()
    found = verify_results(out, metrics, tables, digests, png_restorer(vq, threads))
    for line in found.lines:
        print(f"lantern: {line}", file=sys.stderr)
    if not found.shards and not found.lines:  # a fresh results folder: nothing to check
        return
    how = "every digest" if digests else f"sizes and times, {found.hashed} digests"
    print(f"lantern: checked {found.shards} shards ({found.images} images; {how}), their metrics and the tables in "
          f"{time.monotonic() - started:.1f} s: {len(found.lines) or 'nothing'} to repair", file=sys.stderr)
