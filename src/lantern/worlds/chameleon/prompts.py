"""Chameleon-family prompts: each family's template around the caption's tokens, and the authors' prompt sets.

Templates (token ids; `BPE(s)` = tokenizers' encode(s, add_special_tokens=False)):
- Anole (LANTERN's ea_model_anole.generate): cond = [<s>] + BPE(caption) + [<reserved08706>, <racm3:break>],
  uncond = [<s>, <racm3:break>]; then 32 x 32 image tokens (512 px).
- Lumina-mGPT-7B-768 (its item processor, the EAGLE path): cond = [<s>] + BPE("Generate an image of 768x768
  according to the following prompt:\\n" + caption + "<reserved08706>") + [<racm3:break>, s, s] with s the size
  token <reserved08824> (24 patches of 32 px), uncond = [<racm3:break>, s, s] (the `sequential` CFG mode).
Decisions where the sources could not be checked here (no released tokenizer file):
- BPE adds no BOS: Meta's Chameleon code prepends BOS itself before its own tokenize_text, so its tokenizer file
  adds none; we encode without special tokens and prepend the vocabulary's <s> (checked to be id 0, as the
  authors hard-code). A file whose post-processor would add one changes nothing here.
- "<reserved08706>" is encoded inside the text, as Lumina's code does; the tokenizer must read it as the one added
  token 8710 (the encoding is checked to end there; a file that splits it is one error line).
Prompt sets, each as (id, caption) rows, the id being the row index (the authors name images prompt_{i}.png):
PartiPrompts (`PartiPrompts.tsv`, 1632 rows, column Prompt), SJDPrompts (`sjd_prompts()`, the 10 prompts of
LANTERN's `data/prompts/SJDPrompts.tsv`, which `read_prompt_tsv` also reads), MS-COCO val2017's longest captions
as the authors' preprocess.py writes them (`captions_val2017_longest.json`, a JSON list of 5000 strings; made from
captions_val2017.json by lantern.worlds.llamagen.prompts.coco_longest, the same rule).
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from lantern.errors import UserError
from lantern.worlds.chameleon.tokenizer import Vocab, size_token
from lantern.worlds.llamagen.prompts import checked_rows

FAMILIES = ("anole", "lumina-mgpt")
LUMINA_TEMPLATE = "Generate an image of {size}x{size} according to the following prompt:\n"
END_OF_TURN = "<reserved08706>"
PATCH = 32  # Lumina-mGPT's size tokens count 32-px patches

# SJDPrompts as the LANTERN authors' data/prompts/SJDPrompts.tsv lists them (their `--prompt SJDPrompts`), in its
# order. SJD's own script holds a longer list in another order, with small differences in wording.
SJD_PROMPTS = (
    "A hawk-man with a red head",
    "A masterpiece of oil painting about the starry sky",
    "Macro photography of a transparent water drop in the shape of a cat.",
    "A Corgi dog in 2D logo style, simple texture, clean background, facial- and eye-symmetry.",
    "Most beautiful anime artwork, a most cute anime girl, double exposure, iridescent nebula galaxy, black "
    "background, ethereal glow, bloom, hdr, high-quality, 8K",
    "A cool furry black monkey meditates on the clean wet ground, in the dusk, the golden sunset is shining on the "
    "ground on one side and the other side, high-quality, 8K, facial-symmetry",
    "a cool man with a beautiful face wearing a yellow suit stands in the Mountain, the most Professional "
    "high-quality 8K photograph",
    "Most beautiful girl (with deep red iris, short white hair, and a sly smile) wearing purple clothes and a hood. "
    "eye-symmetry, facial-symmetry, 8K, high quality, realistic",
    "a giant golden flying saucer firing lasers from the bottom, scorching the ground, the most Fantasy "
    "high-quality photos",
    "one typical zebra's upper body in the grassland, not occluded by grass, the zebra has only two ears, clear "
    "striped pattern, the most Professional high-quality 8K photograph, clear texture, sharp-focus, Exquisite "
    "details",
)


def _family(family: str) -> str:
    if family not in FAMILIES:
        raise UserError(f"unknown Chameleon family {family!r}; choose one of {', '.join(FAMILIES)}")
    return family


def _bpe(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False).ids)


def size_id(tokenizer, vocab: Vocab, pixels: int) -> int:
    """Lumina-mGPT's size token id for an image side of `pixels` (768 -> <reserved08824> = 8828)."""
    if pixels % PATCH:
        raise UserError(f"Lumina-mGPT image size {pixels} is not a multiple of {PATCH} px")
    name, expected = size_token(pixels // PATCH), 8804 + pixels // PATCH
    got = tokenizer.token_to_id(name)
    if got is None:
        raise UserError(f"tokenizer {vocab.source} has no size token {name} for {pixels} px")
    if got != expected:
        raise UserError(f"tokenizer {vocab.source} has {name} at id {got}, not {expected} (reserved k has id k + 4)")
    return got


def uncond_ids(family: str, vocab: Vocab, tokenizer=None, pixels: int = 768) -> list[int]:
    """The CFG uncond row the authors run: Anole [<s>, <racm3:break>]; Lumina-mGPT [<racm3:break>, s, s]."""
    boi = vocab.id("<racm3:break>")
    if _family(family) == "anole":
        return [vocab.id("<s>"), boi]
    s = size_id(tokenizer, vocab, pixels)
    return [boi, s, s]


def prompt_ids(family: str, caption: str, tokenizer, vocab: Vocab, pixels: int = 768) -> list[int]:
    """The cond row's prefix for one caption, up to and including the tokens before the first image token."""
    bos, sep, boi = vocab.id("<s>"), vocab.id(END_OF_TURN), vocab.id("<racm3:break>")
    if _family(family) == "anole":
        return [bos] + _bpe(tokenizer, caption) + [sep, boi]
    text = _bpe(tokenizer, LUMINA_TEMPLATE.format(size=pixels) + caption + END_OF_TURN)
    if not text or text[-1] != sep:
        raise UserError(f"tokenizer {vocab.source} does not read {END_OF_TURN} as the single token {sep}; it is not "
                        "Lumina-mGPT's tokenizer.json")
    s = size_id(tokenizer, vocab, pixels)
    return [bos] + text + [boi, s, s]


# -- prompt sets --------------------------------------------------------------------------------------------------

def sjd_prompts() -> list[tuple[str, str]]:
    """SJDPrompts as (row index, prompt), without a file."""
    return [(str(i), p) for i, p in enumerate(SJD_PROMPTS)]


def _missing(path: Path, flag: str, what: str) -> UserError:
    if path.is_dir():
        return UserError(f"{flag} {path} is a folder, not a file; give {what} inside it")
    return UserError(f"{flag} {path} does not exist; give the path of {what}")


def read_prompt_tsv(path: str | Path, flag: str = "--tsv") -> list[tuple[str, str]]:
    """(row index, Prompt) of a prompt TSV with a Prompt column (PartiPrompts.tsv, SJDPrompts.tsv), read as the
    authors do (csv.DictReader, tab-delimited, default quoting)."""
    path = Path(path)
    if not path.is_file():
        raise _missing(path, flag, "a TSV with a Prompt column (PartiPrompts.tsv / SJDPrompts.tsv)")
    where = f"{flag} {path}"
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f, delimiter="\t")
            if "Prompt" not in (reader.fieldnames or []):
                raise UserError(f"{where} has no Prompt column (header: {', '.join(reader.fieldnames or []) or 'none'})"
                                "; give PartiPrompts.tsv or SJDPrompts.tsv")
            rows = [(str(r), row["Prompt"] or "") for r, row in enumerate(reader)]
    except UnicodeDecodeError:
        raise UserError(f"{where} is not UTF-8 text") from None
    except csv.Error as e:
        raise UserError(f"{where} is not a readable TSV ({e})") from None
    return checked_rows(rows, where)


