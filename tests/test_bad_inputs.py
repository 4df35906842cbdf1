"""Every user mistake stops before any work with one line naming the key or file and the fix (issue #17).

Tables of mistakes, each case asserting the exit code, one line on stderr, no traceback and no output:
- CONFIGS and the llamagen file cases (file_configs): bad config values and files, each through a real
  `lantern check-config` process, and the SNAKEMAKE_TOO subset (one or more per validation layer) also through
  `snakemake -n`, which runs the same validation at parse time and must print the same line;
- CONFIG_FILE_CASES: broken config files and --config overrides, through `lantern check-config` (Snakemake reads
  --configfile itself, before the Snakefile, and words those errors its own way);
- FILE_CASES: bad checkpoints, tables, images, prompts and arguments, through the `lantern` subcommand that reads
  them (in-process: `lantern.pipeline.cli.main`)."""
import argparse
import errno
import io
import json
import os
import pickle
import re
import struct
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from lantern.engine.models.drafter import FORMAT as DRAFTER_FORMAT
from lantern.engine.rules.neighbours import FORMAT as NEIGHBOURS_FORMAT, NeighbourParams, build_table, read_codebook
from lantern.pipeline.cli import main as cli
from llamagen_world import GPT_SIZE, write_authors_drafter, write_gpt

REPO = Path(__file__).resolve().parents[1]
TOY = REPO / "models" / "toy" / "default"
# the default run's values that some messages quote (read, so that a new toy world or sweep size needs no edit here)
N_IMAGES = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["sweep"]["n_images"]
TOY_CODES = json.loads((TOY / "vq.json").read_text())["params"]["codebook_size"]
HANG_GUARD_S = 3600  # only catches a hang; a slow or busy machine never reaches it


def lantern_entry(**kw):
    return {"sweep": {"methods": [{"name": "lantern", "drafting": "chain", "gamma": 4, "delta": 0.1, "k": 5, **kw}]}}


def method(**m):
    return {"sweep": {"methods": [m]}}


# (case id, override config, regex the one error line must match)
CONFIGS = [
    ("delta-above-1", lantern_entry(delta=1.5), r"sweep\.methods\[0\]\.delta = 1\.5 exceeds 1"),
    ("delta-nan", lantern_entry(delta=float("nan")), r"delta = nan must be a finite number"),
    ("delta-negative", lantern_entry(delta=-0.1), r"delta = -0\.1 must be >= 0"),
    ("gamma-float", lantern_entry(gamma=4.0), r"gamma = 4\.0 must be an integer; write 4"),
    ("k-float", lantern_entry(k=10.0), r"k = 10\.0 must be an integer"),
    ("coupling-unknown", method(name="exact", drafting="jacobi", coupling="maximum"),
     r"sweep\.methods\[0\]\.coupling = 'maximum' is not allowed; use one of independent, maximal, gumbel"),
    ("coupling-on-a-chain", method(name="exact", drafting="chain", coupling="maximal"),
     r"sweep\.methods\[0\]\.coupling does not apply to exact with chain drafting"),
    ("proactive-depth-past-window", method(name="exact", drafting="jacobi", window=2, proactive=4, proactive_depth=3),
     r"sweep\.methods\[0\]\.proactive_depth = 3 exceeds window = 2: the tree's levels are window positions"),
    ("k-inf", lantern_entry(k=float("inf")), r"k = inf must be a finite number"),
    ("k-above-max-k", lantern_entry(k=1000), r"k = 1000 is larger than neighbours\.max_k"),
    ("lam-one", method(name="lanternpp", lam=1, k=5), r"lam = 1 must be > 1"),
    ("lam-on-lantern", lantern_entry(lam=2), r"\.lam does not apply to lantern"),
    ("delta-on-lanternpp", method(name="lanternpp", lam=2, k=5, delta=0.1), r"\.delta does not apply to lanternpp"),
    ("delta-on-exact", method(name="exact", delta=0.1), r"\.delta does not apply to exact"),
    ("k-on-exact", method(name="exact", k=5), r"\.k does not apply to exact"),
    ("lanterntv-k-above-max-k", method(name="lanterntv", delta=0.1, k=1000), r"k = 1000 is larger than neighbours\.max_k"),
    ("coolsd-scale-zero", method(name="coolsd", scale=0), r"scale = 0 must be > 0"),
    ("coolsd-k", method(name="coolsd", scale=2, k=5), r"\.k does not apply to coolsd"),
    ("gsd-group-zero", method(name="gsd", group=0, k=5), r"group = 0 must be >= 1"),
    ("gsd-gap-above-1", method(name="gsd", k=5, gap=1.5), r"gap = 1\.5 exceeds 1"),
    ("gamma-on-dynamic", method(name="exact", drafting="dynamic", gamma=4), r"\.gamma does not apply to exact with dynamic"),
    ("total-tokens-on-chain", method(name="exact", total_tokens=30), r"\.total_tokens does not apply to exact with chain"),
    ("tree-on-chain", method(name="exact", tree="chain"), r"\.tree does not apply to exact with chain"),
    ("drafting-on-vanilla", method(name="vanilla", drafting="chain"), r"\.drafting does not apply to vanilla"),
    ("unknown-method", method(name="medusa"), r"\.name = 'medusa' is not a method"),
    ("unknown-drafting", method(name="exact", drafting="zigzag"), r"\.drafting = 'zigzag' is not allowed"),
    ("tree-rank-gap", method(name="exact", drafting="static", tree=[[0], [2]]), r"\.tree: .*skips rank 1"),
    ("tree-rank-10", method(name="exact", drafting="static", tree=[[r] for r in range(11)]), r"ranks must be < 10"),
    ("tree-unknown-name", method(name="exact", drafting="static", tree="bushy"), r"\.tree = 'bushy' is not a static tree"),
    ("same-point-twice", {"sweep": {"methods": [{"name": "exact"}, {"name": "exact", "gamma": 4}]}},
     r"sweep\.methods\[1\] repeats the point exact-chain-g4"),
    ("same-method-listed-twice", {"sweep": {"methods": [{"name": "vanilla"}, {"name": "vanilla"}]}},
     r"sweep\.methods\[1\] repeats the point vanilla"),
    ("delta-grid-item-above-1", lantern_entry(delta=[0.1, 2.0]), r"delta.* 2\.0 exceeds 1"),
    ("residual-unknown", lantern_entry(residual="loose"), r"\.residual = 'loose' is not allowed"),
    ("lantern-without-k", {"sweep": {"methods": [{"name": "lantern", "delta": 0.1}]}}, r"needs k"),
    ("dynamic-depth-0", method(name="exact", drafting="dynamic", depth=0), r"\.depth = 0 must be >= 1"),
    ("method-not-a-mapping", {"sweep": {"methods": ["lantern"]}}, r"sweep\.methods\[0\] = 'lantern' has the wrong type"),
    ("methods-empty", {"sweep": {"methods": []}}, r"sweep\.methods is empty"),
    ("modes-empty", {"sweep": {"modes": []}}, r"sweep\.modes is empty"),
    ("mode-twice", {"sweep": {"modes": ["greedy", "greedy"]}}, r"sweep\.modes lists greedy twice"),
    ("mode-unknown", {"sweep": {"modes": ["beam"]}}, r"sweep\.modes\[0\] = 'beam' is not allowed"),
    ("shards-above-images", {"sweep": {"n_images": 2, "shards": 3}}, r"sweep\.shards = 3 is more than sweep\.n_images"),
    ("n-images-negative", {"sweep": {"n_images": -5}}, r"sweep\.n_images"),
    ("n-images-string", {"sweep": {"n_images": "many"}}, r"sweep\.n_images = 'many' has the wrong type"),
    ("n-images-float", {"sweep": {"n_images": 10.0}}, r"sweep\.n_images = 10\.0 must be an integer; write 10"),
    ("shards-zero", {"sweep": {"shards": 0}}, r"sweep\.shards"),
    ("max-k-float", {"neighbours": {"max_k": 50.0}}, r"neighbours\.max_k = 50\.0 must be an integer; write 50"),
    ("seed-float", {"seed": 1.5}, r"seed = 1\.5 has the wrong type"),
    ("sampling-not-a-mapping", {"sampling": [1, 2]}, r"sampling = \[1, 2\] has the wrong type"),
    ("unknown-top-key", {"sweeps": {}}, r"unknown key sweeps"),
    ("unknown-nested-key", {"sweep": {"n_image": 3}}, r"unknown key sweep\.n_image"),
    ("max-k-beyond-codebook", {"neighbours": {"max_k": TOY_CODES + 88}},
     rf"neighbours\.max_k = {TOY_CODES + 88} exceeds the codebook"),
    ("device-unknown", {"device": "gpu"}, r"device"),
    ("seed-string", {"seed": "x"}, r"seed = 'x' has the wrong type"),
    ("bootstrap-one", {"metrics": {"bootstrap": 1}}, r"metrics\.bootstrap = 1 gives no spread"),
    ("batch-size-zero", {"sweep": {"batch_size": {"sampling": 0}}}, r"sweep\.batch_size\.sampling"),
    ("compile-word", {"compile": "yes"}, r"compile = 'yes'"),
    ("latency-images-negative", {"sweep": {"latency_images": -1}}, r"sweep\.latency_images"),
    ("in-job-vanilla-every-zero", {"sweep": {"in_job_vanilla_every": 0}}, r"sweep\.in_job_vanilla_every"),
    ("batch-size-unknown-mode", {"sweep": {"batch_size": {"beam": 4}}}, r"unknown key sweep\.batch_size\.beam"),
    ("method-modes-unknown", {"sweep": {"methods": [{"name": "vanilla"}, {"name": "exact", "modes": ["beam"]}]}},
     r"sweep\.methods\[1\]\.modes = \['beam'\] must be a non-empty list of decoding modes"),
    ("vanilla-left-out-of-greedy", {"sweep": {"methods": [{"name": "vanilla", "modes": ["sampling"]},
                                                         {"name": "exact"}]}}, r"vanilla's modes leave greedy out"),
    ("shards-beyond-batches", {"sweep": {"n_images": 16, "shards": 4, "batch_size": {"sampling": 8}}},
     r"leaves a shard without images"),
    ("bootstrap-negative", {"metrics": {"bootstrap": -3}}, r"metrics\.bootstrap"),
    ("inception-without-weights", {"metrics": {"fid_extractor": "inception-v3-compat"}},
     r"metrics\.inception_weights is empty"),
    ("llamagen-missing-gpt", {"world": "llamagen", "llamagen": {"gpt_ckpt": "/nope/c2i_L_256.pt"}},
     r"llamagen\.gpt_ckpt = /nope/c2i_L_256\.pt does not exist"),
    ("llamagen-missing-vq", {"world": "llamagen", "llamagen": {"gpt_ckpt": str(TOY / "target.pt"),
                                                                "vq_ckpt": "/nope/vq_ds16_c2i.pt"}},
     r"llamagen\.vq_ckpt = /nope/vq_ds16_c2i\.pt does not exist"),
    ("llamagen-image-size", {"world": "llamagen", "llamagen": {"image_size": 250}},
     r"llamagen\.image_size = 250 is not allowed; use one of"),
    # outdir: empty, the filesystem root, an existing file, or a path through one (issue #30)
    ("outdir-empty", {"outdir": ""}, r"config: outdir is empty; set it to the folder"),
    ("outdir-blank", {"outdir": "  "}, r"config: outdir is empty"),
    ("outdir-root", {"outdir": "/"}, r"config: outdir = / is the filesystem root"),
    ("outdir-root-spelt-otherwise", {"outdir": "/tmp/.."}, r"config: outdir = /tmp/\.\. is the filesystem root"),
    ("outdir-is-a-file", {"outdir": str(REPO / "config" / "config.yaml")}, r"config\.yaml is an existing file, not a folder"),
    ("outdir-inside-a-file", {"outdir": str(REPO / "config" / "config.yaml" / "results")},
     r"outdir = .*config\.yaml/results lies inside the existing file .*config\.yaml"),
    # YAML spelling in an enum's answer: true / false, never Python's True / False
    ("compile-number", {"compile": 1}, r"compile = 1 is not allowed; use one of auto, true, false$"),
    ("compile-python-word", {"compile": "True"}, r"compile = 'True' is not allowed; use one of auto, true, false$"),
    ("mode-images-below-shards", {"sweep": {"n_images": 16, "shards": 4, "batch_size": {"sampling": 1, "greedy": 1},
                                            "mode_images": {"sampling": 2}}},
     r"sweep\.mode_images\.sampling = 2 is fewer than sweep\.shards \(4\)"),
]


