# Config validation (before any job starts), paths, and the input functions shared by the rule files.
import json
import shlex
import sys
from pathlib import Path

from lantern.config import expand_methods, validate_config
from lantern.errors import UserError


def validate(cfg):
    """Validate and fill defaults in place; a bad config stops the run with one line naming the key."""
    try:
        checked = validate_config(cfg)
    except UserError as e:
        sys.exit(f"error: {e}")
    cfg.clear()
    cfg.update(checked)


validate(config)
OUT = config["outdir"]
TOY = config["world"] == "toy"
TRAIN_TOY = TOY and config["toy"]["checkpoints"] == "train"
SHIPPED = Path(workflow.basedir) / "models" / "toy"
WORLDS = ["default", "clean"] if TOY and config["toy"]["clean_world"] else ["default"]
POINTS = expand_methods(config)
MODES = config["sweep"]["modes"]
SHARDS = range(config["sweep"]["shards"])
# The noise-free control world: the same shapes, no gradient, texture or pixel noise.
CLEAN_WORLD = {"background_gradient": False, "texture_amplitude": 0.0, "noise_sigma": 0.0}
# Rules call the CLI through the interpreter running Snakemake, so no virtualenv needs activating in jobs.
LANTERN = f"{sys.executable} -m lantern"
# GPU jobs take a free device through this wrapper; it passes commands through on CPU machines and under SLURM.
GPU_RUN = f"{sys.executable} {workflow.basedir}/workflow/profiles/local-gpu/gpu_run.py"


wildcard_constraints:
    mode="|".join(MODES),
    point="|".join(sorted(POINTS)) or "none",
    world="default|clean",
    split="train|val",
    shard=r"\d+",


def as_arg(obj):
    """A JSON value as one shell-quoted argument (for --params / --method)."""
    return shlex.quote(json.dumps(obj, sort_keys=True))


def data_params(world):
    base = {k: v for k, v in config["toy"]["data"].items() if k not in ("n_train", "n_val")}
    return {**base, **CLEAN_WORLD} if world == "clean" else base


def toy_model(world, name):
    if TRAIN_TOY:
        return f"{OUT}/toy/{world}/models/{name}.pt"
    return str(SHIPPED / world / f"{name}.pt")


def target_ckpt():
    return toy_model("default", "target") if TOY else config["llamagen"]["gpt_ckpt"]


def vq_ckpt():
    return toy_model("default", "vq") if TOY else config["llamagen"]["vq_ckpt"]


def drafter_ckpt():
    return toy_model("default", "drafter") if TOY else config["llamagen"]["drafter_ckpt"]


def threads_arg(threads):
    return config["threads"] or threads


def all_outputs():
    outputs = [f"{OUT}/tables/summary.md"] + figure_outputs()
    if TOY:
        outputs += expand(f"{OUT}/toy/{{world}}/ambiguity.csv", world=WORLDS)
    return outputs
