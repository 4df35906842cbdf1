"""The docs name only real commands and real files.

Every command in README.md, docs/*.md and config/README.md that starts with `lantern`, `.venv/bin/lantern` or `make`
(in a code block, or an inline code span) must name a subcommand of the `lantern` console script or a Makefile
target, and every relative link or image must point at an existing file. Commands are parsed, never run.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from lantern.pipeline.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "config" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE = re.compile(r"`([^`\n]+)`")
# [text](target) and ![alt](target); an optional "title" after the target is dropped
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_SRC = re.compile(r"<(?:img|a)\s[^>]*(?:src|href)=\"([^\"]+)\"")
# a command ends at a shell comment or operator
SHELL_END = re.compile(r"\s(#|&&|\|\||;|\||>|<)(\s|$)")
MAKE_TARGET = re.compile(r"^([A-Za-z0-9_.-][A-Za-z0-9_. -]*?)\s*:(?![=:])")


def make_targets(makefile: Path = ROOT / "Makefile") -> set[str]:
    """Explicit targets of a Makefile: `name [name ...]:` at the start of a line (not `:=`, not a recipe line)."""
    targets = set()
    for line in makefile.read_text().splitlines():
        m = MAKE_TARGET.match(line)
        if m and not line.startswith("\t"):
            targets.update(t for t in m.group(1).split() if not t.startswith("."))
    return targets


def code_snippets(text: str):
    """(line number, code) for every line of a fenced block and every inline code span outside the blocks."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            yield number, line.strip().removeprefix("$ ")
        else:
            for span in INLINE.findall(line):
                yield number, span.strip()


def command_problem(code: str, commands, targets) -> str | None:
    """Why `code` names no real subcommand / target, or None (also None when it is not such a command)."""
    for segment in re.split(r"&&|;", code):
        segment = SHELL_END.split(" " + segment.strip(), maxsplit=1)[0].strip()
        try:
            words = shlex.split(segment)
        except ValueError:
            words = segment.split()
        if not words:
            continue
        head, rest = words[0], words[1:]
        if head in ("lantern", ".venv/bin/lantern"):
            if rest and not rest[0].startswith("-") and rest[0] not in commands:
                return f"`{head} {rest[0]}`: no such subcommand (lantern has: {', '.join(sorted(commands))})"
        elif head == "make":
            named = [w for w in rest if not w.startswith("-") and "=" not in w]
            wrong = [w for w in named if w not in targets]
            if wrong:
                return f"`make {wrong[0]}`: no such Makefile target (the Makefile has: {', '.join(sorted(targets))})"
    return None


def link_problems(text: str, where: Path) -> list[str]:
    problems = []
    for number, line in enumerate(text.splitlines(), 1):
        for target in LINK.findall(line) + HTML_SRC.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a web address or an anchor on the same page
            path = target.split("#", 1)[0]
            if not (where.parent / path).exists():
                problems.append(f"{where.name}:{number}: link {target!r} points at no file")
    return problems


def wrapped_spans(text: str, where: Path) -> list[str]:
    """Lines outside code blocks with an odd number of backticks: an inline span wrapped over two lines, which this
    check would not see whole."""
    fenced, problems = False, []
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and line.count("`") % 2:
            problems.append(f"{where.name}:{number}: an inline code span is wrapped over two lines; keep it on one")
    return problems


def doc_problems(text: str, where: Path, commands=COMMANDS, targets=None) -> list[str]:
    targets = make_targets() if targets is None else targets
    problems = [f"{where.name}:{number}: {problem}" for number, code in code_snippets(text)
                if (problem := command_problem(code, commands, targets))]
    return problems + wrapped_spans(text, where) + link_problems(text, where)


def test_the_docs_exist():
    names = {"decoders.md", "metrics.md", "gpu.md", "toy-world.md", "development.md"}
    assert names <= {p.name for p in DOCS}, DOCS


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_doc_commands_and_links_are_real(doc):
    assert doc_problems(doc.read_text(), doc) == []


def test_readme_shows_the_two_commands():
    text = (ROOT / "README.md").read_text()
    snippets = {code for _, code in code_snippets(text)}
    assert any(code.startswith("make run") for code in snippets)
    assert any(code.startswith("make test") for code in snippets)
    assert len(text.splitlines()) <= 130


def test_readme_tables_list_every_registered_method():
    from lantern.engine import methods

    rows = {line.split("|")[1].strip() for line in (ROOT / "README.md").read_text().splitlines()
            if line.startswith("| `")}
    for name in [*methods.FAMILIES, *methods.DRAFTINGS]:
        assert any(row.startswith(f"`{name}`") for row in rows), f"README's method tables miss `{name}`"


def test_makefile_targets_are_parsed():
    targets = make_targets()
    assert {"run", "test", "smoke", "readme-figures", "ship-toy"} <= targets
    assert not any(t.startswith(("$", ".")) or "=" in t for t in targets), targets


def test_a_misspelt_subcommand_is_reported():
    text = "Run\n\n```\n.venv/bin/lantern methds   # list them\nlantern sample --help\n```\n"
    problems = doc_problems(text, ROOT / "README.md")
    assert len(problems) == 1 and "`.venv/bin/lantern methds`" in problems[0] and "README.md:4" in problems[0]
    inline = doc_problems("see `lantern chek-config config/config.yaml` and `lantern.engine.model`", ROOT / "x.md")
    assert len(inline) == 1 and "chek-config" in inline[0]
    wrapped = doc_problems("see `lantern\nchek-config`\n", ROOT / "x.md")
    assert len(wrapped) == 2 and all("wrapped" in p for p in wrapped), wrapped


def test_a_misspelt_make_target_and_a_broken_link_are_reported():
    text = "`make CORES=2 runn` then ![fig](docs/img/nothing-here.png) and [ok](Makefile), [web](https://x.org/a.md)\n"
    problems = doc_problems(text, ROOT / "README.md")
    assert len(problems) == 2, problems
    assert "`make runn`" in problems[0]
    assert "docs/img/nothing-here.png" in problems[1]
    assert doc_problems("`make run CORES=2 && lantern methods | less`", ROOT / "README.md") == []
