"""`lantern sample`: generate images [start, end) for one method; PNGs, a per-image stats table and a manifest.

Images are decoded in batches of --batch-size aligned to the image index (batch j holds images jB .. jB + B - 1 of
the range), so a shard boundary at a multiple of B never changes a batch. Every image draws from its own
generator, seeded from (seed, i): batched and one-by-one decoding give the same tokens up to float rounding of
batched kernels. Per-image times of a batch are its wall time / B (throughput); batch 1 gives latency. With
--latency-images K the first K images of the range are decoded alone instead (batch-1 latency beside the batched
throughput, each image decoded once), and the batches start after them.
The output folder appears only when the shard is complete (built in `<out>.partial`, then renamed). A killed job
leaves its finished batches in `<out>.partial`; the rerun keeps them (they are byte-identical by construction) and
decodes the rest, a batch always in full. Each image's row records the sha256 of the bytes encoded for it, and a
rerun keeps an image only when its file is a readable image holding those bytes (a power cut can leave an empty or
short file under a finished name on file systems that delay writes); any other is redrawn with its batch.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import io
import json
import os
import platform
import random
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from PIL import Image

from lantern import __version__
from lantern.engine.models.checkpoint import parse_device
from lantern.engine.decoding.compiled import resolve
from lantern.pipeline.determinism import configure as configure_determinism, settings as determinism_settings
from lantern.engine.methods import build_decoder, normalize, point_name, speculative
from lantern.engine.models.model import PAD_SEMANTICS
from lantern.errors import UserError
from lantern.engine.decoding.generate import generate
from lantern.engine.decoding.sampling import SamplingParams, image_generator, image_seed
from lantern.io import atomic_path, check_image, fsync_folder, not_a_file, read_structured, sha256_file, write_json
from lantern.params import params_from
from lantern.metrics.shards import RECORD, STATS_RECORD, image_name, image_record, stats_record
from lantern.worlds.llamagen.upstream import load_gpt
from lantern.metrics.speed import ALONE, ALONE_REFERENCE, IN_JOB_REFERENCE
from lantern.pipeline.progress import Progress
from lantern.pipeline.sample_chameleon import add_arguments as add_chameleon_arguments, chameleon_job
from lantern.pipeline.sample_chameleon import identity as chameleon_identity


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """[B, 3, H, W] in about [-1, 1] -> [B, H, W, 3] uint8."""
    x = ((images.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return x.permute(0, 2, 3, 1).cpu().numpy()


# a row's record of its image: the sha256 of the PNG bytes encoded for it (kept out of stats.csv)
DIGEST = "png_sha256"


def png_bytes(array: np.ndarray) -> bytes:
    """An image's PNG file, as every shard's image is encoded (the repair re-encodes a redrawn one the same way)."""
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


def save_png(array: np.ndarray, path: Path) -> str:
    """Write the PNG; return the sha256 of the bytes encoded (what the file must hold to be kept on a resume)."""
    data = png_bytes(array)
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def environment(device: torch.device) -> dict:
    env = {"lantern": __version__, "torch": torch.__version__, "python": platform.python_version(),
           "host": platform.node(), "device": str(device), "git_commit": git_commit(),
           "threads": torch.get_num_threads()}
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    return env


def resolve_pad_semantics(choice: str, drafter_path: str | None) -> str:
    """What a left-padded caption position's target state is (model.authors_prefill_mask): `auto` gives the LANTERN
    authors' semantics when the drafter is theirs (converted by `lantern convert`: trained on their target's
    states), upstream's otherwise (plain AR, where those states feed nothing, and self-trained drafters)."""
    if choice != "auto":
        return choice
    if not drafter_path:
        return "upstream"
    from lantern.engine.models.drafter import read_drafter

    return "authors" if read_drafter(drafter_path, mmap=True).get("converted_from") else "upstream"