def read_caption_list(path: str | Path, flag: str = "--captions") -> list[tuple[str, str]]:
    """(row index, caption) of a JSON list of caption strings: the authors' captions_val2017_longest.json."""
    path = Path(path)
    if not path.is_file():
        raise _missing(path, flag, "captions_val2017_longest.json (a JSON list of captions)")
    where = f"{flag} {path}"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{where} is not a JSON file ({type(e).__name__})") from None
    if not isinstance(data, list) or not all(isinstance(c, str) for c in data):
        raise UserError(f"{where} is not a JSON list of caption strings (as the authors' preprocess.py writes); for "
                        "MS-COCO's own captions_val2017.json use `lantern prompts --coco`")
    return checked_rows([(str(i), c) for i, c in enumerate(data)], where)


def prompt_set(kind: str, path: str | Path | None = None, flag: str | None = None) -> list[tuple[str, str]]:
    """(id, caption) rows of a prompt set: coco_captions (MS-COCO's captions_val2017.json, the longest caption per
    image as the authors' preprocess.py picks it), caption_list (their captions_val2017_longest.json), tsv
    (PartiPrompts.tsv / SJDPrompts.tsv) or sjd (SJDPrompts, no file)."""
    from lantern.worlds.llamagen.prompts import coco_longest

    readers = {"coco_captions": coco_longest, "caption_list": read_caption_list, "tsv": read_prompt_tsv}
    if kind == "sjd":
        return sjd_prompts()
    if kind not in readers:
        raise UserError(f"prompt set {kind!r} is not one of {', '.join([*readers, 'sjd'])}")
    return readers[kind](path, flag) if flag else readers[kind](path)


def main(argv: list[str]) -> None:
    """`lantern chameleon-prompts`: a Chameleon run's prompt table (id,caption; row i captions image i) from one of
    the authors' prompt sets, written as `lantern prompts` writes it."""
    from lantern.worlds.llamagen.prompts import first_n, write_prompts

    ap = argparse.ArgumentParser(prog="lantern chameleon-prompts", description=main.__doc__)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--coco", help="MS-COCO captions annotation file (captions_val2017.json)")
    src.add_argument("--caption-list", help="the authors' captions_val2017_longest.json (a JSON list of captions)")
    src.add_argument("--tsv", help="a prompt TSV with a Prompt column (PartiPrompts.tsv, SJDPrompts.tsv)")
    src.add_argument("--sjd", action="store_true", help="SJDPrompts (the 10 prompts of the authors' list)")
    ap.add_argument("--n", type=int, help="keep the first N prompts (default: all)")
    ap.add_argument("--out", required=True, help="prompt table CSV (id,caption)")
    a = ap.parse_args(argv)
    kind, path, flag = next((k, p, f) for k, p, f in (("coco_captions", a.coco, "--coco"),
                                                      ("caption_list", a.caption_list, "--caption-list"),
                                                      ("tsv", a.tsv, "--tsv"), ("sjd", None, "--sjd")) if p or k == "sjd")
    rows = first_n(prompt_set(kind, path, flag), a.n, f"{flag} {path}" if path else flag)
    write_prompts(rows, a.out)
    print(f"wrote {len(rows)} prompts to {a.out}")