def text_file(path: Path) -> str:
    path.write_text("this is not a checkpoint\n")
    return str(path)


@pytest.fixture(scope="module")
def llamagen_files(tmp_path_factory) -> dict[str, str]:
    """A small upstream-layout c2i GPT (vocab 16384, 16 x 16 tokens, 10 classes; tests/llamagen_world.py), a VQ
    file holding only a 16384-code codebook (all a config check reads of it), and a drafter file for that GPT."""
    root = tmp_path_factory.mktemp("llamagen")
    write_gpt(root / "c2i.pt", "c2i")
    torch.save({"model": {"quantize.embedding.weight": torch.randn(16384, 8)}}, root / "vq.pt")
    args = {"dim": GPT_SIZE["dim"], "vocab_size": 16384, "model_type": "c2i", "cls_token_num": 1, "image_tokens": 256}
    torch.save({"format": DRAFTER_FORMAT, "target_args": args, "drafter": {}, "options": {}}, root / "drafter.pt")
    return {"gpt_ckpt": str(root / "c2i.pt"), "vq_ckpt": str(root / "vq.pt"), "drafter_ckpt": str(root / "drafter.pt"),
            "gpt_size": GPT_SIZE, "num_classes": 10}


def file_configs(tmp: Path, lg: dict) -> list:
    """Cases that need files on disk: text files named .pt as the checkpoints the config reads, the VQ where the
    GPT goes, a target that disagrees with its llamagen keys or its VQ, a drafter for another target, and t2i runs
    without their prompts or T5. `lg` is a llamagen c2i world that passes (test_the_llamagen_files_pass)."""
    fake = text_file(tmp / "text.pt")
    vq = str(tmp / "vq512.pt")  # a codebook of 512 codes, no encoder (so no downsampling to disagree on)
    torch.save({"model": {"quantize.embedding.weight": torch.randn(512, 8)}}, vq)
    ok = {"reference": str(tmp), "resolution": 256, "class_names": "imagenet"}
    t2i = {"model_type": "t2i", "gpt_ckpt": fake, "vq_ckpt": fake}
    prompts = tmp / "prompts.csv"
    prompts.write_text("id,caption\n1,a cat\n")
    return [
        ("llamagen-text-vq", {"world": "llamagen", "llamagen": {"gpt_ckpt": fake, "vq_ckpt": fake, "drafter_ckpt": fake},
                              "metrics": ok},
         r"llamagen\.vq_ckpt: checkpoint .*text\.pt is unreadable: not a torch file"),
        ("llamagen-gpt-as-vq", {"world": "llamagen", "llamagen": {**lg, "vq_ckpt": lg["gpt_ckpt"]}, "metrics": ok},
         r"llamagen\.vq_ckpt: .*c2i\.pt has no quantize\.embedding\.weight; pass a VQ"),
        ("llamagen-text-gpt", {"world": "llamagen", "llamagen": {**lg, "gpt_ckpt": fake}, "metrics": ok},
         r"llamagen\.gpt_ckpt: checkpoint .*text\.pt is unreadable: not a torch file"),
        ("llamagen-empty-gpt", {"world": "llamagen", "llamagen": {**lg, "gpt_ckpt": str(Path(empty_file(tmp)))},
                                "metrics": ok}, r"llamagen\.gpt_ckpt: checkpoint .*empty\.pt is unreadable"),
        ("llamagen-vq-as-gpt", {"world": "llamagen", "llamagen": {**lg, "gpt_ckpt": lg["vq_ckpt"]}, "metrics": ok},
         r"llamagen\.gpt_ckpt: checkpoint .*vq\.pt is a VQ tokenizer, not a LlamaGen GPT; give it as llamagen\.vq_ckpt"),
        ("llamagen-gpt-other-size", {"world": "llamagen", "llamagen": {**lg, "gpt_size": "GPT-L"}, "metrics": ok},
         r"llamagen\.gpt_ckpt: checkpoint .*c2i\.pt has 2 layers of width 64 .* set llamagen\.gpt_size"),
        ("llamagen-gpt-other-classes", {"world": "llamagen", "llamagen": {**lg, "num_classes": 1000}, "metrics": ok},
         r"llamagen\.gpt_ckpt: .*set llamagen\.num_classes: 10"),
        ("llamagen-gpt-is-c2i-not-t2i", {"world": "llamagen", "metrics": ok, "llamagen": {
            **lg, "model_type": "t2i", "prompts": {"file": str(prompts)}, "t5": {"path": str(tmp)}}},
         r"llamagen\.gpt_ckpt: .*is a c2i model .* set llamagen\.model_type: c2i"),
        ("llamagen-gpt-and-vq-disagree", {"world": "llamagen", "llamagen": {**lg, "vq_ckpt": vq}, "metrics": ok},
         r"llamagen\.gpt_ckpt .*predicts 16384 codes, but llamagen\.vq_ckpt .* has a codebook of 512"),
        ("llamagen-drafter-as-gpt", {"world": "llamagen", "llamagen": {**lg, "gpt_ckpt": lg["drafter_ckpt"]},
                                     "metrics": ok},
         r"llamagen\.gpt_ckpt: checkpoint .*drafter\.pt is a drafter, not a LlamaGen GPT; give it as llamagen\.drafter_ckpt"),
        ("llamagen-gpt-is-a-folder", {"world": "llamagen", "llamagen": {**lg, "gpt_ckpt": str(tmp)}, "metrics": ok},
         # a folder is what the authors' HF target is, so the line names what such a folder must hold
         r"config: llamagen\.gpt_ckpt = .* is a folder without config\.json and model\.safetensors .*; give the "
         r"authors' HF target folder or an upstream \.pt file"),
        ("llamagen-vq-is-a-folder", {"world": "llamagen", "llamagen": {**lg, "vq_ckpt": str(tmp)}, "metrics": ok},
         r"config: llamagen\.vq_ckpt = .* is a folder, not a file"),
        ("llamagen-drafter-is-a-folder", {"world": "llamagen", "llamagen": {**lg, "drafter_ckpt": str(tmp)},
                                          "metrics": ok}, r"config: llamagen\.drafter_ckpt = .* is a folder, not a file"),
        ("llamagen-prompts-file-is-a-folder", {"world": "llamagen", "llamagen": {**t2i, "prompts": {"file": str(tmp)}}},
         r"config: llamagen\.prompts\.file = .* is a folder, not a file"),
        ("llamagen-text-drafter", {"world": "llamagen", "llamagen": {**lg, "drafter_ckpt": fake}, "metrics": ok},
         r"llamagen\.drafter_ckpt: checkpoint .*text\.pt is unreadable"),
        ("llamagen-gpt-as-drafter", {"world": "llamagen", "llamagen": {**lg, "drafter_ckpt": lg["gpt_ckpt"]},
                                     "metrics": ok},
         r"llamagen\.drafter_ckpt: checkpoint .*c2i\.pt is a LlamaGen GPT, not a drafter; give it as llamagen\.gpt_ckpt"),
        ("llamagen-drafter-of-another-target", {"world": "llamagen", "llamagen": {
            **lg, "drafter_ckpt": str(TOY / "drafter.pt")}, "metrics": ok},
         r"llamagen\.drafter_ckpt: drafter .*drafter\.pt was trained for a target with (dim|vocab_size)="),
        ("llamagen-t2i-without-prompts", {"world": "llamagen", "llamagen": t2i}, r"a t2i run needs prompts"),
        ("llamagen-missing-prompts-file", {"world": "llamagen", "llamagen": {**t2i, "prompts": {"file": "/nope/p.csv"}}},
         r"llamagen\.prompts\.file = /nope/p\.csv does not exist"),
        ("llamagen-missing-coco", {"world": "llamagen", "llamagen": {**t2i, "prompts": {"coco_captions": "/nope/c.json"}}},
         r"llamagen\.prompts\.coco_captions = /nope/c\.json does not exist"),
        ("llamagen-missing-t5", {"world": "llamagen", "llamagen": {**t2i, "prompts": {"file": str(prompts)},
                                                                    "t5": {"path": "/nope/flan-t5-xl"}}},
         r"llamagen\.t5\.path = /nope/flan-t5-xl is not a folder"),
        ("llamagen-missing-reference", {"world": "llamagen", "llamagen": lg,
                                        "metrics": {**ok, "reference": "/nope/val2017"}},
         r"metrics\.reference = /nope/val2017 does not exist"),
    ]