class Decoder:
    """Loads the models a method needs once and turns a batch (cond, generators, cond_mask) into image tokens
    [B, N] plus one ImageStats per image; cond is class ids [B], or caption features [B, T, C] with their mask
    [B, T]. `reference` is plain AR on the same target and batch, for speed-ups timed in the same job."""

    def __init__(self, method: dict, params: SamplingParams, target_path: str, device: torch.device, dtype: str,
                 drafter_path: str | None = None, neighbours_path: str | None = None, vq_path: str | None = None,
                 spec: dict | None = None, compile: str = "auto", pad_semantics: str = "auto"):
        self.method, self.params, self.device = method, params, device
        self.compile = resolve({"true": True, "false": False}.get(compile, compile), device)
        # spec only when given: upstream files need one, ours carry their args
        self.target = load_gpt(target_path, dtype=dtype, device=str(device), **({"spec": spec} if spec else {}))
        self.pad_semantics = resolve_pad_semantics(pad_semantics, drafter_path if speculative(method) else None)
        self.target.pad_semantics = self.pad_semantics
        self.reference = self._vanilla
        if speculative(method):
            self.run = build_decoder(method, params, self.target, drafter_path, neighbours_path, vq_path, device,
                                     self.compile)
        else:
            self.run = self._vanilla

    def _vanilla(self, cond: torch.Tensor, generators: list[torch.Generator], cond_mask: torch.Tensor | None = None):
        return generate(self.target, cond, self.params, generators, cond_mask, compile=self.compile)


class Conditions:
    """The condition of image i: its class (c2i, --labels), or its caption's features (t2i, --captions)."""

    def __init__(self, a, target):
        self.t2i = target.args.model_type == "t2i"
        if not self.t2i:
            if a.captions:
                raise UserError(f"--captions {a.captions} is for text-to-image targets; {a.target} is "
                                "class-conditional (c2i): drop --captions and choose classes with --labels")
            classes = target.args.num_classes
            if a.labels != "cycle" and not (a.labels.isdigit() and int(a.labels) < classes):
                raise UserError(f"--labels {a.labels!r} must be 'cycle' or a class id in 0..{classes - 1}")
            self.label = (lambda i: i % classes) if a.labels == "cycle" else (lambda i, c=int(a.labels): c)
            self.device = target.output.weight.device
            return
        if not a.captions:
            raise UserError(f"{a.target} is a text-to-image (t2i) target: give its caption features with --captions "
                            "(a shard from `lantern encode-captions` covering --start..--end)")
        from lantern.worlds.llamagen.captions import read_captions_file, rows_for

        data = read_captions_file(a.captions)
        where = f"--captions {a.captions}"
        T, C = target.args.cls_token_num, target.args.caption_dim
        if tuple(data["features"].shape[1:]) != (T, C):
            L, W = data["features"].shape[1:]
            raise UserError(f"{where} holds features [{L}, {W}] per caption, but the target reads [{T}, {C}] "
                            "(cls_token_num, caption_dim); encode them with the T5 the target was trained with "
                            f"and --max-length {T}")
        rows = rows_for(data, a.start, a.end, where)
        dtype, device = target.output.weight.dtype, target.output.weight.device
        self.row = dict(zip(range(a.start, a.end), rows))
        self.ids, self.captions = data["ids"], data["captions"]
        self.features, self.mask = data["features"].to(device=device, dtype=dtype), data["mask"].to(device)

    def __call__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(cond, cond_mask) of images `indices`: class ids [B], or caption features [B, T, C] and mask [B, T]."""
        if not self.t2i:
            return torch.tensor([self.label(i) for i in indices], device=self.device), None
        rows = [self.row[i] for i in indices]
        return self.features[rows], self.mask[rows]

    def describe(self, i: int) -> dict:
        """What the stats row says about the condition of image i."""
        if not self.t2i:
            return {"label": self.label(i)}
        r = self.row[i]
        return {"prompt_id": self.ids[r], "caption": self.captions[r]}


def job_identity(a) -> dict:
    """Everything that decides image i, except the shard range: rows kept in a .partial folder are reused only
    by a rerun that would draw the very same images (a changed shard count may reuse them; a changed method not)."""
    files = {k: (str(Path(v).resolve()), Path(v).stat().st_mtime_ns) if v else None
             for k, v in (("target", a.target), ("vq", a.vq), ("drafter", a.drafter), ("neighbours", a.neighbours),
                          ("captions", a.captions))}
    return {"method": read_structured(a.method, "--method"), "sampling": read_structured(a.sampling, "--sampling"),
            "mode": a.mode,
            "seed": a.seed, "labels": a.labels, "device": a.device, "dtype": a.dtype, "files": files,
            "target_spec": read_structured(a.target_spec, "--target-spec"), "in_job_vanilla": a.in_job_vanilla,
            "in_job_vanilla_every": a.in_job_vanilla_every, "batch_size": a.batch_size,
            "latency_images": a.latency_images, "compile": a.compile, "pad_semantics": a.pad_semantics,
            **({"chameleon": chameleon_identity(a)} if a.family else {})}


def read_json(path: Path):
    """A JSON file's value, or None when it is not whole (a crash can leave an empty or short file)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def kept_image_fault(row_path: Path, images: Path) -> str | None:
    """Why a finished row of a .partial folder cannot be kept (None: it can): its row unreadable, its image missing,
    unreadable, or not the bytes recorded when it was written."""
    row = read_json(row_path)
    if not isinstance(row, dict) or not isinstance(row.get(DIGEST), str):
        return f"its row {row_path.name} is not whole"
    image = images / image_name(int(row_path.stem))
    if not image.is_file():
        return f"{image.name} is missing"
    try:
        check_image(image)
    except UserError:
        return f"{image.name} is not a readable image ({image.stat().st_size} bytes)"
    if sha256_file(image) != row[DIGEST]:
        return f"{image.name} does not hold the bytes written for it"
    return None


