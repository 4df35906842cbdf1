"""Every config key is checked before the first job (issue #52): a walk over workflow/schemas/config.schema.yaml
finds every key a rule can read, and each must have a case here whose bad value `validate_config` (what
`lantern check-config` and the Snakefile run) refuses in one line naming that key. A key added to the schema
without such a case fails test_every_schema_key_has_a_bad_value_case; a case whose value passes (the key's check
is missing or too loose) fails test_each_bad_value_is_refused_naming_its_key.

Where the config check goes beyond the schema (files, codebooks, batch boundaries, ...), the case uses that check;
keys of the llamagen world whose file checks need a llamagen config are held by tests/test_bad_inputs.py's file
cases, and here by their type."""
import json
import re
from pathlib import Path

import pytest
import yaml

from lantern.errors import UserError
from lantern.pipeline.config import load_schema, merge_config, validate_config

REPO = Path(__file__).resolve().parents[1]
BASE = yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def schema_keys(node: dict, path: tuple = ()) -> list[str]:
    """Dotted keys of the schema's leaves: an object with named properties is walked; anything else (a value, a
    list, a free-form group such as toy.vq, which its dataclass checks) is one key."""
    props = node.get("properties")
    if props and node.get("type") == "object":
        return [k for name, sub in props.items() for k in schema_keys(sub, (*path, name))]
    return [".".join(path)]


def at(key: str, value) -> dict:
    """{'a': {'b': value}} for 'a.b'."""
    for part in reversed(key.split(".")):
        value = {part: value}
    return value


def sweep(**kw) -> dict:
    return {"sweep": kw}


