# Config validation (before any job starts), paths, and the input functions shared by the rule files.
import json
import shlex
import sys
from pathlib import Path

from lantern.pipeline.config import (chameleon_pixels, data_params, drafter_source, evaluate_params, expand_methods,
                                     latency_counts, mode_shard_ranges, shard_alignment, shard_ranges,
                                     target_extra_images, target_params, target_source, target_spec, validate_config,
                                     vq_params)
from lantern.engine.methods import (decoder_spec, mode_points, needs_drafter, needs_neighbours, relaxation_axes,
                                   speculative)
from lantern.errors import UserError
from lantern.pipeline.cli import SHELL_PREFIX
from lantern.pipeline.verify import check_before_jobs


def validate(cfg):
    """Validate and fill defaults in place; a bad config stops the run with one line naming the key."""
    try:
        checked = validate_config(cfg)
    except UserError as e:
        sys.exit(f"error: {e}")
    cfg.clear()
    cfg.update(checked)


def as_arg(obj):
    """A JSON value as one shell-quoted argument (for --params / --method)."""
    return shlex.quote(json.dumps(obj, sort_keys=True))


# `--cores 0` plans jobs that never start (Snakemake then waits forever): say so before anything is planned.
if getattr(workflow, "_cores", None) == 0:
    sys.exit("error: --cores 0 gives jobs no core to run on, so nothing would ever start; use --cores N (N >= 1) "
             "or --cores all")
validate(config)
OUT = config["outdir"]
TOY = config["world"] == "toy"
CHAMELEON = config["world"] == "chameleon"  # Anole / Lumina-mGPT from their released files (chameleon.smk)
TRAIN_TOY = TOY and config["toy"]["checkpoints"] == "train"
SHIPPED = Path(workflow.basedir) / "models" / "toy"
WORLDS = ["default", "clean"] if TOY and config["toy"]["clean_world"] else ["default"]
POINTS = expand_methods(config)
MODES = config["sweep"]["modes"]
SHARDS = range(config["sweep"]["shards"])
# Rules call the `lantern` console scripts. When no environment providing them is active (`.venv/bin/snakemake`
# run directly), jobs find them beside the interpreter running Snakemake: appended, so an activated environment or
# a rule's conda environment (--use-conda) comes first.
# SHELL_PREFIX keeps Snakemake's stderr open for a job's one-line error, which then shows even when the job's log
# (its stdout and stderr) lies on a full disk.
shell.prefix(f'set -euo pipefail; export PATH="$PATH:{Path(sys.executable).parent}"; {SHELL_PREFIX}')


wildcard_constraints:
    mode="|".join(MODES),
    point="|".join(sorted(POINTS)) or "none",
    world="default|clean",
    split="train|val|extra",
    shard=r"\d+",


def split_range(world, split):
    """(first index, count) of a toy data split: train, then val, then the target's extra images."""
    n_train, n_val = config["toy"]["data"]["n_train"], config["toy"]["data"]["n_val"]
    return {"train": (0, n_train), "val": (n_train, n_val),
            "extra": (n_train + n_val, target_extra_images(config, world))}[split]


def target_splits(world):
    return ["train", "extra"] if target_extra_images(config, world) else ["train"]


def toy_model(world, name):
    if TRAIN_TOY:
        return f"{OUT}/toy/{world}/models/{name}.pt"
    return str(SHIPPED / world / f"{name}.pt")


LLAMAGEN = config["llamagen"]
T2I = config["world"] == "llamagen" and LLAMAGEN["model_type"] == "t2i"
# Every job that loads the llamagen target gets the config's view of it, checked against the file's tensors.
SPEC_ARG = "" if TOY or CHAMELEON else f"--target-spec {as_arg(target_spec(config))}"
IN_JOB_ARG = (f"--in-job-vanilla --in-job-vanilla-every {config['sweep']['in_job_vanilla_every']}"
              if config["sweep"]["in_job_vanilla"] else "")


def target_ckpt():
    if CHAMELEON:
        return CH["target"]
    if TOY:
        return toy_model("default", "target")
    # the LANTERN authors' HF-format folder is converted by the convert_target rule
    return f"{OUT}/llamagen/target/converted.pt" if target_source(config) == "authors" else LLAMAGEN["gpt_ckpt"]


def vq_ckpt():
    if CHAMELEON:
        return CH["vqgan_ckpt"]
    return toy_model("default", "vq") if TOY else LLAMAGEN["vq_ckpt"]


def drafter_ckpt():
    if CHAMELEON:
        return CH["drafter"]
    if TOY:
        return toy_model("default", "drafter")
    source = drafter_source(config)
    if source == "file":
        return LLAMAGEN["drafter_ckpt"]
    return f"{OUT}/llamagen/drafter/{'converted' if source == 'authors' else 'trained'}.pt"


def threads_arg(threads):
    return config["threads"] or threads


