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
DOCS = [ROOT / "README.md", ROOT / "config" / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
PAGES = sorted((ROOT / "docs").glob("*.md"))
NOT_YET_CUT: set[str] = set()  # pages exempt from the length and history checks while they are rewritten
MAX_LINES = 200

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


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but hyphens dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor of a page (outside code blocks); a repeated heading gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (m := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)):
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            seen.setdefault(f"{base}-{n}" if n else base, 1)
    return set(seen)


def link_problems(text: str, where: Path) -> list[str]:
    problems = []
    for number, line in enumerate(text.splitlines(), 1):
        for target in LINK.findall(line) + HTML_SRC.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue  # a web address
            path, _, anchor = target.partition("#")
            file = where if not path else where.parent / path
            if not file.exists():
                problems.append(f"{where.name}:{number}: link {target!r} points at no file")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
                problems.append(f"{where.name}:{number}: link {target!r} names no heading of {file.name}")
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
    inline = doc_problems("see `lantern chek-config config/config.yaml` and `lantern.engine.models.model`",
                          ROOT / "x.md")
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


def test_a_link_to_a_missing_heading_is_reported():
    assert anchors("# A page\n## How to add ...\n## The default: δ 0.1, k 3\n## Notes\n## Notes\n") == {
        "a-page", "how-to-add-", "the-default-δ-01-k-3", "notes", "notes-1"}
    ok = "see [there](docs/development.md#how-to-add-) and [here](#two-commands)"
    assert doc_problems(ok, ROOT / "README.md") == []
    problems = doc_problems("[gone](docs/toy-world.md#the-default-since-769fd08)", ROOT / "README.md")
    assert len(problems) == 1 and "names no heading of toy-world.md" in problems[0]


@pytest.mark.parametrize("page", [p for p in PAGES if p.name not in NOT_YET_CUT], ids=lambda p: p.name)
def test_a_page_of_docs_states_the_present_briefly(page):
    """At most MAX_LINES lines, and no commit named: which run or commit found what belongs in CHANGELOG.md (a hex
    run inside a file name, such as the Inception weights', is no commit)."""
    text = page.read_text()
    assert len(text.splitlines()) <= MAX_LINES, f"{page.name}: {len(text.splitlines())} lines"
    commits = [w for w in re.findall(r"(?<![-.\w])[0-9a-f]{7,40}(?![-.\w])", text) if re.search(r"[a-f]", w) and re.search(r"\d", w)]
    assert commits == [], f"{page.name} names commits {commits}: move that history to CHANGELOG.md"


def test_the_changelog_has_dated_entries_newest_first():
    text = (ROOT / "CHANGELOG.md").read_text()
    dates = re.findall(r"^## (\d{4}-\d{2}-\d{2})$", text, flags=re.M)
    assert len(dates) >= 5 and dates == sorted(dates, reverse=True)


def layout_modules(text: str) -> set[str]:
    """The modules docs/development.md's layout list names, as paths under src/lantern/: a bullet names a package
    (`engine/`) or top-level modules, and every `name.py` in it (or under a sub-package it names, `toy/`) is one."""
    section = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    found = set()
    for bullet in re.split(r"\n- ", section)[1:]:
        spans = re.findall(r"`([^`]+)`", bullet)
        package = spans[0] if spans and spans[0].endswith("/") and spans[0].count("/") == 1 else ""
        sub = ""
        if package:
            found.add(f"{package}__init__.py")  # a package named is its __init__.py
        for span in spans:
            if span.endswith("/") and package and span != package and span.count("/") == 1:
                sub = span  # a sub-package of the bullet's package: its modules follow
                found.add(f"{package}{sub}__init__.py")
            elif re.fullmatch(r"[a-z_][a-z0-9_]*\.py", span):
                found.add(f"{package}{sub}{span}")
    return found


def test_the_layout_list_matches_the_tree():
    """Every module under src/lantern is in docs/development.md's layout list, and every one listed exists."""
    src = ROOT / "src" / "lantern"
    tree = {str(p.relative_to(src)) for p in src.rglob("*.py") if "__pycache__" not in p.parts}
    listed = layout_modules((ROOT / "docs" / "development.md").read_text())
    assert sorted(listed - tree) == [], "listed in docs/development.md's layout but not in src/lantern"
    assert sorted(tree - listed) == [], "in src/lantern but not in docs/development.md's layout"


def test_the_layout_check_sees_a_missing_module():
    text = ("## Layout\n\n- `errors.py`, `io.py`.\n- `engine/`: `model.py`, `vq.py`.\n"
            "- `worlds/`: `toy/` (`data.py`)\n## Next\n")
    assert layout_modules(text) == {"errors.py", "io.py", "engine/__init__.py", "engine/model.py", "engine/vq.py",
                                    "worlds/__init__.py", "worlds/toy/__init__.py", "worlds/toy/data.py"}


def test_generated_tables_match_their_records():
    """Each page's generated tables equal what workflow/scripts/doc_tables.py writes from the committed records."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("doc_tables", ROOT / "workflow" / "scripts" / "doc_tables.py")
    doc_tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(doc_tables)
    for page, tables in doc_tables.TABLES.items():
        on_page = doc_tables.blocks((ROOT / "docs" / page).read_text())
        for name, make in tables.items():
            assert on_page.get(name) == make(), (
                f"docs/{page}'s table {name} differs from its records: run python workflow/scripts/doc_tables.py")