def resume_or_restart(partial: Path, identity: dict) -> None:
    marker = partial / "job.json"
    if partial.exists():
        same = marker.is_file() and read_json(marker) == json.loads(json.dumps(identity))
        if not same:
            print(f"discarding {partial}: it was made by a different job")
            shutil.rmtree(partial)
        else:
            rows = sorted((partial / "rows").glob("*.json"))
            for row_path in rows:
                if (fault := kept_image_fault(row_path, partial / "images")) is not None:
                    print(f"{partial}: not keeping image {row_path.stem}: {fault}; it is redrawn with its batch")
                    row_path.unlink()
            kept = len(list((partial / "rows").glob("*.json")))
            print(f"resuming {partial}: {kept} finished images kept (each checked against its recorded digest)")
    partial.mkdir(parents=True, exist_ok=True)
    write_json(marker, identity)


# Greedy decoding relaxes over the full CFG-mixed softmax, as the LANTERN authors' greedy path does
# (models/ea_model_llamagen.py): temperature and the top-k / top-p filters never change an argmax, but a filter
# would hide neighbours' mass from the relaxation.
GREEDY = {"greedy": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}


def drop_outside_range(partial: Path, start: int, end: int) -> None:
    """A .partial kept from a run with another shard range may hold images outside [start, end): the finished
    folder must hold exactly its own range, so those go (they are redrawn identically by whichever shard owns them)."""
    for sub, suffix in (("rows", ".json"), ("images", ".png")):
        for f in (partial / sub).glob(f"*{suffix}"):
            if not start <= int(f.stem) < end:
                f.unlink()