def all_outputs():
    outputs = [f"{OUT}/tables/summary.md"] + figure_outputs()
    if TOY:
        outputs += expand(f"{OUT}/toy/{{world}}/ambiguity.csv", world=WORLDS)
    return outputs + proximity_outputs()  # proximity.smk


# --- generation (generate.smk) ---


def neighbours_table():
    return f"{OUT}/neighbours/{config['neighbours']['metric']}_K{config['neighbours']['max_k']}.pt"


def generate_inputs(wildcards):
    method = POINTS[wildcards.point]
    inputs = {"target": target_ckpt(), "vq": vq_ckpt()}
    if needs_drafter(method):
        inputs["drafter"] = drafter_ckpt()
    if needs_neighbours(method):
        inputs["neighbours"] = neighbours_table()
    if T2I:
        inputs["captions"] = f"{OUT}/llamagen/captions/shard{wildcards.shard}.pt"
    if CHAMELEON:
        inputs.update(prompts=f"{OUT}/chameleon/prompts.csv", tokenizer=CH["tokenizer"], vqgan_yaml=VQGAN_YAML)
    return inputs


def shard_range(shard, mode=None):
    """Contiguous, index-aligned slices: shard j of S ends near (j+1)*n/S, on a multiple of every batch size; a mode
    with fewer images (sweep.mode_images) takes the first of each (lantern.pipeline.config.mode_shard_ranges)."""
    sweep = config["sweep"]
    if mode is not None:
        return mode_shard_ranges(sweep, mode)[int(shard)]
    return shard_ranges(sweep["n_images"], sweep["shards"], shard_alignment(sweep))[int(shard)]


def optional(flag, inputs, key):
    return f"{flag} {shlex.quote(inputs[key])}" if key in inputs.keys() else ""


# --- metrics (metrics.smk) ---


def clip_ckpt():
    return toy_model("default", "clip") if config["metrics"]["clip_model"] == "toy" else config["metrics"]["clip_ckpt"]


def classifier_ckpt():
    """The class-accuracy classifier: the toy world's; none on llamagen (its columns stay absent)."""
    return toy_model("default", "classifier") if TOY else ""


def classifier_input():
    return [classifier_ckpt()] if classifier_ckpt() else []


def reference_images():
    return f"{OUT}/toy/default/data/val.pt" if TOY else config["metrics"]["reference"]


# --- figures (figures.smk) ---

STYLE = f"{workflow.basedir}/src/lantern/figures/lantern.mplstyle"
HAS_LANTERN = any("delta" in relaxation_axes(p["name"]) for p in POINTS.values())  # the figures' default x axis
HAS_TREES = any(p.get("drafting") in ("static", "dynamic") for p in POINTS.values())
HAS_DRAFTS = any(speculative(p) for p in POINTS.values())
TABLE_FIGURES = ["tradeoff"] + ["tau_vs_delta", "heatmap"] * HAS_LANTERN + ["tree_depth", "tree_budget"] * HAS_TREES
TABLE_FIGURES += ["acceptance_map"] * HAS_DRAFTS + ["round_anatomy"]  # every point has rounds, plain AR's are tokens


def figure_outputs():
    figures = [f"{OUT}/figures/{name}.png" for name in TABLE_FIGURES]
    figures += expand(f"{OUT}/figures/samples_{{mode}}.png", mode=MODES)
    if TOY:
        figures.append(f"{OUT}/figures/ambiguity.png")
    return figures


# --- the llamagen world (llamagen.smk) ---

DRAFTER = LLAMAGEN["drafter"]
DRAFTER_SHARDS = range(DRAFTER["shards"])
CAPTIONED = DRAFTER["layout"] == "captions"
T5 = LLAMAGEN["t5"]
T5_SOURCE = f"--t5 {shlex.quote(T5['path'])} --dtype {T5['dtype']}" if T5["path"] else f"--features {shlex.quote(T5['features'])}"


def prompt_source():
    prompts = LLAMAGEN["prompts"]
    return f"--file {shlex.quote(prompts['file'])}" if prompts["file"] else f"--coco {shlex.quote(prompts['coco_captions'])}"


def drafter_shard_range(shard):
    n, S = DRAFTER["n_images"], DRAFTER["shards"]
    return int(shard) * n // S, (int(shard) + 1) * n // S


def drafter_training_inputs(wildcards):
    inputs = {"target": target_ckpt(), "tokens": expand(f"{OUT}/llamagen/drafter/data/shard{{j}}.pt", j=DRAFTER_SHARDS)}
    if T2I:
        inputs["features"] = expand(f"{OUT}/llamagen/drafter/data/features{{j}}.pt", j=DRAFTER_SHARDS)
    return inputs


# --- the Chameleon-family world (chameleon.smk) ---

