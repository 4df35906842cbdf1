"""The look shared by every figure: the style file, colours per method family, markers per draft shape, saving."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display

import matplotlib.pyplot as plt  # noqa: E402

from lantern.engine import methods  # noqa: E402
from lantern.errors import UserError  # noqa: E402
from lantern.io import atomic_path  # noqa: E402

STYLE_FILE = Path(__file__).with_name("lantern.mplstyle")
FAMILY_COLORS = {"vanilla": "#555555", "exact": "#0072B2", "lantern": "#D55E00", "lanternpp": "#009E73"}
# families registered later (engine/methods.py) take the rest of the Okabe-Ito palette in registry order
OTHER_COLORS = ["#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"]
DRAFT_MARKERS = {"none": "*", "chain": "o", "static": "s", "dynamic": "^"}
FORMATS = {".png": "png", ".pdf": "pdf", ".svg": "svg"}


def use(style: str | Path | None = None) -> None:
    path = Path(style) if style else STYLE_FILE
    if not path.is_file():
        raise UserError(f"--style {path} does not exist; pass a matplotlib style file or leave --style out")
    plt.style.use(path)


def color(name: str) -> str:
    if name in FAMILY_COLORS:
        return FAMILY_COLORS[name]
    others = [f for f in methods.FAMILIES if f not in FAMILY_COLORS]
    return OTHER_COLORS[others.index(name) % len(OTHER_COLORS) if name in others else 0]


def marker(drafting: str) -> str:
    return DRAFT_MARKERS.get(drafting, "D")


def check_out(out: str | Path) -> Path:
    out = Path(out)
    if out.suffix.lower() not in FORMATS:
        raise UserError(f"--out {out} must end in {', '.join(FORMATS)}")
    return out


def save(fig, out: str | Path) -> None:
    out = check_out(out)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format=FORMATS[out.suffix.lower()])
    plt.close(fig)
