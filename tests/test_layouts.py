"""One way in for every released layout (lantern.worlds.layouts): each layout has one reader under its world's folder
returning (spec, state dict); only the readers open released files; the engine builds every model in one place; and
the Python API, `lantern convert` and the config check all call the same reader."""
import ast
import importlib
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from lantern.engine.models.chameleon import Chameleon
from lantern.engine.models.chameleon_load import chameleon_from_hf, drafter_from_authors
from lantern.engine.models.checkpoint import build, save_checkpoint
from lantern.engine.models.drafter import Drafter, build_drafter
from lantern.engine.models.model import GPT
from lantern.engine.models.vq import VQModel
from lantern.engine.models.vqgan import VQGAN, build_vqgan
from lantern.errors import UserError
from lantern.worlds.layouts import LAYOUTS, reader
from test_convert import authors_drafter, hf_config, upstream_to_hf, write_drafter_folder, write_hf_folder
from test_chameleon_decoding import authors_state
from test_chameleon_vq import random_state_dict, write_vqgan
from tiny import one_thread, tiny_target  # noqa: F401 (fixture)
from tiny_chameleon import hf_logits, hf_model
from tiny_llamagen import TINY_VQ, UpstreamVQ, upstream_gpt

pytestmark = pytest.mark.usefixtures("one_thread")

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "lantern"
# What opens a released file or reads a config out of one: found in a call, it must stand in a reader.
OPENERS = {"read_hf", "target_state_dict", "extract_state_dict", "read_checkpoint", "target_args", "file_args",
           "safe_open", "load_file", "torch.load"}
# The engine reads its own files (its models' checkpoint helpers, drafter files) and one tensor of a VQ file: the
# method registry's relaxed rules read the codebook by key, memory-mapped, below the worlds.
ENGINE_OWN = ("lantern.engine.models.", "lantern.io")
ALSO = {("lantern.engine.rules.neighbours", "read_codebook")}
BUILDERS = {"load_weights", "no_init"}  # making a model from a state dict: only the engine's build does it


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def calls(names: set[str]):
    """(module, enclosing top-level function, name) of every call of one of `names` in the package."""
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        tree = ast.parse(path.read_text())
        for top in tree.body:
            for node in ast.walk(top):
                if not isinstance(node, ast.Call):
                    continue
                f = node.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "torch":
                    name = f"torch.{f.attr}"
                if name in names:
                    yield module, getattr(top, "name", "<module>"), name


def reader_modules() -> set[str]:
    return {layout.reader.split(":")[0] for layout in LAYOUTS.values()}


def test_every_layout_has_one_reader_under_its_worlds_folder_and_an_engine_class():
    models = PACKAGE / "engine" / "models"
    engine_classes = {name for path in models.glob("[a-z]*.py")
                      for name in dir(importlib.import_module(f"lantern.engine.models.{path.stem}"))}
    for name, layout in LAYOUTS.items():
        module, function = layout.reader.split(":")
        assert module.startswith("lantern.worlds.") and module.count(".") == 3, (name, module)
        assert callable(reader(name)) and reader(name).__name__ == function
        assert layout.builds in engine_classes, (name, layout.builds)
    assert len({layout.reader for layout in LAYOUTS.values()}) == len(LAYOUTS)  # one reader per layout


def test_only_the_readers_open_released_files():
    allowed = reader_modules()
    stray = [c for c in calls(OPENERS) if c[0] not in allowed and not c[0].startswith(ENGINE_OWN) and c[:2] not in ALSO]
    assert stray == []


def test_only_the_engine_builds_models_from_state_dicts():
    assert [c for c in calls(BUILDERS) if not c[0].startswith("lantern.engine.models.")] == []


# -- every layout: a tiny file of it -> (spec, state dict) -> the engine's build; a broken key is one line -------------
def _gpt_file(tmp_path):
    target = tiny_target("t2i")
    save_checkpoint(tmp_path / "gpt.pt", target, args=target.args.to_dict())
    return target, (tmp_path / "gpt.pt",), "tok_embeddings.weight"


def _upstream_gpt_file(tmp_path):  # weights only: the spec comes from the caller and the shapes
    target = tiny_target("c2i")
    save_checkpoint(tmp_path / "gpt.pt", target)
    spec = {"gpt_size": {"dim": 32, "n_layer": 2, "n_head": 2}, "num_classes": 4, "image_tokens": 16}
    return target, (tmp_path / "gpt.pt", spec), "tok_embeddings.weight"


def _vq_file(tmp_path):
    torch.manual_seed(0)
    vq = VQModel(TINY_VQ).eval()
    save_checkpoint(tmp_path / "vq.pt", vq, args=asdict(TINY_VQ))
    return vq, (tmp_path / "vq.pt",), "quantize.embedding.weight"