def empty_file(tmp: Path) -> str:
    (tmp / "empty.pt").write_bytes(b"")
    return str(tmp / "empty.pt")


FILE_CONFIG_IDS = ("llamagen-text-vq", "llamagen-gpt-as-vq", "llamagen-text-gpt", "llamagen-empty-gpt",
                   "llamagen-vq-as-gpt", "llamagen-gpt-other-size", "llamagen-gpt-other-classes",
                   "llamagen-gpt-is-c2i-not-t2i", "llamagen-gpt-and-vq-disagree", "llamagen-drafter-as-gpt",
                   "llamagen-gpt-is-a-folder", "llamagen-vq-is-a-folder", "llamagen-drafter-is-a-folder",
                   "llamagen-prompts-file-is-a-folder", "llamagen-text-drafter",
                   "llamagen-gpt-as-drafter", "llamagen-drafter-of-another-target", "llamagen-t2i-without-prompts",
                   "llamagen-missing-prompts-file", "llamagen-missing-coco", "llamagen-missing-t5",
                   "llamagen-missing-reference")


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD_S)


def error_lines(stderr: str) -> list[str]:
    # Snakemake adds its own info line about the extra config file; everything else is ours
    return [line for line in stderr.splitlines() if line.strip() and "is extended by additional config" not in line]


def assert_one_line(rc: int, stdout: str, stderr: str, pattern: str) -> None:
    assert rc != 0, stdout + stderr
    assert "Traceback" not in stdout + stderr, stderr
    lines = error_lines(stderr)
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: "), lines[0]
    assert re.search(pattern, lines[0]), (pattern, lines[0])


def write_override(tmp: Path, override: dict) -> tuple[Path, Path]:
    out = tmp / "out dir"  # a space: paths are quoted everywhere
    path = tmp / "override.yaml"
    path.write_text(yaml.safe_dump({"outdir": str(out), **override}))
    return path, out


def config_cases():
    return [pytest.param(o, p, id=i) for i, o, p in CONFIGS] + [pytest.param(None, i, id=i) for i in FILE_CONFIG_IDS]


def lantern_cmd(*args: str) -> list[str]:
    """The `lantern` console script of this environment (python -m lantern where it is not installed)."""
    script = Path(sys.executable).parent / "lantern"
    return [str(script), *args] if script.is_file() else [sys.executable, "-m", "lantern", *args]


def test_the_llamagen_files_pass(llamagen_files, tmp_path):
    """The world the llamagen cases spoil passes check-config as it is: each case fails for its own reason."""
    path, out = write_override(tmp_path, {"world": "llamagen", "llamagen": llamagen_files, "metrics": {
        "reference": str(tmp_path), "resolution": 256, "class_names": "imagenet"}})
    r = run(lantern_cmd("check-config", str(REPO / "config" / "config.yaml"), str(path)))
    assert r.returncode == 0 and r.stdout.startswith("config OK"), r.stdout + r.stderr
    assert [i for i, _, _ in file_configs(tmp_path, llamagen_files)] == list(FILE_CONFIG_IDS)


# Every config case runs through `lantern check-config`; these also through `snakemake -n` (a few seconds each):
# one or more per layer of the validation (schema, integers, sweep, method registry, metrics, llamagen paths and
# checkpoints), since the Snakefile runs the same validate_config.
SNAKEMAKE_TOO = {"outdir-empty", "outdir-root", "outdir-inside-a-file", "delta-above-1", "gamma-float", "k-inf", "same-point-twice", "methods-empty", "mode-twice",
                 "shards-above-images", "unknown-nested-key", "n-images-string", "n-images-float",
                 "inception-without-weights", "llamagen-missing-gpt", "llamagen-text-vq", "llamagen-text-gpt",
                 "llamagen-drafter-of-another-target"}


