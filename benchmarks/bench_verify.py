"""What the check before a run's first job costs (lantern.pipeline.verify, docs/running.md).

    python benchmarks/bench_verify.py --results results [--config config/config.yaml]
    python benchmarks/bench_verify.py --synthetic /tmp/verify-bench [--points 38] [--shards 50] [--images 100]

--results times the check on a finished run's outdir (the points and shards of --config, as the Snakefile names
them), on its fast path and with every digest (LANTERN_VERIFY=digests); nothing is moved when the run is sound (a
damaged item would be set aside, as by the Snakefile). --synthetic first writes a results tree at a recipe's scale
(default: the t2i recipe, config/llamagen-t2i.yaml: 38 points x 50 shards x 100 images) with real manifests,
stats tables, metrics files and tables, its PNGs small (a file's size does not change what a stat costs), then
times the fast path on it (a second call reuses the tree); the digest path at that scale is the images' bytes over the sha256 rate measured here.
Times are with the files in the page cache (a second pass); a cold network file system stats more slowly.
"""

import argparse
import hashlib
import json
import os
import time
from pathlib import Path

import pandas as pd
import yaml

from lantern.metrics.shards import image_name, image_record, stats_record
from lantern.pipeline.verify import TABLE_FILES, verify_results


def sweep_of(results: Path, config: Path) -> dict[str, list[str]]:
    """metrics file -> its shards, as workflow/rules/common.smk names them for `config`."""
    from lantern.engine.methods import mode_points
    from lantern.pipeline.config import expand_methods, merge_config, validate_config

    base = yaml.safe_load((Path(__file__).resolve().parents[1] / "config" / "config.yaml").read_text())
    cfg = validate_config(merge_config(base, {**yaml.safe_load(config.read_text()), "outdir": str(results)}))
    points = expand_methods(cfg)
    return {f"{results}/metrics/{m}/{p}.json": [f"{results}/gen/{m}/{p}/shard{j}" for j in range(cfg["sweep"]["shards"])]
            for m in cfg["sweep"]["modes"] for p in sorted(mode_points(points, m))}


def synthesize(root: Path, points: int, shards: int, images: int, tokens: int = 256) -> dict[str, list[str]]:
    """A sound results tree of `points` x `shards` x `images`; stats tables of a t2i point's width (tokens, caption)."""
    png = bytes(range(256)) * 4  # the bytes do not matter to the fast path, only that the record matches them
    digest = hashlib.sha256(png).hexdigest()
    sweep, rows = {}, []
    for p in range(points):
        point = f"point{p:02d}"
        shard_paths = []
        for j in range(shards):
            shard = root / "gen" / "sampling" / point / f"shard{j}"
            (shard / "images").mkdir(parents=True, exist_ok=True)
            start = j * images
            for i in range(start, start + images):
                (shard / "images" / image_name(i)).write_bytes(png)
            stats = pd.DataFrame({"image_index": range(start, start + images), "n_tokens": tokens,
                                  "caption": "a photograph of a small dog on a red sofa next to a window " * 2,
                                  "tokens": " ".join(["12345"] * tokens)})
            stats.to_csv(shard / "stats.csv", index=False)
            record = image_record(shard, start, start + images, {image_name(i): digest for i in
                                                                 range(start, start + images)})
            (shard / "manifest.json").write_text(json.dumps({"start": start, "end": start + images, "images": record,
                                                             "stats_table": stats_record(shard / "stats.csv",
                                                                                         images)}))
            shard_paths.append(str(shard))
        metrics = root / "metrics" / "sampling" / f"{point}.json"
        metrics.parent.mkdir(parents=True, exist_ok=True)
        metrics.write_text(json.dumps({"n_generated": shards * images}))
        sweep[str(metrics)] = shard_paths
        rows.append({"mode": "sampling", "point": point, "n_images": shards * images, "n_tokens": tokens})
    tables = root / "tables"
    tables.mkdir(exist_ok=True)
    pd.DataFrame(rows).to_csv(tables / "sweep.csv", index=False)
    pd.DataFrame([{"mode": "sampling", "point": r["point"], "position": t} for r in rows for t in range(tokens)]
                 ).to_csv(tables / "positions.csv", index=False)
    pd.DataFrame(columns=["mode", "point", "depth", "steps"]).to_csv(tables / "depths.csv", index=False)
    (tables / "summary.md").write_text("# Sweep summary\n")
    assert {p.name for p in tables.iterdir()} == set(TABLE_FILES)
    return sweep


def timed(results: Path, sweep: dict, digests: bool) -> tuple[float, object]:
    t0 = time.perf_counter()
    found = verify_results(results, sweep, results / "tables", digests)
    return time.perf_counter() - t0, found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, help="a finished run's outdir")
    ap.add_argument("--config", type=Path, default=Path("config/config.yaml"))
    ap.add_argument("--synthetic", type=Path, help="write a synthetic results tree here first")
    ap.add_argument("--points", type=int, default=38)
    ap.add_argument("--shards", type=int, default=50)
    ap.add_argument("--images", type=int, default=100, help="images per shard")
    ap.add_argument("--png-kib", type=float, default=120.0, help="a real PNG's size for the digest estimate "
                    "(LlamaGen 256 x 256: about 120 KiB)")
    a = ap.parse_args()
    if a.synthetic:
        t0 = time.perf_counter()
        if (a.synthetic / "tables" / "sweep.csv").is_file():  # written by an earlier call with the same sizes
            sweep = {str(a.synthetic / "metrics" / "sampling" / f"point{p:02d}.json"):
                     [str(a.synthetic / "gen" / "sampling" / f"point{p:02d}" / f"shard{j}") for j in range(a.shards)]
                     for p in range(a.points)}
        else:
            sweep = synthesize(a.synthetic, a.points, a.shards, a.images)
            print(f"wrote {a.points} x {a.shards} x {a.images} images in {time.perf_counter() - t0:.0f} s")
        results, modes = a.synthetic, [False]
    else:
        results, sweep, modes = a.results, sweep_of(a.results, a.config), [False, True]
    for digests in modes:
        timed(results, sweep, digests)  # the first pass fills the page cache
        seconds, found = timed(results, sweep, digests)
        print(f"{'digests' if digests else 'fast path'}: {seconds:.2f} s for {found.shards} shards, {found.images} "
              f"images ({found.hashed} hashed), {len(sweep)} metrics files; {len(found.lines)} findings")
        for line in found.lines:
            print("  " + line)
    if a.synthetic:
        block = os.urandom(1 << 26)
        t0 = time.perf_counter()
        hashlib.sha256(block).hexdigest()
        rate = len(block) / (time.perf_counter() - t0)
        total = a.points * a.shards * a.images * a.png_kib * 1024
        print(f"digests at this scale: {total / 2**30:.1f} GiB of {a.png_kib:g} KiB PNGs at {rate / 2**20:.0f} MiB/s "
              f"sha256 = {total / rate:.0f} s (one core, the bytes in the page cache; a disk's read rate can bound it)")


if __name__ == "__main__":
    main()
