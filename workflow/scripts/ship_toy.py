"""Copy toy-world checkpoints trained by the pipeline (toy.checkpoints: train) into models/toy/, with a manifest.

    python workflow/scripts/ship_toy.py <train outdir> models/toy [default] [clean]   (no world: both)
    python workflow/scripts/ship_toy.py <outdir> models/toy default --only classifier   (one model of a world)

The manifest records, per world, the command that trained its files, the resolved toy config, the seed, the git
commit and the SHA-256 of every file; shipping one world keeps the other world's entry as it was. `--only NAME`
ships one model's files (PARTS[NAME]) into an existing world entry: their checksums are updated and the entry's
`updates` list records how they were made (with toy.checkpoints: shipped, the classifier trains on the shipped VQ's
reconstructions and the drafter for the shipped target); shipping the whole world again starts its entry afresh.
Weights are
stored rounded to float16 (halves the repository's size; every loader casts them back to the model's dtype), so a
retraining at the recorded commit is compared with the shipped files after the same rounding.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import torch
import yaml

from lantern.pipeline.config import validate_config
from lantern.io import save_torch, sha256_file, write_json

FILES = {
    "default": ["vq.pt", "vq.json", "target.pt", "target.json", "drafter.pt", "clip.pt", "clip.json", "clip.metrics.json",
                "classifier.pt", "classifier.json"],
    "clean": ["vq.pt", "vq.json", "target.pt", "target.json"],
}
# models that can be shipped alone (--only): name -> its files
PARTS = {"classifier": ["classifier.pt", "classifier.json"], "drafter": ["drafter.pt"]}


def rounded(obj):
    """Every floating-point tensor in a checkpoint as float16; everything else as it was."""
    if isinstance(obj, torch.Tensor):
        return obj.half() if obj.is_floating_point() else obj
    if isinstance(obj, dict):
        return {k: rounded(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(rounded(v) for v in obj)
    return obj


def ship(source: Path, target: Path) -> None:
    if source.suffix != ".pt":
        shutil.copyfile(source, target)
        return
    save_torch(rounded(torch.load(source, map_location="cpu", weights_only=True)), target)


def world_entry(src: str, dst: str, world: str, cfg: dict, commit: str) -> dict:
    """Ship one world's files; its manifest entry says how they were made, so one world can be retrained alone."""
    (Path(dst) / world).mkdir(parents=True, exist_ok=True)
    sha = {}
    for name in FILES[world]:
        target = Path(dst) / world / name
        ship(Path(src) / "toy" / world / "models" / name, target)
        sha[name] = sha256_file(target)
    outputs = " ".join(f"{src}/toy/{world}/models/{name}" for name in FILES[world] if name.endswith(".pt"))
    return {
        "command": ".venv/bin/snakemake --cores 2 --config toy='{\"checkpoints\": \"train\"}' outdir=" + src
        + f" -- {outputs}; python workflow/scripts/ship_toy.py {src} {dst} {world}",
        "config_toy": cfg["toy"], "seed": cfg["seed"], "git_commit": commit, "sha256": sha,
    }


def part_update(src: str, dst: str, world: str, part: str, entry: dict, cfg: dict, commit: str) -> dict:
    """Ship one model's files into an existing world entry: new checksums, and an `updates` record of how they were
    made (with toy.checkpoints as configured: shipped means on the shipped upstream models)."""
    (Path(dst) / world).mkdir(parents=True, exist_ok=True)
    sha = dict(entry.get("sha256", {}))
    for name in PARTS[part]:
        target = Path(dst) / world / name
        ship(Path(src) / "toy" / world / "models" / name, target)
        sha[name] = sha256_file(target)
    outputs = " ".join(f"{src}/toy/{world}/models/{name}" for name in PARTS[part] if name.endswith(".pt"))
    update = {"files": PARTS[part], "command": f".venv/bin/snakemake --cores 2 --config outdir={src} -- {outputs}; "
              f"python workflow/scripts/ship_toy.py {src} {dst} {world} --only {part}",
              "checkpoints": cfg["toy"]["checkpoints"], "config_toy_" + part: cfg["toy"].get(part, {}),
              "seed": cfg["seed"], "git_commit": commit}
    updates = [u for u in entry.get("updates", []) if u.get("files") != PARTS[part]] + [update]
    return {**entry, "sha256": dict(sorted(sha.items())), "updates": updates}


def main(src: str, dst: str, *worlds: str) -> None:
    only = None
    if "--only" in worlds:
        at = worlds.index("--only")
        only, worlds = (worlds[at + 1] if at + 1 < len(worlds) else None), worlds[:at] + worlds[at + 2:]
        if only not in PARTS or len(worlds) != 1:
            sys.exit(f"ship_toy.py: --only takes one of {sorted(PARTS)} and exactly one world, e.g. default --only "
                     "classifier")
    worlds = worlds or tuple(FILES)
    if unknown := set(worlds) - set(FILES):
        sys.exit(f"ship_toy.py: unknown world(s) {sorted(unknown)}; choose from {sorted(FILES)}")
    names = {w: PARTS[only] if only else FILES[w] for w in worlds}
    missing = next((f"{src}/toy/{w}/models/{n}" for w in worlds for n in names[w]
                    if not (Path(src) / "toy" / w / "models" / n).is_file()), None)
    if missing:
        sys.exit(f"ship_toy.py: {missing} does not exist; train it first (see the command in the docstring)")
    root = Path(__file__).resolve().parents[2]
    cfg = validate_config(yaml.safe_load((root / "config" / "config.yaml").read_text()))
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=root).stdout.strip()
    manifest_path = Path(dst) / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    entries = manifest.get("worlds", {})
    if only and worlds[0] not in entries:
        sys.exit(f"ship_toy.py: {manifest_path} has no {worlds[0]} entry to add {only} to; ship the whole world")
    for world in worlds:
        entries[world] = (part_update(src, dst, world, only, entries[world], cfg, commit) if only
                          else world_entry(src, dst, world, cfg, commit))
    write_json(manifest_path, {"weights": "float16 (rounded by ship_toy.py)", "worlds": entries})
    print(f"shipped {sum(len(names[w]) for w in worlds)} files of {', '.join(worlds)} to {dst}")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: python workflow/scripts/ship_toy.py <train outdir> models/toy [default] [clean] "
                 "[--only classifier|drafter]")
    main(*sys.argv[1:])
