"""docs/python.md runs: every ```python block in order, in one namespace, in a scratch folder, so the page cannot
rot. Two blocks stand for the reader's own things, and say so on their first line: the one binding file paths gets
tiny upstream-layout stand-ins of the same names (tests/tiny_llamagen.py), and the one building models with
LlamaGen's own code runs as written, against stand-in `autoregressive.models.gpt` / `tokenizer...vq_model`
modules whose GPT_models["GPT-B"] and VQ_models["VQ-16"] build the upstream-style classes of
tests/upstream_llamagen.py at small widths (LlamaGen's code is not installed here)."""
import ast
import re
import sys
import types
from pathlib import Path

import pytest
import torch

from lantern.pipeline import cli
from tiny import one_thread  # noqa: F401 (fixture)
from tiny_chameleon import write_world
from tiny_llamagen import SIZE, UpstreamVQ, released_like_vq, write_released_like
from upstream_llamagen import ModelArgs, Transformer

DOC = Path(__file__).resolve().parents[1] / "docs" / "python.md"
FILES_MARK = "# Your files."
MODELS_MARK = "# Your models, built by LlamaGen's own code."
CHAMELEON_MARK = "# Your Chameleon files."


def python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)


def bound_names(code: str) -> set[str]:
    """The names a block binds at its top level."""
    names = set()
    for node in ast.parse(code).body:
        if isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def llamagen_modules(monkeypatch) -> None:
    """Stand-ins for LlamaGen's own modules: GPT-B and VQ-16 at the small widths of the stand-in files."""
    def gpt_b(**kw):
        return Transformer(ModelArgs(**SIZE, **kw))

    def vq_16(codebook_size: int = 16384, codebook_embed_dim: int = 8):
        vq = released_like_vq()
        assert (vq.args.codebook_size, vq.args.codebook_embed_dim) == (codebook_size, codebook_embed_dim)
        return UpstreamVQ(vq)

    for name, attrs in (("autoregressive", {}), ("autoregressive.models", {}),
                        ("autoregressive.models.gpt", {"GPT_models": {"GPT-B": gpt_b}}), ("tokenizer", {}),
                        ("tokenizer.tokenizer_image", {}),
                        ("tokenizer.tokenizer_image.vq_model", {"VQ_models": {"VQ-16": vq_16}})):
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, module)


@pytest.mark.slow  # about 13 s on 2 cores: the toy world's blocks decode some 30 images
def test_every_python_block_of_the_page_runs(tmp_path, monkeypatch, capsys, one_thread):  # noqa: F811
    blocks = python_blocks()
    assert len(blocks) >= 8
    marked = [b for b in blocks if b.startswith((FILES_MARK, MODELS_MARK, CHAMELEON_MARK))]
    assert len(marked) == 3, "the files blocks and the models block start with their marks"

    files = write_released_like(tmp_path / "files")
    table = tmp_path / "files" / "l2_K200.pt"
    assert cli.main(["neighbours", "--vq", files["vq_ckpt"], "--out", str(table), "--params", '{"k": 200}']) == 0
    stand_in = {"GPT_CKPT": files["gpt_ckpt"], "VQ_CKPT": files["vq_ckpt"], "DRAFTER": files["drafter_ckpt"],
                "AUTHORS_DRAFTER": files["authors_drafter"], "NEIGHBOURS": str(table), "SIZE": SIZE}
    chameleon = write_world(tmp_path / "chameleon")  # a 4 x 4 grid at 64 px (the tiny VQGAN draws 8 x 8)
    stand_ins = {FILES_MARK: stand_in, CHAMELEON_MARK: {
        "LUMINA": chameleon["target"], "VQGAN": chameleon["vqgan_ckpt"], "TOKENIZER": chameleon["tokenizer"],
        "LUMINA_DRAFTER": chameleon["drafter"], "PIXELS": 64}}
    llamagen_modules(monkeypatch)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "python_md"}
    for i, code in enumerate(blocks):
        mark = next((m for m in stand_ins if code.startswith(m)), None)
        if mark:
            assert bound_names(code) == set(stand_ins[mark]), "the stand-ins bind exactly the names the block binds"
            namespace.update(stand_ins[mark])
            continue
        exec(compile(code, f"docs/python.md block {i + 1}", "exec"), namespace)
    printed = capsys.readouterr().out
    assert (tmp_path / "ring.png").is_file() and (tmp_path / "grid.png").is_file()
    assert "lantern-chain-g4-d0.1-k3 tau " in printed
    assert "method.delta = -0.1 must be >= 0" in printed
    assert "method.k = 500 is larger than neighbours.max_k = 200" in printed
    assert isinstance(namespace["gpt"], Transformer) and namespace["out"].pixels.shape == (1, 256, 256, 3)
    assert torch.equal(namespace["world"].target.output.weight, namespace["gpt"].output.weight)
    assert namespace["lumina"].layout.rows == 4 and namespace["cat"].pixels.shape == (1, 8, 8, 3)
    assert f"{namespace['cat'].point} (1, 8, 8, 3) tau " in printed
