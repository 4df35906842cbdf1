"""Chameleon's token vocabulary: the image-code <-> token-id map and the structural tokens, read from the tokenizer
file (Meta's `text_tokenizer.json`, Anole; the HF folder's `tokenizer.json`, Lumina-mGPT) through `tokenizers`.

Image tokens are named `IMGIMG` + the code's decimal digits written as letters (A = 0 ... J = 9) + `Z`, e.g. code
8191 -> IMGIMGIBJBZ. Every LANTERN code path assumes id = code + 4 (Anole maps by sorted order, Lumina by the names;
the two agree only then), so the map is built from the names and checked against that rule at load: a vocabulary
where they disagree is one error line, never a silently shifted image. The structural ids the authors hard-code
(BOS 0, <racm3:break> 8197, ...) are likewise looked up by name and checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from lantern.errors import UserError

IMAGE_PREFIX, IMAGE_SUFFIX = "IMGIMG", "Z"
IMAGE_OFFSET = 4  # id of code 0: ids 0..3 are <s>, <pad>, </s>, <unk>
# name -> the id the authors' code hard-codes for it
STRUCTURAL = {
    "<s>": 0,                   # BOS (the authors prepend id 0; the HF config's bos_token_id is not used)
    "<pad>": 1,                 # left padding of CFG rows
    "<eoss>": 8196,             # end of image
    "<racm3:break>": 8197,      # begin of image
    "<reserved08706>": 8710,    # end of turn: closes the prompt
    "<reserved08799>": 8803,    # Lumina-mGPT: end of an image row
}
SIZE_TOKEN_BASE = 8800  # Lumina-mGPT: <reserved{8800 + n}> (id 8804 + n) = an image side of n 32-px patches


def code_of_name(name: str) -> int | None:
    """The code an image token's name spells (IMGIMG<A-J letters>Z), or None for any other token."""
    if not (name.startswith(IMAGE_PREFIX) and name.endswith(IMAGE_SUFFIX)):
        return None
    letters = name[len(IMAGE_PREFIX):-len(IMAGE_SUFFIX)]
    if not letters or any(not "A" <= c <= "J" for c in letters):
        return None
    return int("".join(str(ord(c) - ord("A")) for c in letters))


def name_of_code(code: int) -> str:
    return IMAGE_PREFIX + "".join(chr(ord("A") + int(d)) for d in str(code)) + IMAGE_SUFFIX


def size_token(patches: int) -> str:
    """Lumina-mGPT's size token for an image side of `patches` 32-px patches (768 px: 24 -> <reserved08824>)."""
    return f"<reserved{SIZE_TOKEN_BASE + patches:05d}>"


@dataclass(frozen=True)
class Vocab:
    """What generation needs of a Chameleon vocabulary: the image codes' ids and the structural ids, checked."""

    size: int            # ids 0 .. size - 1 (the embedding rows the vocabulary names)
    num_codes: int       # image tokens: codes 0 .. num_codes - 1 at ids IMAGE_OFFSET .. IMAGE_OFFSET + num_codes - 1
    ids: dict            # STRUCTURAL name -> id, for the names the vocabulary holds
    source: str = ""

    def id(self, name: str) -> int:
        if name not in self.ids:
            raise UserError(f"tokenizer {self.source} has no token {name}; it is not a Chameleon vocabulary")
        return self.ids[name]

    def code_to_id(self, codes: torch.Tensor) -> torch.Tensor:
        return codes + IMAGE_OFFSET

    def id_to_code(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids of image tokens -> codes; any other id is a ValueError (a structural token left in a grid)."""
        codes = ids - IMAGE_OFFSET
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= self.num_codes):
            raise ValueError(f"token ids outside the image tokens {IMAGE_OFFSET}..{IMAGE_OFFSET + self.num_codes - 1}")
        return codes


def vocab_from_mapping(mapping: dict[str, int], source: str = "<vocabulary>") -> Vocab:
    """Check a {name: id} vocabulary (tokenizers' get_vocab, or a ChameleonConfig's vocabulary_map) and build the Vocab:
    every image token at id = code + 4, codes 0..N-1 with none missing, the structural tokens at the authors' ids."""
    codes = {}
    for name, i in mapping.items():
        code = code_of_name(name)
        if code is not None:
            if code in codes:
                raise UserError(f"tokenizer {source} names image code {code} twice ({name_of_code(code)} at ids "
                                f"{codes[code]} and {i}); it is not a Chameleon vocabulary")
            codes[code] = i
    if not codes:
        raise UserError(f"tokenizer {source} has no image tokens ({IMAGE_PREFIX}...{IMAGE_SUFFIX}); give Chameleon's "
                        "text_tokenizer.json (Anole) or the model folder's tokenizer.json (Lumina-mGPT)")
    missing = next((c for c in range(len(codes)) if c not in codes), None)
    if missing is not None:
        raise UserError(f"tokenizer {source} lacks image code {missing} ({name_of_code(missing)}) among its "
                        f"{len(codes)} image tokens; codes must run 0..N-1")
    wrong = next((c for c in sorted(codes) if codes[c] != c + IMAGE_OFFSET), None)
    if wrong is not None:
        raise UserError(f"tokenizer {source} puts image code {wrong} ({name_of_code(wrong)}) at id {codes[wrong]}, "
                        f"not {wrong + IMAGE_OFFSET} (code + {IMAGE_OFFSET}), which the authors' code and ours assume")
    ids = {}
    for name, expected in STRUCTURAL.items():
        if name in mapping:
            if mapping[name] != expected:
                raise UserError(f"tokenizer {source} has {name} at id {mapping[name]}, not {expected} as the authors' "
                                "code hard-codes; it is not the released Chameleon vocabulary")
            ids[name] = mapping[name]
    return Vocab(size=max(mapping.values()) + 1, num_codes=len(codes), ids=ids, source=source)


def load_tokenizer(path: str | Path):
    """A `tokenizers.Tokenizer` from a tokenizer JSON file, or from a folder holding tokenizer.json or
    text_tokenizer.json (the HF model folder; Meta's tokenizer folder)."""
    from tokenizers import Tokenizer

    path = Path(path)
    if path.is_dir():
        found = [path / n for n in ("tokenizer.json", "text_tokenizer.json") if (path / n).is_file()]
        if not found:
            raise UserError(f"tokenizer folder {path} holds neither tokenizer.json nor text_tokenizer.json")
        path = found[0]
    if not path.is_file():
        raise UserError(f"tokenizer {path} does not exist; give Chameleon's text_tokenizer.json or the model "
                        "folder's tokenizer.json")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 - tokenizers raises its own Exception types for every malformed file
        detail = (str(e).strip().splitlines() or [type(e).__name__])[0][:120]
        raise UserError(f"tokenizer {path} is not a tokenizers JSON file ({detail})") from None


def load_vocab(path: str | Path) -> tuple[object, Vocab]:
    """(tokenizer, checked Vocab) of a tokenizer file or folder."""
    tok = load_tokenizer(path)
    return tok, vocab_from_mapping(tok.get_vocab(with_added_tokens=True), str(path))
