"""`lantern figure NAME`: one paper figure from the tidy tables (`lantern tables`), drawn in the shared style.

Figures read only the tables under --tables (and the ambiguity dump for `ambiguity`, the `lantern proximity` CSVs
and image strips for `proximity`); `samples` also reads the generated PNGs under --gen. Each figure lives in its own module with a `Params` dataclass (set via --params) and
`plot(inputs, params) -> Figure`.
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass, field, fields
from pathlib import Path

from lantern.errors import UserError
from lantern.io import read_structured

FIGURES = ["ambiguity", "tau_vs_delta", "tradeoff", "heatmap", "tree_depth", "tree_budget", "samples", "acceptance_map", "proximity",
           "round_anatomy"]


@dataclass
class Inputs:
    tables: Path | None = None
    gen: Path | None = None
    ambiguity: list[str] = field(default_factory=list)  # WORLD=FILE or FILE
    mode: str | None = None
    proximity: list[str] = field(default_factory=list)  # `lantern proximity` CSVs
    strips: list[str] = field(default_factory=list)  # WORLD=PNG strips of `lantern proximity`


def parse_params(cls, text: str | None):
    raw = read_structured(text)
    known = {f.name for f in fields(cls)}
    for key in raw:
        if key not in known:
            raise UserError(f"--params: unknown key {key!r} for this figure; allowed: {', '.join(sorted(known)) or 'none'}")
    return cls(**raw)


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="lantern figure", description=__doc__)
    ap.add_argument("name", choices=FIGURES)
    ap.add_argument("--tables", help="folder with sweep.csv, positions.csv, depths.csv, rounds.csv")
    ap.add_argument("--gen", help="generation folder <outdir>/gen (samples only)")
    ap.add_argument("--ambiguity", nargs="+", default=[], metavar="WORLD=FILE",
                    help="per-step ambiguity files (`lantern ambiguity --steps-out`), each named by its world")
    ap.add_argument("--mode", help="draw one decoding mode only (greedy or sampling)")
    ap.add_argument("--proximity", nargs="+", default=[], help="`lantern proximity` CSVs (proximity only)")
    ap.add_argument("--strip", nargs="+", default=[], metavar="WORLD=PNG", help="their image strips (proximity only)")
    ap.add_argument("--style", help="matplotlib style file (default: the package's lantern.mplstyle)")
    ap.add_argument("--params", help="figure parameters (JSON/YAML or file)")
    ap.add_argument("--out", required=True, help="output image (.png, .pdf or .svg)")
    return ap.parse_args(argv)


def main(argv: list[str]) -> None:
    a = parse_args(argv)
    from lantern.figures import style

    style.check_out(a.out)
    module = importlib.import_module(f"{__name__}.{a.name}")
    params = parse_params(module.Params, a.params)
    inputs = Inputs(Path(a.tables) if a.tables else None, Path(a.gen) if a.gen else None,
                    a.ambiguity, a.mode, a.proximity, a.strip)
    style.use(a.style)
    fig = module.plot(inputs, params)
    style.save(fig, a.out)
    print(f"wrote {a.out}")