# key -> (override merged over config/config.yaml, regex the one error line must match)
BAD = {
    "outdir": ({"outdir": "/"}, r"config: outdir = / is the filesystem root"),
    "seed": (at("seed", "x"), r"config: seed = 'x' has the wrong type"),
    "device": (at("device", "mps"), r"config: device = 'mps': mps devices are not supported"),
    "compile": (at("compile", "sometimes"), r"config: compile = 'sometimes' is not allowed"),
    "dtype": (at("dtype", "fp8"), r"config: dtype = 'fp8' is not allowed"),
    "threads": (at("threads", -1), r"config: threads: -1 is less than the minimum of 0"),
    "world": (at("world", "imagenet"), r"config: world = 'imagenet' is not allowed"),
    "toy.checkpoints": (at("toy.checkpoints", "download"), r"config: toy\.checkpoints = 'download' is not allowed"),
    "toy.data.n_train": (at("toy.data.n_train", 0), r"config: toy\.data\.n_train: 0 is less than the minimum"),
    "toy.data.n_val": (at("toy.data.n_val", 0), r"config: toy\.data\.n_val: 0 is less than the minimum"),
    "toy.vq": (at("toy.vq", {"codebook": 64}), r"config: toy\.vq: unknown key toy\.vq\.codebook"),
    "toy.target.checkpoint_every": (at("toy.target.checkpoint_every", -1), r"toy\.target\.checkpoint_every: -1"),
    "toy.target.extra_images": (at("toy.target.extra_images", -1), r"toy\.target\.extra_images: -1"),
    "toy.clean_vq": (at("toy.clean_vq", {"codebook": 64}), r"config: toy\.vq \(with toy\.clean_vq, clean world\)"),
    "toy.clean_target.extra_images": (at("toy.clean_target.extra_images", -1), r"toy\.clean_target\.extra_images: -1"),
    "toy.drafter.checkpoint_every": (at("toy.drafter.checkpoint_every", -1), r"toy\.drafter\.checkpoint_every: -1"),
    "toy.drafter.unroll": (at("toy.drafter.unroll", 0), r"toy\.drafter\.unroll: 0 is less than the minimum"),
    "toy.drafter.feature_layers": (at("toy.drafter.feature_layers", [99]), r"config: toy\.drafter .*99"),
    "toy.clip": (at("toy.clip", {"width": 8}), r"config: toy\.clip: unknown key toy\.clip\.width"),
    "toy.classifier": (at("toy.classifier", {"depth": 3}), r"config: toy\.classifier: unknown key"),
    "toy.ambiguity": (at("toy.ambiguity", {"samples": 3}), r"config: toy\.ambiguity: unknown key"),
    "toy.clean_world": (at("toy.clean_world", "yes"), r"config: toy\.clean_world = 'yes' has the wrong type"),
    "chameleon.family": (at("chameleon.family", "llamagen"), r"config: chameleon\.family = 'llamagen' is not allowed"),
    "chameleon.target": (at("chameleon.target", 3), r"config: chameleon\.target = 3 has the wrong type"),
    "chameleon.drafter": (at("chameleon.drafter", 3), r"config: chameleon\.drafter = 3 has the wrong type"),
    "chameleon.vqgan_ckpt": (at("chameleon.vqgan_ckpt", 3), r"config: chameleon\.vqgan_ckpt = 3 has the wrong"),
    "chameleon.vqgan_yaml": (at("chameleon.vqgan_yaml", 3), r"config: chameleon\.vqgan_yaml = 3 has the wrong"),
    "chameleon.tokenizer": (at("chameleon.tokenizer", 3), r"config: chameleon\.tokenizer = 3 has the wrong type"),
    "chameleon.pixels": (at("chameleon.pixels", 500), r"config: chameleon\.pixels: 500 is not a multiple of 16"),
    "chameleon.prompt_tokens": (at("chameleon.prompt_tokens", 2), r"chameleon\.prompt_tokens: 2 is less than"),
    "chameleon.prompts.coco_captions": (at("chameleon.prompts.coco_captions", 3), r"chameleon\.prompts\.coco_captions"),
    "chameleon.prompts.caption_list": (at("chameleon.prompts.caption_list", 3), r"chameleon\.prompts\.caption_list"),
    "chameleon.prompts.tsv": (at("chameleon.prompts.tsv", 3), r"chameleon\.prompts\.tsv = 3 has the wrong type"),
    "chameleon.prompts.sjd": (at("chameleon.prompts.sjd", "yes"), r"chameleon\.prompts\.sjd = 'yes' has the wrong"),
    "llamagen.model_type": (at("llamagen.model_type", "t2v"), r"config: llamagen\.model_type = 't2v' is not allowed"),
    "llamagen.gpt_ckpt": (at("llamagen.gpt_ckpt", 3), r"config: llamagen\.gpt_ckpt = 3 has the wrong type"),
    "llamagen.gpt_size": (at("llamagen.gpt_size", "GPT-M"), r"config: llamagen\.gpt_size: 'GPT-M' is not valid"),
    "llamagen.image_size": (at("llamagen.image_size", 300), r"config: llamagen\.image_size = 300 is not allowed"),
    "llamagen.downsample": (at("llamagen.downsample", 4), r"config: llamagen\.downsample = 4 is not allowed"),
    "llamagen.cls_token_num": (at("llamagen.cls_token_num", 0), r"llamagen\.cls_token_num: 0 is less than"),
    "llamagen.num_classes": (at("llamagen.num_classes", 0), r"llamagen\.num_classes: 0 is less than"),
    "llamagen.vq_ckpt": (at("llamagen.vq_ckpt", 3), r"config: llamagen\.vq_ckpt = 3 has the wrong type"),
    "llamagen.drafter_ckpt": (at("llamagen.drafter_ckpt", 3), r"config: llamagen\.drafter_ckpt = 3 has the wrong"),
    "llamagen.authors_drafter": (at("llamagen.authors_drafter", 3), r"llamagen\.authors_drafter = 3 has the wrong"),
    "llamagen.pad_semantics": (at("llamagen.pad_semantics", "left"), r"llamagen\.pad_semantics = 'left' is not"),
    "llamagen.prompts.file": (at("llamagen.prompts.file", 3), r"llamagen\.prompts\.file = 3 has the wrong type"),
    "llamagen.prompts.coco_captions": (at("llamagen.prompts.coco_captions", 3), r"llamagen\.prompts\.coco_captions"),
    "llamagen.t5.path": (at("llamagen.t5.path", 3), r"config: llamagen\.t5\.path = 3 has the wrong type"),
    "llamagen.t5.features": (at("llamagen.t5.features", 3), r"config: llamagen\.t5\.features = 3 has the wrong"),
    "llamagen.t5.max_length": (at("llamagen.t5.max_length", 0), r"llamagen\.t5\.max_length: 0 is less than"),
    "llamagen.t5.dtype": (at("llamagen.t5.dtype", "fp16"), r"config: llamagen\.t5\.dtype = 'fp16' is not allowed"),
    "llamagen.drafter.images": (at("llamagen.drafter.images", 3), r"llamagen\.drafter\.images = 3 has the wrong"),
    "llamagen.drafter.layout": (at("llamagen.drafter.layout", "grid"), r"llamagen\.drafter\.layout = 'grid' is not"),
    "llamagen.drafter.n_images": (at("llamagen.drafter.n_images", 1), r"llamagen\.drafter\.n_images: 1 is less"),
    "llamagen.drafter.shards": (at("llamagen.drafter.shards", 0), r"llamagen\.drafter\.shards: 0 is less"),
    "llamagen.drafter.train.checkpoint_every": (at("llamagen.drafter.train.checkpoint_every", -1),
                                                r"llamagen\.drafter\.train\.checkpoint_every: -1"),
    "llamagen.drafter.train.unroll": (at("llamagen.drafter.train.unroll", 0), r"llamagen\.drafter\.train\.unroll: 0"),
    "llamagen.drafter.train.feature_layers": (at("llamagen.drafter.train.feature_layers", [-1]),
                                              r"llamagen\.drafter\.train\.feature_layers\[0\]: -1 is less"),
    "neighbours.metric": (at("neighbours.metric", "l1"), r"config: neighbours\.metric = 'l1' is not allowed"),
    "neighbours.max_k": (at("neighbours.max_k", 4000), r"config: neighbours\.max_k = 4000 exceeds the codebook's"),
    "sampling.cfg_scale": (at("sampling.cfg_scale", 0.5), r"config: sampling\.cfg_scale: 0\.5 is less than"),
    "sampling.cfg_interval": (at("sampling.cfg_interval", -2), r"config: sampling\.cfg_interval: -2 is less than"),
    "sampling.temperature": (at("sampling.temperature", 0), r"config: sampling\.temperature: 0 is less than or equal"),
    "sampling.top_k": (at("sampling.top_k", -1), r"config: sampling\.top_k: -1 is less than"),
    "sampling.top_p": (at("sampling.top_p", 1.5), r"config: sampling\.top_p: 1\.5 is greater than"),
    "sweep.n_images": (sweep(n_images=1, shards=2), r"config: sweep\.shards = 2 is more than sweep\.n_images = 1"),
    "sweep.mode_images.greedy": (sweep(mode_images={"greedy": 1}, n_images=8),
                                 r"config: sweep\.mode_images\.greedy = 1 gives each greedy point 1 image"),
    "sweep.mode_images.sampling": (sweep(mode_images={"sampling": 1}),
                                   r"config: sweep\.mode_images\.sampling = 1 gives each sampling point 1 image"),
    "sweep.shards": (sweep(shards=0), r"config: sweep\.shards: 0 is less than the minimum of 1"),
    "sweep.control_seed": (sweep(control_seed="x"), r"config: sweep\.control_seed = 'x' has the wrong type"),
    "sweep.batch_size.greedy": (sweep(batch_size={"greedy": 0}), r"config: sweep\.batch_size\.greedy: 0 is less"),
    "sweep.batch_size.sampling": (sweep(batch_size={"sampling": 0}), r"config: sweep\.batch_size\.sampling: 0 is"),
    "sweep.latency_images": (sweep(latency_images=3), r"config: sweep\.latency_images = 3 must be a multiple"),
    "sweep.in_job_vanilla": (sweep(in_job_vanilla="yes"), r"config: sweep\.in_job_vanilla = 'yes' has the wrong"),
    "sweep.in_job_vanilla_every": (sweep(in_job_vanilla_every=0), r"config: sweep\.in_job_vanilla_every: 0 is less"),
    "sweep.modes": (sweep(modes=["sampling", "sampling"]), r"config: sweep\.modes lists sampling twice"),
    "sweep.methods": (sweep(methods=[]), r"config: sweep\.methods is empty"),
    "metrics.fid_extractor": (at("metrics.fid_extractor", "inception"),
                              r"config: metrics\.fid_extractor = 'inception' is not allowed"),
    "metrics.inception_weights": ({"metrics": {"fid_extractor": "inception-v3-compat",
                                               "inception_weights": "/no/such/pt_inception.pth"}},
                                  r"config: metrics\.inception_weights = /no/such/pt_inception\.pth does not exist"),
    "metrics.clip_model": (at("metrics.clip_model", 3), r"config: metrics\.clip_model = 3 has the wrong type"),
    "metrics.clip_ckpt": ({"metrics": {"clip_model": "ViT-B-32", "fid_extractor": "inception-v3-compat",
                                       "inception_weights": str(REPO / "config" / "config.yaml"),
                                       "clip_ckpt": "/no/such/clip.bin"}},
                          r"config: metrics\.clip_ckpt = /no/such/clip\.bin does not exist"),
    "metrics.prompt_prefix": (at("metrics.prompt_prefix", 3), r"config: metrics\.prompt_prefix = 3 has the wrong"),
    "metrics.reference": (at("metrics.reference", 3), r"config: metrics\.reference = 3 has the wrong type"),
    "metrics.resolution": (at("metrics.resolution", -1), r"config: metrics\.resolution: -1 is less than"),
    "metrics.resize_filter": (at("metrics.resize_filter", "nearest"), r"metrics\.resize_filter = 'nearest' is not"),
    "metrics.vgg16_weights": (at("metrics.vgg16_weights", "/no/such/vgg16.pt"),
                              r"config: metrics\.vgg16_weights = /no/such/vgg16\.pt does not exist"),
    "metrics.class_names": (at("metrics.class_names", "/no/such/names.txt"),
                            r"config: metrics\.class_names = /no/such/names\.txt does not exist"),
    "metrics.bootstrap": (at("metrics.bootstrap", 1), r"config: metrics\.bootstrap = 1 gives no spread"),
    "metrics.bootstrap_chunk": (at("metrics.bootstrap_chunk", 0), r"config: metrics\.bootstrap_chunk: 0 is less"),
    # the toy world is class-conditional: HPS v2.1 has no prompt to score against (its weights file: test_config.py)
    "metrics.hpsv2.enabled": (at("metrics.hpsv2.enabled", True),
                              r"config: metrics\.hpsv2\.enabled: .* toy world here is class-conditional"),
    "metrics.hpsv2.model": (at("metrics.hpsv2.model", 3), r"config: metrics\.hpsv2\.model = 3 has the wrong type"),
    "metrics.hpsv2.weights_path": (at("metrics.hpsv2.weights_path", 3),
                                   r"config: metrics\.hpsv2\.weights_path = 3 has the wrong type"),
    "metrics.hpsv2.batch_size": (at("metrics.hpsv2.batch_size", 0), r"config: metrics\.hpsv2\.batch_size: 0 is less"),
    "proximity.enabled": (at("proximity.enabled", "yes"), r"config: proximity\.enabled = 'yes' has the wrong type"),
    "proximity.fractions": (at("proximity.fractions", [0.5, 2]), r"config: proximity\.fractions\[1\]: 2 is greater"),
    "proximity.ranks": (at("proximity.ranks", [1, 5000]), r"config: proximity\.ranks holds 5000, but the toy-default"),
    "proximity.n_images": (at("proximity.n_images", 3), r"config: proximity\.n_images: 3 is less than the minimum"),
    "proximity.seed": (at("proximity.seed", 0.5), r"config: proximity\.seed = 0\.5 has the wrong type"),
    "proximity.strip_images": (at("proximity.strip_images", 0), r"config: proximity\.strip_images: 0 is less"),
    "proximity.strip_fraction": (at("proximity.strip_fraction", 2), r"config: proximity\.strip_fraction: 2 is greater"),
    "proximity.decide_fraction": (at("proximity.decide_fraction", -1), r"proximity\.decide_fraction: -1 is less"),
}


def test_every_schema_key_has_a_bad_value_case():
    keys = schema_keys(load_schema())
    missing = [k for k in keys if k not in BAD]
    assert not missing, (f"config key(s) {missing} have no case here: add a bad value that check-config refuses "
                         "naming the key (and the check, in lantern.pipeline.config, that refuses it)")
    assert sorted(set(BAD) - set(keys)) == [], "cases for keys the schema no longer has"


@pytest.mark.parametrize("key", list(BAD))
def test_each_bad_value_is_refused_naming_its_key(key):
    override, pattern = BAD[key]
    cfg = merge_config(json.loads(json.dumps(BASE)), override)
    with pytest.raises(UserError) as e:
        validate_config(cfg)
    line = str(e.value)
    assert "\n" not in line and re.search(pattern, line), (pattern, line)