CH = config["chameleon"]
VQGAN_YAML = CH["vqgan_yaml"] or (str(Path(CH["vqgan_ckpt"]).with_name("vqgan.yaml")) if CH["vqgan_ckpt"] else "")
# every generate job of a Chameleon world: the family, its tokenizer and VQGAN config, its pixels and prompt slots
CHAMELEON_ARG = (f"--family {CH['family']} --tokenizer {shlex.quote(CH['tokenizer'])} --vqgan-yaml "
                 f"{shlex.quote(VQGAN_YAML)} --pixels {chameleon_pixels(config)} --prompt-tokens {CH['prompt_tokens']}"
                 if CHAMELEON else "")


def chameleon_prompt_source():
    prompts = CH["prompts"]
    for key, flag in (("coco_captions", "--coco"), ("caption_list", "--caption-list"), ("tsv", "--tsv")):
        if prompts.get(key):
            return f"{flag} {shlex.quote(prompts[key])}"
    return "--sjd"


# --- the latent-proximity check (proximity.smk) ---

PROXIMITY = config["proximity"]
PROXIMITY_NAMES = [f"toy-{w}" for w in WORLDS] if TOY else [CH["family"]] if CHAMELEON else ["llamagen"]
# the sweep's own table when it holds every rank, else one with enough columns (the same rules build either)
PROXIMITY_K = max([config["neighbours"]["max_k"]] + [m for m in PROXIMITY["ranks"] if m != "random"])
PROXIMITY_FIDELITY = evaluate_params(config, clip_ckpt())["fidelity"]


def proximity_outputs():
    if not PROXIMITY["enabled"]:
        return []
    return expand(f"{OUT}/proximity/{{name}}.csv", name=PROXIMITY_NAMES) + [f"{OUT}/figures/proximity.png"]


def mode_shards(modes=MODES):
    """Every generation folder of the given modes; greedy runs no control point (lantern.engine.methods.mode_points)."""
    return [f"{OUT}/gen/{m}/{p}/shard{j}" for m in modes for p in sorted(mode_points(POINTS, m)) for j in SHARDS]


def mode_metrics():
    return [f"{OUT}/metrics/{m}/{p}.json" for m in MODES for p in sorted(mode_points(POINTS, m))]


def proximity_token_shards():
    """The vanilla point's shards (sampling mode when swept), else the first point's: their stats.csv hold tokens."""
    point = "vanilla" if "vanilla" in POINTS else next(iter(POINTS))
    mode = "sampling" if "sampling" in MODES else MODES[0]
    return expand(f"{OUT}/gen/{mode}/{point}/shard{{j}}", j=SHARDS)


def proximity_inputs(wildcards):
    metric = config["neighbours"]["metric"]
    if not TOY:  # llamagen or a Chameleon family: the sweep's VQ and table, the vanilla point's tokens
        inputs = {"vq": vq_ckpt(), "neighbours": f"{OUT}/neighbours/{metric}_K{PROXIMITY_K}.pt",
                  "tokens": proximity_token_shards(), **({"yaml": VQGAN_YAML} if CHAMELEON else {})}
    else:
        world = wildcards.name.removeprefix("toy-")
        table = (f"{OUT}/neighbours/{metric}_K{PROXIMITY_K}.pt" if world == "default"
                 else f"{OUT}/toy/{world}/neighbours/{metric}_K{PROXIMITY_K}.pt")
        inputs = {"vq": toy_model(world, "vq"), "neighbours": table, "tokens": f"{OUT}/toy/{world}/data/val_tokens.pt"}
        if world == "default" and classifier_ckpt():  # the class-accuracy CNN knows the default world's images
            inputs["classifier"] = classifier_ckpt()
    if PROXIMITY_FIDELITY["weights_path"]:
        inputs["extractor"] = PROXIMITY_FIDELITY["weights_path"]
    return inputs


def proximity_tokens(wildcards, input):
    if not TOY:
        return " ".join(shlex.quote(f"{shard}/stats.csv") for shard in input.tokens)
    return shlex.quote(input.tokens)


# --- before the first job: the results already there (lantern.pipeline.verify) ---
# Snakemake reads this file before it builds the DAG: existing shards, metrics files and tables are checked against
# their records here, a damaged one is set aside (moved to {OUT}/damaged/) and what read a damaged or missing one is
# marked out of date, so this same command redraws and recomputes them; damaged PNGs of a shard whose manifest and
# stats.csv are sound are first redrawn from their tokens, and kept when they hold their recorded sha256. Dry runs, --lint, --unlock and the like
# check nothing; LANTERN_VERIFY=digests hashes every file instead of the fast path on sizes and times.
check_before_jobs(
    workflow,
    OUT,
    {f"{OUT}/metrics/{m}/{p}.json": [f"{OUT}/gen/{m}/{p}/shard{j}" for j in SHARDS]
     for m in MODES for p in sorted(mode_points(POINTS, m))},
    f"{OUT}/tables",
    "" if CHAMELEON else vq_ckpt(),  # a Chameleon shard is restored through the VQGAN its manifest records
    threads_arg(1),  # the generate rule's
)
