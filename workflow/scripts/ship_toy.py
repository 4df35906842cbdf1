"""Copy toy-world checkpoints trained by the pipeline (toy.checkpoints: train) into models/toy/, with a manifest.

    python workflow/scripts/ship_toy.py <train outdir> models/toy

The manifest records the command that trained them, the resolved toy config, the seed, the git commit and the
SHA-256 of every file, so the shipped files can be checked against a retraining. Weights are stored rounded to
float16 (halves the repository's size; every loader casts them back to the model's dtype): a retraining
reproduces the shipped files after the same rounding.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import torch
import yaml

from lantern.config import validate_config
from lantern.io import save_torch, sha256_file, write_json

FILES = {
    "default": ["vq.pt", "vq.json", "target.pt", "target.json", "drafter.pt", "clip.pt", "clip.json", "clip.metrics.json"],
    "clean": ["vq.pt", "vq.json", "target.pt", "target.json"],
}


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


def main(src: str, dst: str) -> None:
    root = Path(__file__).resolve().parents[2]
    cfg = validate_config(yaml.safe_load((root / "config" / "config.yaml").read_text()))
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=root).stdout.strip()
    files = {}
    for world, names in FILES.items():
        (Path(dst) / world).mkdir(parents=True, exist_ok=True)
        for name in names:
            source = Path(src) / "toy" / world / "models" / name
            target = Path(dst) / world / name
            ship(source, target)
            files[f"{world}/{name}"] = sha256_file(target)
    write_json(Path(dst) / "MANIFEST.json", {
        "command": ".venv/bin/snakemake --cores 2 --config toy='{\"checkpoints\": \"train\"}' outdir=" + src
        + " --until train_drafter train_clip ambiguity; python workflow/scripts/ship_toy.py " + f"{src} {dst}",
        "config_toy": cfg["toy"], "seed": cfg["seed"], "git_commit": commit, "weights": "float16 (rounded by ship_toy.py)",
        "sha256": files,
    })
    print(f"shipped {len(files)} files to {dst}")


if __name__ == "__main__":
    main(*sys.argv[1:])
