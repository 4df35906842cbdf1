"""workflow/scripts/readme_figures.py (`make readme-figures`): small PNGs for the README, traced to their run."""

import importlib.util
import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from lantern.errors import UserError

SCRIPT = Path(__file__).resolve().parents[1] / "workflow" / "scripts" / "readme_figures.py"
spec = importlib.util.spec_from_file_location("readme_figures", SCRIPT)
readme_figures = importlib.util.module_from_spec(spec)
spec.loader.exec_module(readme_figures)


def fake_results(root: Path) -> Path:
    (root / "figures").mkdir(parents=True)
    (root / "tables").mkdir()
    noise = np.random.default_rng(0).integers(0, 256, (120, 160, 3), dtype=np.uint8)  # compresses badly
    Image.fromarray(noise).save(root / "figures" / "tradeoff.png")
    Image.fromarray(noise[:, ::-1].copy()).save(root / "figures" / "samples_sampling.png")
    (root / "tables" / "sweep.csv").write_text("point,git_commit\nvanilla,c0ffee\nexact,c0ffee\n")
    return root


def test_figures_are_shrunk_under_the_budget_and_traced(tmp_path, monkeypatch):
    monkeypatch.setattr(readme_figures, "MAX_BYTES", 8_000)
    monkeypatch.setattr(readme_figures, "MIN_WIDTH", 50)
    results = fake_results(tmp_path / "results")
    readme_figures.main([str(results), str(tmp_path / "img")])
    source = json.loads((tmp_path / "img" / "SOURCE.json").read_text())
    assert source["results_git_commits"] == ["c0ffee"]
    for name in ("tradeoff.png", "samples.png"):
        data = (tmp_path / "img" / name).read_bytes()
        assert len(data) <= 8_000 and source["files"][name]["bytes"] == len(data)
        with Image.open(tmp_path / "img" / name) as im:
            assert im.width < 160 and (im.width, im.height) == (source["files"][name]["width"],
                                                                  source["files"][name]["height"])
    assert sorted(p.name for p in (tmp_path / "img").iterdir()) == ["SOURCE.json", "samples.png", "tradeoff.png"]


def test_a_figure_that_cannot_shrink_enough_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(readme_figures, "MAX_BYTES", 1_000)
    monkeypatch.setattr(readme_figures, "MIN_WIDTH", 100)
    with pytest.raises(UserError, match="no PNG of it 100 px or wider is under 1000 bytes"):
        readme_figures.main([str(fake_results(tmp_path / "results")), str(tmp_path / "img")])
    assert not (tmp_path / "img").exists()


def test_a_missing_run_writes_nothing(tmp_path):
    results = fake_results(tmp_path / "results")
    (results / "figures" / "samples_sampling.png").unlink()
    with pytest.raises(UserError, match="samples_sampling.png missing; run `make run` first"):
        readme_figures.main([str(results), str(tmp_path / "img")])
    assert not (tmp_path / "img").exists()


def test_the_palette_keeps_every_family_colour():
    """A figure with more colours than a palette holds (anti-aliased edges, bands) keeps each family's colour exact
    when shrunk to 256 colours: a median cut alone gave LANTERN and Cool-SD one colour."""
    from lantern.figures.style import FAMILY_COLORS, OTHER_COLORS

    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (200, 300, 3), dtype=np.uint8)  # every colour a palette could be spent on
    rgb = [tuple(int(c[i:i + 2], 16) for i in (1, 3, 5)) for c in [*FAMILY_COLORS.values(), *OTHER_COLORS]]
    for j, c in enumerate(rgb):
        image[10 * j:10 * j + 4, :4] = c  # a marker's few pixels
    shrunk = np.asarray(Image.open(io.BytesIO(readme_figures.png_bytes(Image.fromarray(image), palette=True)))
                        .convert("RGB"))
    assert [tuple(shrunk[10 * j + 1, 1]) for j in range(len(rgb))] == rgb
