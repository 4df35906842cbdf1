"""The `lantern` console script: each subcommand lives in its own module as `main(argv)`."""

from __future__ import annotations

import importlib
import sys

from .errors import UserError

# subcommand -> module exposing main(argv: list[str]) -> None
COMMANDS = {
    "check-config": "lantern.config",
    "make-data": "lantern.data",
    "train-vq": "lantern.train_vq",
    "tokenize": "lantern.vq",
    "train-gpt": "lantern.train_gpt",
    "ambiguity": "lantern.ambiguity",
    "neighbours": "lantern.neighbours",
    "train-drafter": "lantern.drafter",
    "sample": "lantern.sample",
    "encode-images": "lantern.llamagen.images",
    "convert": "lantern.llamagen.convert",
    "train-clip": "lantern.metrics.train_clip",
    "evaluate": "lantern.metrics.evaluate",
    "speed": "lantern.metrics.speed",
    "tables": "lantern.tables",
    "figure": "lantern.figures",
    "prompts": "lantern.llamagen.prompts",
    "encode-captions": "lantern.llamagen.captions",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: lantern <command> [options]\n\ncommands:\n  " + "\n  ".join(sorted(COMMANDS)))
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"error: unknown command {name!r}; choose one of: {', '.join(sorted(COMMANDS))}", file=sys.stderr)
        return 2
    try:
        importlib.import_module(COMMANDS[name]).main(rest)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
