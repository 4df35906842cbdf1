"""Every figure reads at a glance: no two series of one axes (or of one legend) look alike.

A series is an artist a reader must match to a legend entry: a labelled line, scatter or histogram in an axes, or
an entry of an axes' or the figure's legend. Two series with different labels must differ in colour, marker or
line style; otherwise the legend cannot tell them apart (proximity's m = 1 and m = 200 once shared a colour when
its colour list wrapped). Unlabelled artists are not series: bands, reference lines without a legend entry, points
named by a number beside them (tradeoff), images.

Every figure of `lantern figure` is drawn from test_figures.py's synthetic sweep; proximity also from a table with
the default config's ranks (more ranks than any fixed colour list the figure might have had)."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from matplotlib import colors
from matplotlib.collections import PathCollection
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.legend import Legend

from lantern.engine import methods
from lantern.figures import FIGURES, Inputs, style
from lantern.figures.proximity import rank_label
from lantern.figures.style import DRAFT_MARKERS, color, marker
from lantern.metrics.proximity import RANDOM
from test_figures import args_for, sweep  # noqa: F401  (the module fixture: the synthetic sweep's tables)

REPO = Path(__file__).resolve().parents[1]


def _colour(c) -> tuple:
    rgba = colors.to_rgba(c)
    return tuple(round(v, 3) for v in rgba[:3])


def _dashes(artist) -> str:
    """The line style as drawn: '-' solid, a dash pattern otherwise (custom dash tuples all report '--')."""
    ls = artist.get_linestyle()
    if ls in ("None", "none", " ", "", None):
        return "none"
    offset, pattern = getattr(artist, "_unscaled_dash_pattern", (0, None))
    return ls if pattern is None else f"{ls}{tuple(pattern)}"


def look(artist) -> tuple | None:
    """What the eye sees of a series (colour, marker, line style), None for an entry that draws nothing."""
    if isinstance(artist, Line2D):
        mark = artist.get_marker()
        mark = None if mark in (None, "None", "none", "", " ") else str(mark)
        dashes = _dashes(artist)
        if mark is None and dashes == "none":
            return None  # a text-only legend row (tradeoff's numbered point names)
        c = artist.get_markerfacecolor() if dashes == "none" else artist.get_color()
        if dashes == "none" and colors.to_rgba(c)[3] == 0:
            c = artist.get_markeredgecolor()
        return ("line", _colour(c), mark, dashes)
    if isinstance(artist, PathCollection):
        face = artist.get_facecolor()
        c = face[0] if len(face) and face[0][3] > 0 else artist.get_edgecolor()[0]
        path = artist.get_paths()[0].vertices.round(3)
        return ("points", _colour(c), path.tobytes(), None)
    if isinstance(artist, Patch):
        filled = artist.get_fill() and artist.get_facecolor()[3] > 0
        c = artist.get_facecolor() if filled else artist.get_edgecolor()
        return ("patch", _colour(c), (round(artist.get_alpha() or 1, 2),), _dashes(artist))
    return None


def series(ax) -> list[tuple[str, object]]:
    """(label, artist) of the labelled lines, scatters and histograms of one axes."""
    found = [*ax.get_lines(), *ax.collections, *ax.patches]
    return [(a.get_label(), a) for a in found if a.get_label() and not a.get_label().startswith("_")]


def legend_entries(legend: Legend) -> list[tuple[str, object]]:
    return [(t.get_text(), h) for t, h in zip(legend.get_texts(), legend.legend_handles) if h is not None]


def clashes(entries: list[tuple[str, object]]) -> list[str]:
    seen: dict[tuple, str] = {}
    out = []
    for label, artist in entries:
        key = look(artist)
        if key is None:
            continue
        if key in seen and seen[key] != label:
            out.append(f"{seen[key]!r} and {label!r} share colour {key[1]}, marker and line style")
        seen.setdefault(key, label)
    return out


def figure_clashes(fig) -> list[str]:
    out = []
    for i, ax in enumerate(fig.axes):
        where = f"axes {i} ({ax.get_title()!r})"
        out += [f"{where}: {c}" for c in clashes(series(ax))]
        if ax.get_legend() is not None:
            out += [f"{where} legend: {c}" for c in clashes(legend_entries(ax.get_legend()))]
    for legend in fig.legends:
        out += [f"figure legend: {c}" for c in clashes(legend_entries(legend))]
    return out


def draw(name: str, argv: list[str]):
    """The figure `lantern figure NAME argv` would save, still open (main closes it once saved)."""
    import importlib

    from lantern.figures import parse_args

    a = parse_args([name, *argv, "--out", "unused.png"])
    module = importlib.import_module(f"lantern.figures.{name}")
    style.use()
    inputs = Inputs(Path(a.tables) if a.tables else None, Path(a.gen) if a.gen else None, a.ambiguity, a.mode,
                    a.proximity, a.strip)
    return module.plot(inputs, module.Params())


@pytest.mark.parametrize("name", FIGURES)
def test_no_two_series_look_alike(sweep, name):  # noqa: F811
    fig = draw(name, args_for(name, sweep))
    assert figure_clashes(fig) == []


def test_proximity_at_the_default_ranks(tmp_path):
    """The default config's ranks (8 with the random control): each its own colour, ordered nearest to farthest
    along one colour map, the random control apart from them all."""
    ranks = [str(m) for m in yaml.safe_load((REPO / "config" / "config.yaml").read_text())["proximity"]["ranks"]]
    assert len(ranks) > 7  # more than the old colour list held before it wrapped
    pd.DataFrame([{"world": "toy-default", "fraction": f, "m": m, "fd": f * (i + 1), "fd_noise_halves": 0.02,
                   "feature_cosine": 1 - f * i / 10, "psnr": 40 - 2 * i * f if f else float("inf"), "n_images": 10,
                   "extractor": "toyclip", "strip_fraction": 0.25}
                  for f in (0.0, 0.5, 1.0) for i, m in enumerate(ranks)]).to_csv(tmp_path / "p.csv", index=False)
    fig = draw("proximity", ["--proximity", str(tmp_path / "p.csv")])
    assert figure_clashes(fig) == []
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    assert set(lines) == {rank_label(m, ranks) for m in ranks}
    # an ordered map: lightness rises with the rank, the nearest darkest and the farthest lightest, far apart
    light = [np.dot([0.2126, 0.7152, 0.0722], colors.to_rgb(lines[rank_label(m, ranks)].get_color()))
             for m in ranks if m != RANDOM]
    assert light == sorted(light) and light[-1] - light[0] > 0.5
    assert [rank_label(m, ranks) for m in ("1", "200")] == ["m = 1 (nearest)", "m = 200 (farthest)"]


def test_figure_with_clashing_series_is_caught():
    """The check fails on the old proximity colours: the first and the seventh rank shared one colour."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    old = ["#0072B2", "#009E73", "#E69F00", "#CC79A7", "#56B4E9", "#D55E00"]
    for i, m in enumerate(["1", "5", "10", "20", "50", "100", "200"]):
        ax.plot([0, 1], [i, i + 1], color=old[i % len(old)], marker="o", label=f"m = {m}")
    ax.legend()
    found = figure_clashes(fig)
    plt.close(fig)
    assert len(found) == 2 and all("'m = 1' and 'm = 200'" in f for f in found)


def test_every_family_and_drafting_kind_has_its_own_look():
    """tradeoff tells families by colour and drafting kinds by marker: every registered one gets its own, so a
    sweep of every method (the default config's) has no two legend entries alike either."""
    family_colours = [_colour(color(f)) for f in methods.FAMILIES]
    assert len(set(family_colours)) == len(family_colours)
    kinds = ["none", *methods.DRAFTINGS]
    assert len({marker(k) for k in kinds}) == len(kinds), {k: marker(k) for k in kinds}
    assert set(DRAFT_MARKERS) <= set(kinds)
