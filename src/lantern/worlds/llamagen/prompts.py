"""`lantern prompts`: the prompt table of a text-to-image run, a CSV with columns id,caption.

Row r of the table conditions image index r of every sweep point. Sources:
- a user file: CSV with columns id,caption (or caption alone: ids become "0", "1", ...), or JSONL with one
  {"id": ..., "caption": ...} object per line;
- an MS-COCO captions annotation file (captions_val2017.json), selected as the LANTERN authors did
  (their data/prompts/preprocess.py): for every image, its longest caption (len() of the raw text, nothing
  stripped; on a tie the caption listed first wins), images in the order they first appear in "annotations".
  val2017 gives 5000 prompts: the paper's "5000 longest captions". The id is the COCO image_id.
`--n N` keeps the first N rows (the paper's speed runs: the first 1000).
Captions are kept verbatim (trailing spaces, newlines): the T5 encoder's cleaning happens at encoding time.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from lantern.errors import UserError
from lantern.io import atomic_path

COLUMNS = ("id", "caption")


def checked_rows(rows: list[tuple[str, str]], where: str) -> list[tuple[str, str]]:
    if not rows:
        raise UserError(f"{where} holds no prompts; give a file with at least one caption")
    seen: dict[str, int] = {}
    for r, (pid, caption) in enumerate(rows):
        if not pid.strip():
            raise UserError(f"{where} row {r} has an empty id; give every prompt an id")
        if not caption.strip():
            raise UserError(f"{where} row {r} (id {pid!r}) has an empty caption; remove the row or write a caption")
        if pid in seen:
            raise UserError(f"{where} has the id {pid!r} twice (rows {seen[pid]} and {r}); ids must be unique")
        seen[pid] = r
    return rows


def _read_csv(path: Path, where: str) -> list[tuple[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        if "caption" not in header:
            raise UserError(f"{where} has no 'caption' column (found: {', '.join(header) or 'nothing'}); "
                            "write a header line id,caption")
        rows = []
        for r, row in enumerate(reader):
            if None in row or None in row.values():  # DictReader's marks of a row longer / shorter than the header
                raise UserError(f"{where} row {r} does not have the header's {len(header)} fields; "
                                "quote captions that contain commas")
            rows.append((row["id"] if "id" in header else str(r), row["caption"]))
    return rows


def _read_jsonl(path: Path, where: str) -> list[tuple[str, str]]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{where} line {n} is not JSON ({e.msg}); "
                                "write one {\"id\": ..., \"caption\": ...} object per line") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("caption"), str) \
                    or not isinstance(obj.get("id"), (str, int)) or isinstance(obj.get("id"), bool):
                raise UserError(f"{where} line {n} needs a string \"caption\" and a string or integer \"id\"")
            rows.append((str(obj["id"]), obj["caption"]))
    return rows


def read_user_prompts(path: str | Path, flag: str = "--file") -> list[tuple[str, str]]:
    """(id, caption) rows of a user CSV (.csv) or JSONL (.jsonl / .json) file."""
    path = Path(path)
    where = f"{flag} {path}"
    if not path.is_file():
        raise UserError(f"{where} is a folder, not a file; give the CSV (id,caption) or JSONL prompt file inside it"
                        if path.is_dir() else f"{where} does not exist; give a CSV (id,caption) or JSONL prompt file")
    try:
        rows = _read_jsonl(path, where) if path.suffix in (".jsonl", ".json") else _read_csv(path, where)
    except UnicodeDecodeError:
        raise UserError(f"{where} is not UTF-8 text; save it as UTF-8") from None
    except csv.Error as e:
        raise UserError(f"{where} is not a readable CSV ({e}); save it as a CSV of id,caption") from None
    return checked_rows(rows, where)


def coco_longest(path: str | Path, flag: str = "--coco") -> list[tuple[str, str]]:
    """(image_id, caption): each image's longest caption, images in order of first appearance (see module doc)."""
    path = Path(path)
    where = f"{flag} {path}"
    if not path.is_file():
        raise UserError(f"{where} is a folder, not a file; give MS-COCO's captions_val2017.json inside it" if path.is_dir()
                        else f"{where} does not exist; give the path of MS-COCO's captions_val2017.json")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{where} is not a JSON file ({type(e).__name__}); "
                        "give MS-COCO's captions_val2017.json") from None
    annotations = data.get("annotations") if isinstance(data, dict) else None
    if not isinstance(annotations, list) or not annotations:
        raise UserError(f"{where} has no \"annotations\" list; give an MS-COCO captions file (captions_val2017.json)")
    longest: dict[int, str] = {}  # insertion order = first appearance of the image
    for n, a in enumerate(annotations):
        if not isinstance(a, dict) or not isinstance(a.get("image_id"), int) or not isinstance(a.get("caption"), str):
            raise UserError(f"{where} annotation {n} lacks an integer image_id or a string caption")
        best = longest.get(a["image_id"])
        if best is None or len(a["caption"]) > len(best):
            longest[a["image_id"]] = a["caption"]
    return checked_rows([(str(i), c) for i, c in longest.items()], where)


def first_n(rows: list[tuple[str, str]], n: int | None, where: str) -> list[tuple[str, str]]:
    if n is None:
        return rows
    if n < 1:
        raise UserError(f"--n {n} must be a positive number of prompts")
    if len(rows) < n:
        raise UserError(f"--n {n} asks for more prompts than {where} holds ({len(rows)}); lower --n")
    return rows[:n]


def write_prompts(rows: list[tuple[str, str]], path: str | Path) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(COLUMNS)
            w.writerows(rows)


def read_prompts(path: str | Path, flag: str = "--prompts") -> list[tuple[str, str]]:
    """The (id, caption) rows of a prompt table (a CSV with id and caption columns, others ignored): row r is
    image index r."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{flag} {path} does not exist; write it with `lantern prompts`")
    where = f"{flag} {path}"
    try:
        with open(path, newline="", encoding="utf-8") as f:
            header = next(csv.reader(f), [])
        if not set(COLUMNS) <= set(header):
            raise UserError(f"{where} is not a prompt table (header {','.join(header) or 'empty'}, needs "
                            f"{' and '.join(COLUMNS)}); write it with `lantern prompts`")
        rows = _read_csv(path, where)
    except UnicodeDecodeError:
        raise UserError(f"{where} is not UTF-8 text; write it with `lantern prompts`") from None
    except csv.Error as e:
        raise UserError(f"{where} is not a readable CSV ({e}); write it with `lantern prompts`") from None
    return checked_rows(rows, where)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="lantern prompts", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--coco", help="MS-COCO captions annotation file (captions_val2017.json)")
    src.add_argument("--file", help="CSV (id,caption or caption) or JSONL ({\"id\", \"caption\"} per line)")
    ap.add_argument("--n", type=int, help="keep the first N prompts (default: all)")
    ap.add_argument("--out", required=True, help="prompt table CSV (id,caption)")
    a = ap.parse_args(argv)
    rows = coco_longest(a.coco) if a.coco else read_user_prompts(a.file)
    rows = first_n(rows, a.n, f"--coco {a.coco}" if a.coco else f"--file {a.file}")
    write_prompts(rows, a.out)
    print(f"wrote {len(rows)} prompts to {a.out}")