def _gpt_object(tmp_path):
    model = upstream_gpt()
    return model, (model, {}, "gpt_ckpt (a Transformer object)"), "tok_embeddings.weight"


def _vq_object(tmp_path):
    torch.manual_seed(0)
    model = UpstreamVQ(VQModel(TINY_VQ).eval())
    return model, (model, "vq_ckpt (an UpstreamVQ object)"), "quantize.embedding.weight"


def _authors_target(tmp_path):
    target = tiny_target("t2i")
    hf = upstream_to_hf({k: v.clone() for k, v in target.state_dict().items()})
    return target, (write_hf_folder(tmp_path / "hf", hf, hf_config(target)),), "lm_head.weight"


CHAMELEON_LAYOUT = dict(cls_token_num=8, image_tokens=12, image_codes=16, uncond_prompt=(0, 21))


def _chameleon_target(tmp_path):  # one model.safetensors (the sharded folders: tests/test_chameleon_model.py)
    model = hf_model()
    model.save_pretrained(tmp_path / "anole")
    return model, (tmp_path / "anole",), "lm_head.weight"


def _vqgan(tmp_path):  # a Lightning container with training keys and a pickled class, as released
    sd = random_state_dict()
    return sd, (write_vqgan(tmp_path / "tokenizer", sd), tmp_path / "tokenizer" / "vqgan.yaml"), \
        "quantize.embedding.weight"


CASES = {"llamagen-gpt": _gpt_file, "llamagen-vq": _vq_file, "llamagen-gpt-object": _gpt_object,
         "llamagen-vq-object": _vq_object, "lantern-authors-target": _authors_target,
         "chameleon-target": _chameleon_target, "chameleon-vqgan": _vqgan}
KWARGS = {"chameleon-target": CHAMELEON_LAYOUT}  # the family's layout, which config.json does not say
DRAFTERS = {"lantern-authors-drafter", "chameleon-authors-drafter"}  # read for a target: tests below


def read_and_build(name, arguments):
    """The layout's reader, then the engine's one build for its class."""
    out = reader(name)(*arguments, **KWARGS.get(name, {}))
    builds = LAYOUTS[name].builds
    if builds == "Chameleon":
        args, sd, where = out
        return chameleon_from_hf(args, sd, arguments[0], where, dtype=torch.float64)
    spec, sd = out
    if builds == "VQGAN":
        return build_vqgan(spec, sd, *arguments)
    return build({"GPT": GPT, "VQModel": VQModel}[builds], spec, sd, name, None, "cpu")


def test_every_layout_has_a_case_here():
    assert set(CASES) | DRAFTERS == set(LAYOUTS)


@pytest.mark.parametrize("name", sorted(set(CASES) - {"chameleon-target"}))
def test_each_reader_returns_what_the_engine_builds_into_the_same_model(tmp_path, name):
    model, arguments, _ = CASES[name](tmp_path)
    built = read_and_build(name, arguments)
    assert isinstance(built, {"GPT": GPT, "VQModel": VQModel, "VQGAN": VQGAN}[LAYOUTS[name].builds])
    state = model if isinstance(model, dict) else model.state_dict()
    theirs = {k: v for k, v in state.items() if k in built.state_dict()}
    assert theirs.keys() == built.state_dict().keys()
    assert all(torch.equal(v, theirs[k]) for k, v in built.state_dict().items())


def test_the_chameleon_reader_builds_the_model_written(tmp_path):
    """HF keys and the rotate-half layout become the engine's: the same model is the same function (float64)."""
    hf, arguments, _ = _chameleon_target(tmp_path)
    built = read_and_build("chameleon-target", arguments)
    assert isinstance(built, Chameleon)
    assert torch.equal(built.tok_embeddings.weight, hf.model.embed_tokens.weight)
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(9)[None].expand(2, -1)
    _, full = hf_logits(hf, ids, pos)
    _, hidden = built.run(built.embed_cond(ids), pos)
    torch.testing.assert_close(built.full_logits(hidden), full.float(), atol=2e-6, rtol=1e-6)


def test_upstream_file_takes_its_spec_from_the_caller(tmp_path):
    model, arguments, _ = _upstream_gpt_file(tmp_path)
    args, _ = reader("llamagen-gpt")(*arguments)
    assert args == model.args
    with pytest.raises(UserError, match="llamagen.num_classes"):  # a spec the weights contradict: one line
        reader("llamagen-gpt")(arguments[0], {**arguments[1], "num_classes": 7})


@pytest.mark.parametrize("name", ["llamagen-gpt", "llamagen-vq", "lantern-authors-target", "chameleon-target",
                                  "chameleon-vqgan"])