def warm_up(decoder: Decoder, condition: Conditions, first: list[int], a, reference: bool) -> None:
    """Untimed decodes that keep one-time costs out of every timed one. Eager, those costs are per process (lazy
    init, allocator growth, the first kernel calls): one image alone pays them, and a later batch of 8 then runs as
    fast as the next (measured on the toy tree decoder: 0.5 s on the first batch without it, none with it). Compiled,
    graphs are per shape: the whole first batch, and batch 1 when images are also timed alone."""
    if decoder.compile:
        shapes = [first] + ([first[:1]] if len(first) > 1 and a.latency_images else [])
    else:
        shapes = [first[:1]]
    for images in shapes:
        cond, cond_mask = condition(images)
        decoder.run(cond, [image_generator(a.seed, i) for i in images], cond_mask)
        if reference:
            decoder.reference(cond, [image_generator(a.seed, i) for i in images], cond_mask)


def reference_batch(first_image: int, batch_size: int, every: int) -> bool:
    """Whether plain AR is timed on the batch that starts at `first_image` (`--in-job-vanilla-every`): one batch in
    each block of `every` consecutive global batches, at an offset drawn from the block's index, so any shard agrees.
    Drawn rather than fixed: labels cycle with a period of whole batches (the toy world's 6 classes at batch 8: every
    3 batches), and a fixed offset would time the same classes in every block."""
    block, offset = divmod(first_image // batch_size, every)
    return offset == random.Random(block).randrange(every)


def aligned_batches(start: int, end: int, size: int) -> list[list[int]]:
    """[start, end) cut at the multiples of `size`: the same batches whichever shard range they fall in (none when
    the range is empty: every image decoded alone)."""
    if start >= end:
        return []
    cuts = [start] + list(range((start // size + 1) * size, end, size)) + [end]
    return [list(range(lo, hi)) for lo, hi in zip(cuts, cuts[1:])]


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="lantern sample", description=__doc__)
    ap.add_argument("--target", required=True, help="GPT checkpoint (with --family: the HF target folder)")
    ap.add_argument("--vq", required=True, help="VQ checkpoint used to decode tokens into images (with --family: "
                    "the VQGAN's vqgan.ckpt)")
    ap.add_argument("--drafter", help="drafter checkpoint (speculative methods)")
    ap.add_argument("--neighbours", help="neighbour table (lantern / lanternpp)")
    ap.add_argument("--method", default='{"name": "vanilla"}', help="method spec (JSON/YAML or file)")
    ap.add_argument("--sampling", default="{}", help="SamplingParams (JSON/YAML or file)")
    ap.add_argument("--mode", choices=["greedy", "sampling"], default="sampling")
    ap.add_argument("--seed", type=int, default=0, help="global seed; image i uses a seed from (seed, i)")
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--end", type=int, required=True)
    ap.add_argument("--labels", default="cycle", help="c2i: 'cycle' (i mod num_classes) or one class id for all")
    ap.add_argument("--captions", help="t2i: caption features covering [start, end) (`lantern encode-captions`); "
                                       "image i is drawn for prompt row i")
    ap.add_argument("--target-spec", help="target spec (JSON/YAML or file: model_type, gpt_size, ...), needed for "
                                          "upstream checkpoints, which carry no config")
    ap.add_argument("--out", required=True, help="output folder (images/, stats.csv, manifest.json)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--compile", choices=["auto", "true", "false"], default="auto",
                    help="torch.compile the decode step of plain AR and the verify step of "
                    "speculative decoders (auto: on CUDA only)")
    ap.add_argument("--batch-size", type=int, default=1, help="images decoded together (aligned to the image "
                    "index; per-image times become batch wall time / B); 1 = the paper's per-image latency")
    ap.add_argument("--latency-images", type=int, default=0, help="with --batch-size > 1: decode the first K "
                    "images of the range alone instead of in batches (and, with --in-job-vanilla, with plain AR "
                    "alone): batch-1 latency (latency_s, vanilla_latency_s); the batches start after them")
    ap.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up (one image alone; "
                    "the first batch, and batch 1, when compiled)")
    ap.add_argument("--in-job-vanilla", action="store_true",
                    help="also decode every image with plain AR in this job and record its latency "
                         "(vanilla_time_total_s): a speed-up reference from the same machine at the same moment")
    ap.add_argument("--pad-semantics", choices=("auto",) + PAD_SEMANTICS, default="auto",
                    help="t2i: the target state at a left-padded caption position, which the drafter reads: upstream "
                         "(the position sees itself) or authors (the LANTERN authors' HF target's mask rule); auto: "
                         "authors with a drafter converted from theirs, else upstream")
    ap.add_argument("--in-job-vanilla-every", type=int, default=1, metavar="N",
                    help="with --in-job-vanilla: time plain AR on one batch in each block of N consecutive batches "
                         "(global batch index = first image // --batch-size; the offset in a block is drawn from the "
                         "block's index, so any shard agrees); the speed-up pairs those images' times with the "
                         "method's. With --latency-images, also one image in each block of N of those decoded alone")
    add_chameleon_arguments(ap)
    ap.add_argument("--quiet", action="store_true", help="no progress lines (images done, images/s, ETA, tau so "
                    "far; on stderr: a bar on a terminal, else a line every 30 s)")
    return ap.parse_args(argv)


def llamagen_job(a, method: dict, params: SamplingParams, device: torch.device, spec):
    """(decoder, condition, pixels of codes [1, N] -> uint8 [H, W, 3]) of a toy or LlamaGen world's job."""
    from lantern.worlds.llamagen.upstream import load_vq

    decoder = Decoder(method, params, a.target, device, a.dtype, a.drafter, a.neighbours, a.vq, spec, a.compile,
                      a.pad_semantics)
    condition = Conditions(a, decoder.target)
    vq = load_vq(a.vq, device=str(device))
    if decoder.target.args.vocab_size != vq.args.codebook_size:
        raise UserError(f"--target {a.target} predicts {decoder.target.args.vocab_size} codes, but --vq {a.vq} decodes "
                        f"{vq.args.codebook_size}; give the VQ the target was trained with")
    return decoder, condition, lambda codes: to_uint8(vq.decode_code(codes))[0]


def main(argv: list[str]) -> None:
    a = parse_args(argv)
    if not 0 <= a.start < a.end:
        raise UserError(f"need 0 <= --start < --end, got {a.start} and {a.end}")
    for flag, value, low in (("--batch-size", a.batch_size, 1), ("--latency-images", a.latency_images, 0),
                             ("--in-job-vanilla-every", a.in_job_vanilla_every, 1)):
        if value < low:
            raise UserError(f"{flag} must be >= {low}, got {value}")
    method = normalize(read_structured(a.method, "--method"), "--method")
    sampling = read_structured(a.sampling, "--sampling")
    params = params_from({**sampling, **(GREEDY if a.mode == "greedy" else {})}, SamplingParams, "--sampling.")
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    device = parse_device(a.device)
    configure_determinism(device)  # before any CUDA kernel (cuBLAS reads its workspace setting once)
    spec = read_structured(a.target_spec, "--target-spec")
    world = {}  # the manifest's keys of a Chameleon world
    if a.family:  # the world's own loader names every missing file (its target is a folder)
        decoder, condition, pixels, world = chameleon_job(a, method, params, device)
    else:
        for path, what in ((a.target, "--target"), (a.vq, "--vq"), (a.captions, "--captions")):
            if path and not Path(path).is_file():
                raise not_a_file(what, path)
        decoder, condition, pixels = llamagen_job(a, method, params, device, spec)

    out, partial = Path(a.out), Path(f"{a.out}.partial")
    resume_or_restart(partial, job_identity(a))
    (partial / "images").mkdir(parents=True, exist_ok=True)
    (partial / "rows").mkdir(exist_ok=True)
    reference = a.in_job_vanilla and method["name"] != "vanilla"
    # With batches, the first --latency-images images are decoded alone instead (batch-1 latency), each timed with
    # plain AR alone right after it (one in each block of --in-job-vanilla-every); the rest in aligned batches.
    split = min(a.start + a.latency_images, a.end) if a.batch_size > 1 else a.start
    passes = ([(batch, a.batch_size) for batch in aligned_batches(split, a.end, a.batch_size)]
              + [([i], 1) for i in range(a.start, split)])
    if not a.no_warmup:
        warm_up(decoder, condition, passes[0][0], a, reference)
    started = time.time()
    todo = [(batch, size) for batch, size in passes
            if not all((partial / "rows" / f"{i:06d}.json").exists() for i in batch)]  # a resumed job skips the rest
    progress = Progress(sum(len(batch) for batch, _ in todo), f"{point_name(method)} ({a.mode})", quiet=a.quiet)
    for batch, size in todo:
        row_paths = [partial / "rows" / f"{i:06d}.json" for i in batch]
        cond, cond_mask = condition(batch)
        tokens, stats = decoder.run(cond, [image_generator(a.seed, i) for i in batch], cond_mask)
        timed = reference and reference_batch(batch[0], size, a.in_job_vanilla_every)
        if timed:  # right after the method's batch: both see the same machine load
            _, plain = decoder.reference(cond, [image_generator(a.seed, i) for i in batch], cond_mask)
        alone = size < a.batch_size
        for b, i in enumerate(batch):
            with torch.no_grad():  # one image at a time: its pixels never depend on the batch
                image = pixels(tokens[b : b + 1].to(device))
            digest = save_png(image, partial / "images" / image_name(i))
            row = {"image_index": i, "seed": image_seed(a.seed, i), **condition.describe(i), "method": method["name"],
                   "mode": a.mode, **stats[b].row(), "tokens": " ".join(map(str, tokens[b].tolist()))}
            if alone:
                row[ALONE] = stats[b].time_total_s
            if timed:
                row[ALONE_REFERENCE if alone else IN_JOB_REFERENCE] = plain[b].time_total_s
            write_json(row_paths[b], {**row, DIGEST: digest})
        progress.update(len(batch), [s.tau for s in stats])
    progress.close()

    drop_outside_range(partial, a.start, a.end)
    rows = [json.loads(p.read_text()) for p in sorted((partial / "rows").glob("*.json"))]
    if [r["image_index"] for r in rows] != list(range(a.start, a.end)):  # never rename a folder that lies
        raise RuntimeError(f"{partial} holds rows {[r['image_index'] for r in rows]}, not {a.start}..{a.end - 1}")
    written = {image_name(r["image_index"]): r.pop(DIGEST) for r in rows}
    images = image_record(partial, a.start, a.end, written)  # what evaluate, tables and figures check before reading
    with atomic_path(partial / "stats.csv") as tmp:
        pd.DataFrame(rows).to_csv(tmp, index=False)
    write_json(partial / "manifest.json", {
        "method": method, "sampling": dataclasses.asdict(params),
        "mode": a.mode, "seed": a.seed, "start": a.start, "end": a.end, "batch_size": a.batch_size,
        "compile": decoder.compile, "pad_semantics": decoder.pad_semantics,
        "target": a.target, "vq": a.vq,
        "drafter": a.drafter, "neighbours": a.neighbours, "target_spec": spec,
        "captions": {"path": a.captions, "sha256": sha256_file(a.captions)} if a.captions else None, **world,
        RECORD: images, STATS_RECORD: stats_record(partial / "stats.csv", len(rows)),
        "wall_s_this_run": time.time() - started,
        "environment": environment(device),
        "determinism": determinism_settings(device),  # after the work: a compiled job has loaded inductor by now
    })
    shutil.rmtree(partial / "rows")
    (partial / "job.json").unlink()
    if out.exists():
        shutil.rmtree(out)
    os.replace(partial, out)
    fsync_folder(out.parent)  # the finished folder's name survives a power cut
    print(f"wrote {a.end - a.start} images to {out}")
