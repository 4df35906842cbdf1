"""The `lantern` console script: each subcommand lives in its own module as `main(argv)`."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from lantern.errors import UserError

# subcommand -> module exposing main(argv: list[str]) -> None
COMMANDS = {
    "check-config": "lantern.pipeline.config",
    "make-data": "lantern.worlds.toy.data",
    "train-vq": "lantern.worlds.toy.train_vq",
    "tokenize": "lantern.worlds.toy.tokenize",
    "train-gpt": "lantern.worlds.toy.train_gpt",
    "ambiguity": "lantern.metrics.ambiguity",
    "proximity": "lantern.metrics.proximity",
    "neighbours": "lantern.engine.rules.neighbours",
    "chameleon-neighbours": "lantern.worlds.chameleon.neighbours",
    "methods": "lantern.engine.methods",
    "train-drafter": "lantern.pipeline.train_drafter",
    "sample": "lantern.pipeline.sample",
    "encode-images": "lantern.worlds.llamagen.images",
    "convert": "lantern.worlds.llamagen.convert",
    "train-clip": "lantern.metrics.train_clip",
    "train-classifier": "lantern.metrics.train_classifier",
    "evaluate": "lantern.metrics.evaluate",
    "speed": "lantern.metrics.speed",
    "tables": "lantern.pipeline.tables",
    "figure": "lantern.figures",
    "prompts": "lantern.worlds.llamagen.prompts",
    "chameleon-prompts": "lantern.worlds.chameleon.prompts",
    "encode-captions": "lantern.worlds.llamagen.captions",
    "generate": "lantern.cli_generate",
}


# Snakemake rules send a job's stdout and stderr to its log (`> {log} 2>&1`); on a full disk that log cannot take
# the error. The rules' shell prefix keeps Snakemake's own stderr open as this descriptor, so the one line reaches
# the user whatever happened to the log.
ERROR_FD = "LANTERN_ERROR_FD"
SHELL_PREFIX = f"exec 3>&2; export {ERROR_FD}=3; "


def report(line: str) -> None:
    """The job's one error line: to the descriptor the rule kept for it (if any), then to stderr (the log)."""
    fd = os.environ.get(ERROR_FD, "")
    if fd.isdigit():
        try:
            os.write(int(fd), f"{line}\n".encode())
        except OSError:  # not open in this process (a command run by hand with the variable set): stderr remains
            pass
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:  # stderr is the log, on the full disk
        pass


def _one_line(parser: argparse.ArgumentParser, message: str):
    # argparse prints its usage block and exits; every user error of the CLI is one line instead
    raise UserError(f"{parser.prog}: {message}; see {parser.prog} --help")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: lantern <command> [options]\n\ncommands:\n  " + "\n  ".join(sorted(COMMANDS)))
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"error: unknown command {name!r}; choose one of: {', '.join(sorted(COMMANDS))}", file=sys.stderr)
        return 2
    # for this command only: a test or script that calls main() in-process keeps argparse's own errors afterwards
    default_error, argparse.ArgumentParser.error = argparse.ArgumentParser.error, _one_line
    try:
        importlib.import_module(COMMANDS[name]).main(rest)
    except UserError as e:
        report(f"error: {e}")
        return 2
    except OSError as e:  # a full or unwritable disk outside lantern.io's atomic writes (a job's own folders)
        from lantern.io import disk_error

        error = disk_error(e)
        if error is None:
            raise
        report(f"error: {error}")
        return 2
    finally:
        argparse.ArgumentParser.error = default_error
    return 0


if __name__ == "__main__":
    sys.exit(main())
