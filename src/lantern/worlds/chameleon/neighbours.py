"""`lantern chameleon-neighbours`: `lantern neighbours` on Chameleon's VQGAN, its codebook read through the
layout's reader (vqgan.ckpt checked against vqgan.yaml: 8192 x 256 raw rows), built by the authors' rule with
`--params '{"metric": "l2", ...}'` (raw Euclidean, self excluded, nearest first; docs/chameleon-files.md).

    lantern chameleon-neighbours --vq tokenizer/vqgan.ckpt [--vqgan-yaml tokenizer/vqgan.yaml] --out table.pt \\
        --params '{"metric": "l2", "k": 1001}'
"""

from __future__ import annotations

import argparse

from lantern.engine.rules.neighbours import main as neighbours_main
from lantern.worlds.chameleon.vqgan import read_codebook


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="lantern chameleon-neighbours", add_help=False, allow_abbrev=False)
    ap.add_argument("--vqgan-yaml", default=None, help="vqgan.yaml (default: beside --vq)")
    a, rest = ap.parse_known_args(argv)
    neighbours_main(rest, lambda path: read_codebook(path, a.vqgan_yaml), prog="lantern chameleon-neighbours")