def test_a_file_missing_a_key_is_one_line_naming_it(tmp_path, name):
    _, arguments, key = CASES[name](tmp_path)
    path = Path(arguments[0])
    if path.is_dir():  # an HF folder: rewrite its weights without the key
        from safetensors.torch import load_file, save_file

        sd = load_file(path / "model.safetensors")
        save_file({k: v for k, v in sd.items() if k != key}, path / "model.safetensors", metadata={"format": "pt"})
    else:  # our .pt files and upstream's hold "model"; a Lightning checkpoint holds "state_dict" (and a class)
        obj = torch.load(path, weights_only=False)
        obj["model" if "model" in obj else "state_dict"].pop(key)
        torch.save(obj, path)
    with pytest.raises(UserError) as e:
        read_and_build(name, arguments)
    assert "\n" not in str(e.value) and (key in str(e.value) or key.replace("lm_head", "output") in str(e.value))


def test_the_authors_drafter_reader_builds_a_drafter_for_its_target(tmp_path):
    target = tiny_target("t2i")
    weights = authors_drafter(target)
    options, sd = reader("lantern-authors-drafter")(write_drafter_folder(tmp_path / "d", weights, target), target.args)
    drafter = build_drafter(target.args, options, sd, target, "d")
    assert isinstance(drafter, Drafter) and set(sd) == set(drafter.trained_state())
    assert torch.equal(drafter.tok_embeddings.weight, weights["embed_tokens.weight"].float())
    assert torch.equal(drafter.output.weight, target.output.weight)


def test_the_authors_chameleon_drafter_reader_builds_a_drafter_for_its_target(tmp_path):
    import json

    target = read_and_build("chameleon-target", _chameleon_target(tmp_path)[1])
    sd, hf, _ = authors_state(target)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "config.json").write_text(json.dumps(dict(hf.config.to_dict(), num_hidden_layers=1, bias=True),
                                                           default=str))
    torch.save(sd, tmp_path / "d" / "pytorch_model.bin")
    cfg, read, where = reader("chameleon-authors-drafter")(tmp_path / "d")
    assert cfg["num_hidden_layers"] == 1 and set(where.values()) == {str(tmp_path / "d" / "pytorch_model.bin")}
    drafter = drafter_from_authors(read, tmp_path / "d", target, where)
    assert torch.equal(drafter.fc.weight, sd["fc.weight"]) and torch.equal(drafter.fc.bias, sd["fc.bias"])
    with pytest.raises(UserError, match=r"/d: missing tensor fc.bias") as e:
        drafter_from_authors({k: v for k, v in read.items() if k != "fc.bias"}, tmp_path / "d", target, where)
    assert "\n" not in str(e.value)


# -- the API, the CLI and the config check call the same reader ----------------------------------------------------------
def counting(monkeypatch, module: str, function: str) -> list:
    seen = []
    original = getattr(importlib.import_module(module), function)

    def wrapper(src, *a, **kw):
        seen.append(Path(src).name)
        return original(src, *a, **kw)

    monkeypatch.setattr(importlib.import_module(module), function, wrapper)
    return seen


def test_api_cli_and_config_check_read_the_authors_files_through_the_same_readers(tmp_path, monkeypatch):
    import lantern
    from lantern.pipeline.config_inputs import _target_args, check_authors_drafter
    from lantern.worlds.llamagen.convert import main as convert

    target = tiny_target("t2i", vocab_size=TINY_VQ.codebook_size)
    folder = write_hf_folder(tmp_path / "hf", upstream_to_hf(dict(target.state_dict())), hf_config(target))
    drafter = write_drafter_folder(tmp_path / "eagle", authors_drafter(target), target)
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "vq.pt", VQModel(TINY_VQ), args=asdict(TINY_VQ))
    targets = counting(monkeypatch, "lantern.worlds.llamagen.hf", "read_authors_target")
    drafters = counting(monkeypatch, "lantern.worlds.llamagen.hf", "read_authors_drafter")

    world = lantern.load_llamagen(gpt_ckpt=str(folder), vq_ckpt=str(tmp_path / "vq.pt"),
                                  authors_drafter=str(drafter), device="cpu")
    convert(["--kind", "target", "--src", str(folder), "--out", str(tmp_path / "gpt.pt")])
    convert(["--kind", "drafter", "--src", str(drafter), "--target", str(tmp_path / "gpt.pt"),
             "--out", str(tmp_path / "d.pt")])
    cfg = {"llamagen": {"gpt_ckpt": str(folder), "authors_drafter": str(drafter)}}
    check_authors_drafter(cfg, {}, authors_target=True)
    assert targets == ["hf"] * 3 and drafters == ["eagle"] * 3  # api, convert, check-config: each once
    assert world.target.args == _target_args(cfg, {}, authors_target=True)


def test_the_pipeline_loads_upstream_files_with_the_worlds_loader():
    from lantern.metrics import ambiguity, proximity
    from lantern.pipeline import sample
    from lantern.worlds.llamagen import upstream

    assert sample.load_gpt is ambiguity.load_gpt is upstream.load_gpt and proximity.load_vq is upstream.load_vq