@pytest.mark.parametrize("override, pattern", config_cases())
def test_bad_config_stops_check_config_and_snakemake_in_one_line(override, pattern, tmp_path, request):
    case = request.node.callspec.id
    if override is None:  # a case that needs files: look it up by id
        lg = request.getfixturevalue("llamagen_files")
        override, pattern = next((o, p) for i, o, p in file_configs(tmp_path, lg) if i == case)
    path, out = write_override(tmp_path, override)
    r = run(lantern_cmd("check-config", str(REPO / "config" / "config.yaml"), str(path)))
    assert r.returncode == 2, r.stdout + r.stderr
    assert_one_line(r.returncode, r.stdout, r.stderr, pattern)
    if case in SNAKEMAKE_TOO:
        s = run([sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--configfile", str(path)])
        assert_one_line(s.returncode, s.stdout, s.stderr, pattern)
        assert error_lines(s.stderr) == error_lines(r.stderr)  # the same line from both
    assert not out.exists()


def test_snakemake_cases_exist():
    assert SNAKEMAKE_TOO <= {i for i, _, _ in CONFIGS} | set(FILE_CONFIG_IDS)


# -- config files and --config overrides: check-config names the file and line -------------------------------------
def config_file(tmp: Path, name: str, data: bytes | str) -> str:
    path = tmp / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return str(path)


CONFIG = str(REPO / "config" / "config.yaml")
# (case id, check-config arguments given a temp folder, regex the one error line must match)
CONFIG_FILE_CASES = [
    ("yaml-syntax-error", lambda t: [CONFIG, config_file(t, "broken.yaml", "sweep:\n  n_images: 3\n  modes: [sampling\n")],
     r"config file .*broken\.yaml line 4 is not valid YAML"),
    ("yaml-tab-indent", lambda t: [CONFIG, config_file(t, "tabs.yaml", "sweep:\n\tn_images: 3\n")],
     r"config file .*tabs\.yaml line 2 is not valid YAML"),
    ("yaml-top-level-list", lambda t: [CONFIG, config_file(t, "listed.yaml", "- seed: 1\n")],
     r"config file .*listed\.yaml holds a list; a config is a mapping"),
    ("yaml-top-level-scalar", lambda t: [CONFIG, config_file(t, "scalar.yaml", "3\n")],
     r"config file .*scalar\.yaml holds a int; a config is a mapping"),
    ("yaml-not-utf8", lambda t: [CONFIG, config_file(t, "latin1.yaml", b"# caf\xe9\nseed: 1\n")],
     r"config file .*latin1\.yaml is not UTF-8 text"),
    ("override-missing", lambda t: [CONFIG, str(t / "missing.yaml")], r"config file .*missing\.yaml does not exist"),
    ("override-is-a-folder", lambda t: [CONFIG, str(t)], r"config file .* is not a file"),
    ("config-flag-bad-key", lambda t: [CONFIG, "--config", "3x=1"], r"--config 3x=1: Invalid config definition"),
    ("config-flag-string-number", lambda t: [CONFIG, "--config", 'sweep={"n_images": 10}'],
     r"sweep\.n_images = '10' has the wrong type"),
    ("config-flag-unknown-key", lambda t: [CONFIG, "--config", "colour=red"], r"unknown key colour"),
    ("config-flag-float-seed", lambda t: [CONFIG, "--config", "seed=2.5"], r"seed = 2\.5 has the wrong type"),
    ("config-flag-empty", lambda t: [CONFIG, "--config"], r"--config needs at least one key=value"),
    ("no-config-file", lambda t: [], r"usage: lantern check-config"),
    ("overlay-all-commented-out", lambda t: [CONFIG, config_file(t, "off.yaml", "# sweep:\n#   n_images: 8\n")],
     r"config file .*off\.yaml holds no keys \(empty, or every line commented out\), which Snakemake refuses"),
    ("overlay-empty", lambda t: [CONFIG, config_file(t, "empty.yaml", "")], r"config file .*empty\.yaml holds no keys"),
]


@pytest.mark.parametrize("make_args, pattern", [pytest.param(a, p, id=i) for i, a, p in CONFIG_FILE_CASES])
def test_bad_config_file_or_override_is_one_line(make_args, pattern, tmp_path):
    r = run(lantern_cmd("check-config", *make_args(tmp_path)))
    assert r.returncode == 2, r.stdout + r.stderr
    assert_one_line(r.returncode, r.stdout, r.stderr, pattern)


def test_snakemake_parses_config_overrides_as_check_config_does():
    # Snakemake parses the same --config the same way: both refuse the string
    r = run([sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--config", 'sweep={"n_images": 10}'])
    assert_one_line(r.returncode, r.stdout, r.stderr, r"sweep\.n_images = '10' has the wrong type")


# -- bad files and arguments, through the subcommand that reads them -----------------------------------------------
def png_bytes(size: int = 32, seed: int = 0) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def png_bomb(side: int = 20000) -> bytes:
    """A valid PNG header declaring side x side pixels (far over PIL's decompression-bomb limit) and no pixel data:
    a few dozen bytes, refused by Image.open itself."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)) + chunk(b"IEND", b"")


def images_folder(folder: Path, extra: dict[str, bytes] | None = None) -> str:
    folder.mkdir()
    for i in range(2):
        (folder / f"{i:06d}.png").write_bytes(png_bytes(seed=i))
    for name, data in (extra or {}).items():
        (folder / name).write_bytes(data)
    return str(folder)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("files")
    text_file(root / "text.pt")
    (root / "empty.pt").write_bytes(b"")
    (root / "random.pt").write_bytes(bytes(range(256)) * 8)
    torch.save([1, 2, 3], root / "list.pt")
    # a plain pickle (not torch.save) of an arbitrary object, and a torch file holding one
    (root / "pickle.pt").write_bytes(pickle.dumps({"model": argparse.Namespace(dim=64)}, protocol=4))
    torch.save({"model": argparse.Namespace(dim=64)}, root / "object.pt")
    with zipfile.ZipFile(root / "zip.pt", "w") as z:  # a zip, but no torch archive
        z.writestr("notes/readme.txt", "hello")
    target = (TOY / "target.pt").read_bytes()
    (root / "truncated.pt").write_bytes(target[: len(target) // 2])
    codebook = read_codebook(TOY / "vq.pt")
    torch.save(build_table(torch.randn(32, 4), NeighbourParams(k=8)), root / "other_nb.pt")
    torch.save(build_table(codebook, NeighbourParams(k=3)), root / "narrow_nb.pt")  # k = 3 stored, 5 needed
    torch.save({"meta": {"format": NEIGHBOURS_FORMAT}}, root / "meta_only_nb.pt")
    torch.save({"format": DRAFTER_FORMAT}, root / "format_only_drafter.pt")
    (root / "latin1.csv").write_bytes(b"id,caption\n1,caf\xe9 au lait\n")
    (root / "prompts.csv").write_text("id,caption\n1,a cat\n2,a dog\n")
    (root / "empty_dir").mkdir()
    (root / "text.json").write_text("not json {")
    (root / "random.safetensors").write_bytes(bytes(range(256)) * 4)
    features = root / "features"
    features.mkdir()
    (features / "1.npy").write_bytes(b"this is not numpy")
    images_folder(root / "generated")
    png = png_bytes(seed=7)
    images_folder(root / "ref_garbage", {"broken.png": b"not a png at all"})
    images_folder(root / "ref_truncated", {"cut.png": png[: len(png) // 2]})
    images_folder(root / "ref_empty_file", {"zero.png": b""})
    images_folder(root / "ref_bomb", {"huge.png": png_bomb()})
    write_gpt(root / "c2i_16384.pt", "c2i")  # an upstream-layout GPT of vocabulary 16384 (the toy VQ has 512 codes)
    (root / "text.npz").write_text("not an npz")
    (root / "garbage_tables").mkdir()
    (root / "garbage_tables" / "sweep.csv").write_bytes(b"mode,point\n\xff\xfe,1,2,3\n")
    (root / "class_images").mkdir()
    images_folder(root / "class_images" / "n01", {"broken.png": b"garbage"})
    bad_stats = root / "shard_bad_stats"
    bad_stats.mkdir()
    (bad_stats / "stats.csv").write_bytes(b"a,b\n1,2,3,4\n\xff\xfe\n")
    (bad_stats / "manifest.json").write_text("{}")
    return root


def sample(out: Path, **kw) -> list[str]:
    args = {"--target": str(TOY / "target.pt"), "--vq": str(TOY / "vq.pt"), "--drafter": str(TOY / "drafter.pt"),
            "--end": "2", "--out": str(out), "--device": "cpu", **kw}
    return ["sample", *[x for k, v in args.items() for x in (k, v)]]


def evaluate(f: Path, out: Path, reference: str, images: str | None = None) -> list[str]:
    return ["evaluate", "--images", images or str(f / "generated"), "--reference", str(f / reference),
            "--out", f"{out}.json", "--params", '{"clip": {"enabled": false}}']


LANTERN = json.dumps({"name": "lantern", "delta": 0.1, "k": 5})
# (case id, CLI arguments given the files folder and an output path, regex the one error line must match)
FILE_CASES = [
    ("target-text-file", lambda f, o: sample(o, **{"--target": str(f / "text.pt")}),
     r"checkpoint .*text\.pt is unreadable: not a torch file"),
    ("target-empty-file", lambda f, o: sample(o, **{"--target": str(f / "empty.pt")}), r"empty\.pt is unreadable"),
    ("target-random-bytes", lambda f, o: sample(o, **{"--target": str(f / "random.pt")}), r"random\.pt is unreadable"),
    ("target-random-pickle", lambda f, o: sample(o, **{"--target": str(f / "pickle.pt")}), r"pickle\.pt is unreadable"),
    ("target-holds-an-object", lambda f, o: sample(o, **{"--target": str(f / "object.pt")}),
     r"object\.pt is unreadable"),
    ("target-zip-not-torch", lambda f, o: sample(o, **{"--target": str(f / "zip.pt")}), r"zip\.pt is unreadable"),
    ("target-truncated", lambda f, o: sample(o, **{"--target": str(f / "truncated.pt")}),
     r"truncated\.pt is unreadable: .*truncated"),
    ("target-holds-a-list", lambda f, o: sample(o, **{"--target": str(f / "list.pt")}),
     r"list\.pt holds a list, not a mapping of tensors"),
    ("vq-given-as-target", lambda f, o: sample(o, **{"--target": str(TOY / "vq.pt")}),
     r"checkpoint .*vq\.pt is a VQ tokenizer, not a LlamaGen GPT; give it as llamagen\.vq_ckpt / --vq"),
    ("drafter-given-as-target", lambda f, o: sample(o, **{"--target": str(TOY / "drafter.pt")}),
     r"checkpoint .*drafter\.pt is a drafter, not a LlamaGen GPT; give it as llamagen\.drafter_ckpt"),
    ("target-given-as-vq", lambda f, o: sample(o, **{"--vq": str(TOY / "target.pt")}),
     r"target\.pt is a LlamaGen GPT, not a VQ tokenizer|target\.pt has no quantize\.embedding\.weight; pass a VQ"),
    ("target-is-a-folder", lambda f, o: sample(o, **{"--target": str(f / "empty_dir")}),
     r"--target .*empty_dir is a folder, not a file; give the file itself"),
    ("vq-is-a-folder", lambda f, o: sample(o, **{"--vq": str(f / "empty_dir")}), r"empty_dir is a folder, not a file"),
    ("drafter-is-a-folder", lambda f, o: sample(o, **{"--method": '{"name": "exact"}', "--drafter": str(f / "empty_dir")}),
     r"empty_dir is a folder, not a file"),
    ("vq-empty-file", lambda f, o: sample(o, **{"--vq": str(f / "empty.pt")}), r"empty\.pt is unreadable"),
    ("target-and-vq-disagree", lambda f, o: sample(o, **{"--target": str(f / "c2i_16384.pt"), "--target-spec": json.dumps(
        {"gpt_size": GPT_SIZE, "num_classes": 10}), "--method": '{"name": "vanilla"}'}),
     rf"--target .*c2i_16384\.pt predicts 16384 codes, but --vq .*vq\.pt decodes {TOY_CODES}"),
    ("target-spec-disagrees", lambda f, o: sample(o, **{"--target": str(f / "c2i_16384.pt"), "--target-spec": json.dumps(
        {"gpt_size": "GPT-B", "num_classes": 10}), "--method": '{"name": "vanilla"}'}),
     r"c2i_16384\.pt has 2 layers of width 64 .* set llamagen\.gpt_size"),
    ("target-missing", lambda f, o: sample(o, **{"--target": str(f / "nope.pt")}), r"nope\.pt does not exist"),
    ("target-spec-bad-type", lambda f, o: sample(o, **{"--target-spec": '{"model_type": "x2i"}'}),
     r"llamagen\.model_type = 'x2i' is not a model type"),
    ("drafter-text-file", lambda f, o: sample(o, **{"--method": '{"name": "exact"}', "--drafter": str(f / "text.pt")}),
     r"text\.pt is unreadable"),
    ("drafter-given-the-target", lambda f, o: sample(o, **{"--method": '{"name": "exact"}',
                                                           "--drafter": str(TOY / "target.pt")}),
     r"target\.pt is a LlamaGen GPT, not a drafter; give it as llamagen\.gpt_ckpt / --target"),
    ("drafter-given-the-vq", lambda f, o: sample(o, **{"--method": '{"name": "exact"}', "--drafter": str(TOY / "vq.pt")}),
     r"vq\.pt is a VQ tokenizer, not a drafter; give it as llamagen\.vq_ckpt / --vq"),
    ("drafter-format-only", lambda f, o: sample(o, **{"--method": '{"name": "exact"}',
                                                      "--drafter": str(f / "format_only_drafter.pt")}),
     r"format_only_drafter\.pt is not a drafter checkpoint"),
    ("neighbours-random-bytes", lambda f, o: sample(o, **{"--method": LANTERN, "--neighbours": str(f / "random.pt")}),
     r"neighbour table .*random\.pt is unreadable"),
    ("neighbours-other-codebook", lambda f, o: sample(o, **{"--method": LANTERN, "--neighbours": str(f / "other_nb.pt")}),
     r"other_nb\.pt was built for another codebook"),
    ("neighbours-too-narrow", lambda f, o: sample(o, **{"--method": LANTERN, "--neighbours": str(f / "narrow_nb.pt")}),
     r"narrow_nb\.pt stores k=3 neighbours but 5 are needed"),
    ("neighbours-meta-only", lambda f, o: sample(o, **{"--method": LANTERN, "--neighbours": str(f / "meta_only_nb.pt")}),
     r"meta_only_nb\.pt is not a neighbour table"),
    ("labels-word", lambda f, o: sample(o, **{"--labels": "cats"}), r"--labels 'cats' must be 'cycle' or a class id"),
    ("labels-out-of-range", lambda f, o: sample(o, **{"--labels": "99"}), r"--labels '99' must be"),
    ("labels-negative", lambda f, o: sample(o, **{"--labels": "-1"}), r"--labels '-1' must be"),
    ("device-unknown", lambda f, o: sample(o, **{"--device": "banana"}), r"--device 'banana'|device 'banana'"),
    ("method-bad-yaml", lambda f, o: sample(o, **{"--method": "{bad"}), r"--method '\{bad' is neither .* valid JSON/YAML"),
    ("method-a-list", lambda f, o: sample(o, **{"--method": "[1]"}), r"--method must be a mapping"),
    ("method-grid", lambda f, o: sample(o, **{"--method": json.dumps({"name": "lantern", "delta": [0.1, 0.2], "k": 5})}),
     r"--method\.delta = \[0\.1, 0\.2\] must be one value here"),
    ("method-unknown-key", lambda f, o: sample(o, **{"--method": json.dumps({"name": "exact", "colour": 1})}),
     r"--method\.colour is not a parameter of exact"),
    ("method-gamma-float", lambda f, o: sample(o, **{"--method": json.dumps({"name": "exact", "gamma": 2.0})}),
     r"--method\.gamma = 2\.0 must be an integer"),
    ("method-lantern-without-neighbours", lambda f, o: sample(o, **{"--method": LANTERN}), r"--neighbours"),
    ("sampling-unknown-key", lambda f, o: sample(o, **{"--sampling": '{"cfg": 2}'}), r"unknown key --sampling\.cfg"),
    ("sampling-wrong-type", lambda f, o: sample(o, **{"--sampling": '{"top_k": "ten"}'}),
     r"--sampling\.top_k = 'ten' must be of type int"),
    ("sampling-bad-temperature", lambda f, o: sample(o, **{"--sampling": '{"temperature": 0}'}), r"temperature=0"),
    ("start-after-end", lambda f, o: sample(o, **{"--start": "5"}), r"need 0 <= --start < --end"),
    ("batch-size-zero", lambda f, o: sample(o, **{"--batch-size": "0"}), r"--batch-size must be >= 1"),
    ("in-job-vanilla-every-zero", lambda f, o: sample(o, **{"--in-job-vanilla-every": "0"}),
     r"--in-job-vanilla-every must be >= 1, got 0"),
    ("latency-images-negative", lambda f, o: sample(o, **{"--latency-images": "-2"}), r"--latency-images must be >= 0, got -2"),
    ("end-not-a-number", lambda f, o: sample(o, **{"--end": "two"}), r"argument --end: invalid int value: 'two'"),
    ("sample-unknown-flag", lambda f, o: sample(o, **{"--colour": "red"}), r"lantern sample: unrecognized arguments"),
    ("neighbours-text-vq", lambda f, o: ["neighbours", "--vq", str(f / "text.pt"), "--out", str(o)],
     r"text\.pt is unreadable"),
    ("neighbours-target-as-vq", lambda f, o: ["neighbours", "--vq", str(TOY / "target.pt"), "--out", str(o)],
     r"target\.pt has no quantize\.embedding\.weight; pass a VQ"),
    ("neighbours-k-too-large", lambda f, o: ["neighbours", "--vq", str(TOY / "vq.pt"), "--out", str(o),
                                             "--params", '{"k": 9999}'], r"k=9999 exceeds"),
    ("neighbours-k-float", lambda f, o: ["neighbours", "--vq", str(TOY / "vq.pt"), "--out", str(o),
                                         "--params", '{"k": 5.0}'], r"k"),
    ("tokenize-text-data", lambda f, o: ["tokenize", "--data", str(f / "text.pt"), "--vq", str(TOY / "vq.pt"),
                                         "--out", str(o)], r"--data .*text\.pt is unreadable"),
    ("tokenize-target-as-data", lambda f, o: ["tokenize", "--data", str(TOY / "target.pt"), "--vq", str(TOY / "vq.pt"),
                                              "--out", str(o)], r"target\.pt is not a `lantern make-data` file"),
    ("train-gpt-text-tokens", lambda f, o: ["train-gpt", "--tokens", str(f / "text.pt"), "--val", str(f / "text.pt"),
                                            "--out", str(o)], r"--tokens .*text\.pt is unreadable"),
    ("ambiguity-vq-as-target", lambda f, o: ["ambiguity", "--target", str(TOY / "vq.pt"), "--heldout",
                                             str(f / "text.pt"), "--out", str(o), "--steps-out", f"{o}.steps"],
     r"text\.pt is unreadable"),
    ("convert-text-src", lambda f, o: ["convert", "--kind", "target", "--src", str(f / "text.pt"), "--out", str(o)],
     r"text\.pt is unreadable"),
    ("convert-random-safetensors", lambda f, o: ["convert", "--kind", "target", "--src", str(f / "random.safetensors"),
                                                 "--out", str(o)], r"random\.safetensors are unreadable"),
    ("convert-src-missing", lambda f, o: ["convert", "--kind", "target", "--src", str(f / "nope"), "--out", str(o)],
     r"--src .*nope does not exist"),
    ("convert-our-drafter-as-authors", lambda f, o: ["convert", "--kind", "drafter", "--src", str(TOY / "drafter.pt"),
                                                     "--target", str(TOY / "target.pt"), "--out", str(o)],
     r"drafter\.pt has no state dict"),
    ("convert-missing-args", lambda f, o: ["convert"], r"lantern convert: the following arguments are required"),
    ("encode-captions-not-utf8", lambda f, o: ["encode-captions", "--prompts", str(f / "latin1.csv"), "--features",
                                               str(f / "features"), "--out", str(o)], r"latin1\.csv is not UTF-8"),
    ("encode-captions-bad-npy", lambda f, o: ["encode-captions", "--prompts", str(f / "prompts.csv"), "--features",
                                              str(f / "features"), "--out", str(o), "--end", "1"],
     r"1\.npy \(prompt id '1'\) is not a readable \.npy file"),
    ("encode-captions-t5-not-a-model", lambda f, o: ["encode-captions", "--prompts", str(f / "prompts.csv"), "--t5",
                                                     str(f / "empty_dir"), "--out", str(o)],
     r"--t5 .*empty_dir is not a T5 model folder"),
    ("encode-images-bad-image", lambda f, o: ["encode-images", "--images", str(f / "class_images"), "--layout",
                                              "classes", "--vq", str(TOY / "vq.pt"), "--image-size", "32",
                                              "--end", "3", "--out", str(o), "--device", "cpu"],
     r"broken\.png"),
    ("tables-not-a-shard", lambda f, o: ["tables", "--shards", str(f / "empty_dir"), "--out", str(o)],
     r"has no manifest\.json, so it is not a finished `lantern sample` shard; redraw it .*--forcerun="),
    ("tables-garbage-stats", lambda f, o: ["tables", "--shards", str(f / "shard_bad_stats"), "--out", str(o)],
     r"stats table .*shard_bad_stats/stats\.csv is not a readable CSV"),
    ("speed-garbage-stats", lambda f, o: ["speed", "--stats", str(f / "random.pt"), "--out", f"{o}.csv"],
     r"stats table .*random\.pt is not a readable CSV"),
    ("figure-unknown", lambda f, o: ["figure", "nosuch", "--out", str(o) + ".png"], r"invalid choice: 'nosuch'"),
    ("figure-garbage-sweep", lambda f, o: ["figure", "tradeoff", "--tables", str(f / "garbage_tables"),
                                           "--out", str(o) + ".png"], r"table .*sweep\.csv is not a readable CSV"),
    ("figure-ambiguity-garbage", lambda f, o: ["figure", "ambiguity", "--ambiguity", f"default={f / 'random.pt'}",
                                               "--out", str(o) + ".png"], r"ambiguity: .*random\.pt is not a readable CSV"),
    ("figure-tables-missing", lambda f, o: ["figure", "tradeoff", "--tables", str(f / "empty_dir"),
                                            "--out", str(o) + ".png"], r"sweep\.csv"),
    ("prompts-not-utf8", lambda f, o: ["prompts", "--file", str(f / "latin1.csv"), "--out", str(o)],
     r"latin1\.csv is not UTF-8"),
    ("prompts-coco-not-json", lambda f, o: ["prompts", "--coco", str(f / "text.json"), "--out", str(o)],
     r"text\.json is not a JSON file"),
    ("evaluate-no-images", lambda f, o: ["evaluate", "--images", str(f / "empty_dir"), "--reference",
                                         str(f / "empty_dir"), "--out", f"{o}.json"], r"holds no images"),
    ("evaluate-reference-not-png", lambda f, o: evaluate(f, o, "ref_garbage"), r"ref_garbage/broken\.png is not a "
     r"readable image"),
    ("evaluate-reference-truncated-png", lambda f, o: evaluate(f, o, "ref_truncated"),
     r"ref_truncated/cut\.png is not a readable image"),
    ("evaluate-reference-empty-png", lambda f, o: evaluate(f, o, "ref_empty_file"),
     r"ref_empty_file/zero\.png is not a readable image"),
    ("evaluate-decompression-bomb", lambda f, o: evaluate(f, o, "generated", str(f / "ref_bomb")),
     r"ref_bomb/huge\.png is not a readable image.*pixels"),
    ("evaluate-text-npz", lambda f, o: evaluate(f, o, "text.npz"), r"text\.npz is not an \.npz archive"),
    ("evaluate-captions-not-csv", lambda f, o: evaluate(f, o, "generated") + ["--captions", str(f / "random.pt")],
     r"captions table .*random\.pt is not a readable CSV"),
    ("methods-with-arguments", lambda f, o: ["methods", "x"], r"usage: lantern methods"),
    ("make-data-negative-n", lambda f, o: ["make-data", "--out", str(o), "--n", "-3", "--seed", "0"],
     r"--n must be positive"),
    ("make-data-unknown-param", lambda f, o: ["make-data", "--out", str(o), "--n", "3", "--seed", "0",
                                              "--params", '{"colour": 1}'], r"colour"),
    ("unknown-command", lambda f, o: ["sampel"], r"unknown command 'sampel'"),
]


@pytest.mark.parametrize("make_args, pattern", [pytest.param(a, p, id=i) for i, a, p in FILE_CASES])
def test_bad_file_or_argument_is_one_line(make_args, pattern, files, tmp_path, capsys):
    out = tmp_path / "out"
    rc = cli(make_args(files, out))
    captured = capsys.readouterr()
    assert rc == 2
    assert_one_line(rc, captured.out, captured.err, pattern)
    assert not [p for p in tmp_path.iterdir()], "nothing may be written"


def test_the_cli_leaves_argparse_as_it_found_it(files, tmp_path, capsys):
    """cli() makes argparse's errors one line for its command only: an in-process caller's own parsers (a benchmark
    script's, a test's) exit with argparse's usage afterwards, whichever test ran before."""
    import argparse

    default = argparse.ArgumentParser.error
    assert cli(["make-data", "--out", str(tmp_path / "out"), "--n", "3", "--seed", "0", "--params", '{"colour": 1}']) == 2
    assert argparse.ArgumentParser.error is default
    with pytest.raises(SystemExit):
        argparse.ArgumentParser(prog="p").parse_args(["--nope"])
    assert "p: error: unrecognized arguments: --nope" in capsys.readouterr().err


def test_the_table_is_large_enough():
    assert len(CONFIGS) + len(FILE_CONFIG_IDS) + len(CONFIG_FILE_CASES) + len(FILE_CASES) >= 45


# -- what the llamagen world's input files say, read by check-config before any job (issue #30) ---------------------
def vq_file(path: Path, levels: int) -> str:
    """An upstream-layout VQ (weights only) of a 16384-code codebook and an encoder of `levels` resolution levels:
    5 = VQ-16, 4 = VQ-8 (one small tensor per level: a config check reads only the names)."""
    sd = {"quantize.embedding.weight": torch.randn(16384, 8),
          **{f"encoder.conv_blocks.{i}.res.0.norm1.weight": torch.ones(4) for i in range(levels)}}
    torch.save({"model": sd}, path)
    return str(path)


def class_tree(root: Path, counts: dict[str, int]) -> str:
    for name, n in counts.items():
        (root / name).mkdir(parents=True)
        for i in range(n):
            (root / name / f"{i}.png").write_bytes(png_bytes(8, seed=i))
    return str(root)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, llamagen_files) -> dict:
    """Good inputs of both llamagen model types, which the cases below spoil one at a time: a t2i GPT, VQ-16 and
    VQ-8 files, prompt files (CSV, JSONL, COCO), T5 folders, the authors' drafter, drafter image folders."""
    root = tmp_path_factory.mktemp("inputs")
    n = N_IMAGES  # config.yaml's sweep.n_images
    write_gpt(root / "t2i.pt", "t2i")
    f = {"root": root, "vq16": vq_file(root / "vq16.pt", 5), "vq8": vq_file(root / "vq8.pt", 4)}
    (root / "prompts.csv").write_text("id,caption\n" + "".join(f"{i},a picture number {i}\n" for i in range(n)))
    (root / "ten.csv").write_text("id,caption\n" + "".join(f"{i},a picture number {i}\n" for i in range(10)))
    (root / "ten.jsonl").write_text("".join(json.dumps({"id": i, "caption": f"picture {i}"}) + "\n" for i in range(10)))
    (root / "coco_no_annotations.json").write_text(json.dumps({"images": [{"id": 1}], "info": {}}))
    (root / "coco_small.json").write_text(json.dumps({"annotations": [
        {"image_id": i, "caption": f"a long caption {i}"} for i in range(5)]}))
    features = root / "features"
    features.mkdir()
    for i in range(n):
        np.save(features / f"{i}.npy", np.zeros((1, 3, 8), dtype=np.float32))
    partial = root / "features_partial"
    partial.mkdir()
    for i in range(n - 1):
        np.save(partial / f"{i}.npy", np.zeros((1, 3, 8), dtype=np.float32))
    for name in ("empty_folder", "t5_no_weights"):
        (root / name).mkdir()
    (root / "t5_no_weights" / "config.json").write_text("{}")
    write_authors_drafter(root / "authors", llamagen_files["gpt_ckpt"])
    (root / "authors_config_only").mkdir()
    (root / "authors_config_only" / "config.json").write_text((root / "authors" / "config.json").read_text())
    wrong = torch.load(root / "authors" / "pytorch_model.bin", weights_only=True)
    wrong["fc.weight"] = torch.zeros(64, 3 * 64, dtype=torch.float16)  # a drafter for another fusion: wrong shape
    write_authors_drafter(root / "authors_wrong", llamagen_files["gpt_ckpt"])
    torch.save(wrong, root / "authors_wrong" / "pytorch_model.bin")
    class_tree(root / "classes", {"n01": 2, "n02": 1})
    (root / "flat").mkdir()
    (root / "flat" / "0.png").write_bytes(png_bytes(8))
    class_tree(root / "captioned", {"img": 2})
    (root / "captioned" / "captions.csv").write_text("image,caption\nimg/0.png,a cat\nimg/1.png,a dog\n")
    f.update({k: str(root / k) for k in ("prompts.csv", "ten.csv", "ten.jsonl", "coco_no_annotations.json",
                                         "coco_small.json", "features", "features_partial", "empty_folder",
                                         "t5_no_weights", "authors", "authors_config_only", "authors_wrong",
                                         "classes", "flat", "captioned")})
    f["t2i"] = str(root / "t2i.pt")
    return f


def input_worlds(f: dict, lg: dict) -> dict[str, dict]:
    """The passing worlds: c2i with the authors' drafter or one trained on class folders, t2i with T5 features."""
    metrics = {"reference": str(f["root"]), "resolution": 256, "class_names": "imagenet"}
    c2i = {"world": "llamagen", "metrics": metrics, "llamagen": {**lg, "vq_ckpt": f["vq16"], "drafter_ckpt": ""}}
    t2i_lg = {"model_type": "t2i", "gpt_ckpt": f["t2i"], "gpt_size": GPT_SIZE, "vq_ckpt": f["vq16"],
              "prompts": {"file": f["prompts.csv"]}, "t5": {"features": f["features"]},
              "authors_drafter": f["authors"]}
    return {
        "c2i-authors": merge(c2i, {"llamagen": {"authors_drafter": f["authors"]}}),
        "c2i-train": merge(c2i, {"llamagen": {"drafter": {"images": f["classes"], "n_images": 3, "shards": 1}}}),
        "t2i": {"world": "llamagen", "metrics": metrics, "llamagen": t2i_lg},
    }


def merge(base: dict, over: dict) -> dict:
    from lantern.pipeline.config import merge_config

    return merge_config(json.loads(json.dumps(base)), over)


# (case id, passing world, its change, regex): each class of input a job refused only at run time before
INPUT_CASES = [
    ("downsample-8-with-a-vq16", "c2i-authors", lambda f: {"llamagen": {"downsample": 8}},
     r"config: llamagen\.downsample = 8, but llamagen\.vq_ckpt .*vq16\.pt downsamples by 16; set llamagen\.downsample: 16 \(256 px -> 16 x 16 tokens\)"),
    ("downsample-16-with-a-vq8", "c2i-authors", lambda f: {"llamagen": {"vq_ckpt": f["vq8"]}},
     r"llamagen\.downsample = 16, but llamagen\.vq_ckpt .*vq8\.pt downsamples by 8"),
    ("downsample-with-our-toy-vq", "c2i-authors", lambda f: {"llamagen": {"vq_ckpt": str(TOY / "vq.pt")}},
     r"llamagen\.downsample = 16, but llamagen\.vq_ckpt .*vq\.pt downsamples by 4"),
    ("t5-path-empty-folder", "t2i", lambda f: {"llamagen": {"t5": {"path": f["empty_folder"]}}},
     r"config: llamagen\.t5\.path = .*empty_folder is empty; point it at a local flan-t5-xl folder"),
    ("t5-path-without-weights", "t2i", lambda f: {"llamagen": {"t5": {"path": f["t5_no_weights"]}}},
     r"llamagen\.t5\.path = .*t5_no_weights holds no weights"),
    ("t5-features-empty-folder", "t2i", lambda f: {"llamagen": {"t5": {"features": f["empty_folder"]}}},
     r"config: llamagen\.t5\.features = .*empty_folder is empty \(first: 0\.npy\)"),
    ("t5-features-one-missing", "t2i", lambda f: {"llamagen": {"t5": {"features": f["features_partial"]}}},
     rf"llamagen\.t5\.features = .*features_partial lacks 1 of the {N_IMAGES} prompts' files "
     rf"\(first: {N_IMAGES - 1}\.npy\)"),
    ("prompts-csv-too-few", "t2i", lambda f: {"llamagen": {"prompts": {"file": f["ten.csv"]}}},
     rf"config: sweep\.n_images = {N_IMAGES} asks for more prompts than llamagen\.prompts\.file .*ten\.csv holds \(10\); "
     r"lower sweep\.n_images to <= 10"),
    ("prompts-jsonl-too-few", "t2i", lambda f: {"llamagen": {"prompts": {"file": f["ten.jsonl"]}}},
     rf"sweep\.n_images = {N_IMAGES} asks for more prompts than llamagen\.prompts\.file .*ten\.jsonl holds \(10\)"),
    ("coco-without-annotations", "t2i", lambda f: {"llamagen": {"prompts": {"file": "", "coco_captions":
                                                                           f["coco_no_annotations.json"]}}},
     r"config: llamagen\.prompts\.coco_captions .*coco_no_annotations\.json has no \"annotations\" list"),
    ("coco-too-few-images", "t2i", lambda f: {"llamagen": {"prompts": {"file": "", "coco_captions":
                                                                      f["coco_small.json"]}}},
     rf"sweep\.n_images = {N_IMAGES} asks for more prompts than llamagen\.prompts\.coco_captions .*coco_small\.json holds \(5\)"),
    ("authors-drafter-empty-folder", "c2i-authors", lambda f: {"llamagen": {"authors_drafter": f["empty_folder"]}},
     r"config: llamagen\.authors_drafter: .*empty_folder holds none of model\.safetensors"),
    ("authors-drafter-config-only", "c2i-authors", lambda f: {"llamagen": {"authors_drafter": f["authors_config_only"]}},
     r"config: llamagen\.authors_drafter: .*authors_config_only holds none of"),
    ("authors-drafter-wrong-shapes", "c2i-authors", lambda f: {"llamagen": {"authors_drafter": f["authors_wrong"]}},
     r"config: llamagen\.authors_drafter: drafter tensors do not fit this target .*fc\.weight \(64, 192\) vs \(64, 128\)"),
    ("authors-drafter-for-t2i-given-c2i", "t2i", lambda f: {"llamagen": {"authors_drafter": f["authors_wrong"]}},
     r"llamagen\.authors_drafter: drafter tensors do not fit"),
    ("drafter-images-too-few", "c2i-train", lambda f: {"llamagen": {"drafter": {"n_images": 4}}},
     r"config: llamagen\.drafter\.n_images = 4 exceeds the 3 images in llamagen\.drafter\.images .*classes; "
     r"lower llamagen\.drafter\.n_images to <= 3"),
    ("drafter-images-default-count", "c2i-train", lambda f: {"llamagen": {"drafter": {"n_images": 100000}}},
     r"llamagen\.drafter\.n_images = 100000 exceeds the 3 images"),
    ("drafter-images-no-class-folders", "c2i-train", lambda f: {"llamagen": {"drafter": {"images": f["flat"]}}},
     r"config: llamagen\.drafter\.images = .*flat has no class folders"),
    ("drafter-images-captioned-too-few", "t2i", lambda f: {"llamagen": {"authors_drafter": "", "drafter": {
        "images": f["captioned"], "n_images": 5, "shards": 1}}},
     r"llamagen\.drafter\.n_images = 5 exceeds the 2 images in llamagen\.drafter\.images .*captioned"),
    ("drafter-images-captioned-without-captions", "t2i", lambda f: {"llamagen": {"authors_drafter": "", "drafter": {
        "images": f["classes"], "n_images": 2, "shards": 1}}},
     r"config: llamagen\.drafter\.images: .*classes has neither of captions\.csv and captions\.jsonl"),
]
# through snakemake -n as well: one per kind of file
INPUT_SNAKEMAKE_TOO = {"downsample-8-with-a-vq16", "t5-features-empty-folder", "prompts-csv-too-few",
                       "authors-drafter-wrong-shapes", "drafter-images-too-few"}


@pytest.mark.parametrize("world", ["c2i-authors", "c2i-train", "t2i"])
def test_the_input_worlds_pass(world, inputs, llamagen_files, tmp_path):
    """Each world the input cases spoil passes as it is, so each case fails for its own reason."""
    path, _ = write_override(tmp_path, input_worlds(inputs, llamagen_files)[world])
    r = run(lantern_cmd("check-config", CONFIG, str(path)))
    assert r.returncode == 0 and r.stdout.startswith("config OK"), r.stdout + r.stderr


@pytest.mark.parametrize("world, change, pattern", [pytest.param(w, c, p, id=i) for i, w, c, p in INPUT_CASES])
def test_bad_input_file_stops_before_any_job(world, change, pattern, inputs, llamagen_files, tmp_path, request):
    path, out = write_override(tmp_path, merge(input_worlds(inputs, llamagen_files)[world], change(inputs)))
    r = run(lantern_cmd("check-config", CONFIG, str(path)))
    assert r.returncode == 2, r.stdout + r.stderr
    assert_one_line(r.returncode, r.stdout, r.stderr, pattern)
    if request.node.callspec.id in INPUT_SNAKEMAKE_TOO:
        s = run([sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--configfile", str(path)])
        assert error_lines(s.stderr) == error_lines(r.stderr)
    assert not out.exists()


def test_an_overlay_without_keys_is_refused_by_snakemake_too(tmp_path):
    """check-config refuses it (CONFIG_FILE_CASES) because Snakemake does: both stop, neither plans a job."""
    path = config_file(tmp_path, "off.yaml", "# sweep:\n#   n_images: 8\n")
    s = run([sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--configfile", path])
    assert s.returncode != 0 and "keys at top level" in s.stdout + s.stderr and "Job stats" not in s.stdout


def test_mode_images_caps_and_never_demands(tmp_path):
    """config.yaml's mode_images {greedy: 64} under an overlay's n_images: 8: greedy decodes min(64, 8) = 8."""
    from lantern.pipeline.config import mode_images, mode_shard_ranges, shard_ranges, validate_config

    path = config_file(tmp_path, "eight.yaml", "sweep: {n_images: 8}\n")
    r = run(lantern_cmd("check-config", CONFIG, path))
    assert r.returncode == 0 and r.stdout.startswith("config OK"), r.stderr
    s = run([sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--configfile", path])
    assert s.returncode == 0, s.stderr[-2000:]
    cfg = validate_config(merge(yaml.safe_load(Path(CONFIG).read_text()), {"sweep": {"n_images": 8}}))
    assert mode_images(cfg["sweep"], "greedy") == 8
    assert mode_shard_ranges(cfg["sweep"], "greedy") == shard_ranges(8, 1, 8)
    cfg = validate_config(merge(yaml.safe_load(Path(CONFIG).read_text()), {"sweep": {"n_images": 96}}))
    assert mode_images(cfg["sweep"], "greedy") == 64  # below n_images the cap still holds


# -- a full or unwritable disk, wherever the project writes: one line naming the path, nothing half-written --------
def writers(f: Path, out: Path) -> dict[str, list[str]]:
    """A command per kind of output: a table (prompts CSV), a torch file (neighbour table), images + rows +
    manifest (sample), a JSON (evaluate)."""
    return {"prompts": ["prompts", "--file", str(f / "prompts.csv"), "--out", str(out / "prompts.csv")],
            "neighbours": ["neighbours", "--vq", str(TOY / "vq.pt"), "--out", str(out / "nb.pt")],
            "sample": sample(out / "shard")}


class FillsUp:
    """A file on a disk that fills up: the first write lands half, then ENOSPC."""
    def __init__(self, f):
        self._f = f

    def write(self, data):
        self._f.write(data[: len(data) // 2])
        self._f.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


def enospc_on_write(monkeypatch):
    """The disk fills while an output's temporary file is written (open() and Path.open both go through here)."""
    import builtins

    real = io.open

    def opener(file, mode="r", *a, **k):
        f = real(file, mode, *a, **k)
        return FillsUp(f) if str(file).endswith(".tmp") and "w" in mode else f
    monkeypatch.setattr(builtins, "open", opener)
    monkeypatch.setattr(io, "open", opener)


def fail_rename(err: int):
    def patch(monkeypatch):
        def replace(src, dst, *a, **k):
            raise OSError(err, os.strerror(err), str(src), None, str(dst))
        monkeypatch.setattr("lantern.io.os.replace", replace)
    return patch


def deny_create(monkeypatch):
    """EACCES creating the temporary file beside the output (tests run as root, whom chmod does not stop)."""
    def mkstemp(*a, dir=None, **k):
        raise PermissionError(errno.EACCES, "Permission denied", str(dir))
    monkeypatch.setattr("lantern.io.tempfile.mkstemp", mkstemp)


def deny_folders(monkeypatch):
    """EACCES making an output folder (sample's resumable partial folder is made outside the atomic writes)."""
    real = Path.mkdir

    def mkdir(self, *a, **k):
        if "out" in self.parts:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real(self, *a, **k)
    monkeypatch.setattr(Path, "mkdir", mkdir)


DISK_FAULTS = {
    "enospc-while-writing": (enospc_on_write, r"cannot write .*out/\S+: no space left on the device \(ENOSPC\); "
                                              r"free space on the file system of .*out"),
    "enospc-on-rename": (fail_rename(errno.ENOSPC), r"cannot write .*out/\S+: no space left on the device"),
    "edquot-on-rename": (fail_rename(errno.EDQUOT), r"no space left on the device \(EDQUOT\)"),
    "eacces-creating": (deny_create, r"cannot write .*out/\S+: permission denied \(EACCES\); make .*out\S* writable"),
    "erofs-on-rename": (fail_rename(errno.EROFS), r"cannot write .*out/\S+: read-only file system \(EROFS\)"),
    "eacces-making-folders": (deny_folders, r"cannot (write|access) .*out\S*: permission denied \(EACCES\)"),
}


@pytest.mark.parametrize("command", ["prompts", "neighbours", "sample"])
@pytest.mark.parametrize("fault", list(DISK_FAULTS))
def test_full_or_unwritable_disk_is_one_line_and_leaves_nothing(command, fault, files, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    args = writers(files, out)[command]
    make_fault, pattern = DISK_FAULTS[fault]
    make_fault(monkeypatch)
    rc = cli(args)
    monkeypatch.undo()
    captured = capsys.readouterr()
    assert rc == 2
    assert_one_line(rc, captured.out, captured.err, pattern)
    finished = [p for p in out.rglob("*") if p.is_file()]
    assert not [p for p in finished if p.name.endswith(".tmp")], "a temporary file was left behind"
    assert not [p for p in finished if p.suffix in (".csv", ".pt", ".png") or p.name == "manifest.json"], finished


def test_a_real_read_only_folder_is_one_line(files, tmp_path, capsys):
    """Without simulation where the OS denies it (not as root, whom chmod does not stop)."""
    if os.geteuid() == 0:
        pytest.skip("root writes into a read-only folder; the simulated EACCES cases cover this")
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o500)
    try:
        rc = cli(writers(files, out)["prompts"])
    finally:
        out.chmod(0o700)
    captured = capsys.readouterr()
    assert_one_line(rc, captured.out, captured.err, r"cannot write .*ro/prompts\.csv: permission denied")
