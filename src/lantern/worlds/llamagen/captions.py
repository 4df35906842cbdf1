"""`lantern encode-captions`: FLAN-T5 caption features for rows [start, end) of a prompt table, as LlamaGen samples.

Upstream text-to-image sampling (LlamaGen language/t5.py and autoregressive/sample/sample_t2i.py) cleans each
caption (its T5Embedder text preprocessing, applied twice), tokenizes it to max_length 120 (padded to that
length, truncated, </s> appended), takes the T5 encoder's last hidden state, then left-pads: the valid rows move
to the end, the mask is flipped, padded rows are zeroed. Features come from a local T5 folder (--t5) or from
precomputed files in LlamaGen's own layout (--features DIR/<id>.npy, [1, L, C] of the valid rows only, as its
extract_t5_feature.py writes them; left-padded to max_length here, as its t2i dataset does at load time).

One file per shard, read by `lantern sample --captions` and the drafter trainer (`read_captions_file`):
    format "lantern-captions-v1"; ids, captions: list[str] [n]; index: LongTensor [n] (prompt rows = image
    indices); features: [n, max_length, C] in the --dtype used (fp32 or bf16); mask: BoolTensor [n, max_length]
    (True = real token, left padding); encoder: str (what made them); max_length: int.
"""

from __future__ import annotations

import argparse
import html
import re
import urllib.parse
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from lantern.engine.models.checkpoint import parse_device, parse_dtype
from lantern.errors import UserError
from lantern.io import load_torch, save_torch
from lantern.worlds.llamagen.prompts import read_prompts

FORMAT = "lantern-captions-v1"
UPSTREAM_MAX_LENGTH = 120
KEYS = ("ids", "captions", "index", "features", "mask", "encoder", "max_length")


# -- upstream's caption cleaning ----------------------------------------------------------------------------------
# The T5Embedder's clean_caption, rule for rule: it lower-cases and rewrites the text, so features of uncleaned
# captions would not be the ones the published t2i models were trained and evaluated with.
def _rules(*pairs):
    return [(re.compile(p), r) for p, r in pairs]


_URL = r"\b((?:{}:(?:\/{{1,3}}|[a-zA-Z0-9%])|[a-zA-Z0-9.\-]+[.](?:com|co|ru|net|org|edu|gov|it)[\w/-]*\b\/?(?!@)))"
_BEFORE_HTML = _rules((r"<person>", "person"), (_URL.format("https?"), ""), (_URL.format("www"), ""))
_BAD_PUNCT = r"[#®•©™&@·º½¾¿¡§~\)\(\]\[\}\{\|\\\/\*]{1,}"
_AFTER_HTML = _rules(
    (r"@[\w\d]+\b", ""),
    (r"[\u31c0-\u31ef\u31f0-\u31ff\u3200-\u32ff\u3300-\u33ff\u3400-\u4dbf\u4dc0-\u4dff\u4e00-\u9fff]+", ""),  # CJK
    (r"[\u002D\u058A\u05BE\u1400\u1806\u2010-\u2015\u2E17\u2E1A\u2E3A\u2E3B\u2E40\u301C\u3030\u30A0\uFE31\uFE32"
     r"\uFE58\uFE63\uFF0D]+", "-"),  # every dash
    (r"[`´«»“”¨]", '"'), (r"[‘’]", "'"),
    (r"&quot;?", ""), (r"&amp", ""),
    (r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}", " "),  # IP addresses
    (r"\d:\d\d\s+$", ""),
    (r"\\n", " "),  # a literal backslash-n
    (r"#\d{1,3}\b", ""), (r"#\d{5,}\b", ""), (r"\b\d{6,}\b", ""),
    (r"[\S]+\.(?:png|jpg|jpeg|bmp|webp|eps|pdf|apk|mp4)", ""),  # file names
    (r"[\"\']{2,}", '"'), (r"[\.]{2,}", " "),
    (_BAD_PUNCT, " "), (r"\s+\.\s+", " "),
)
_SEPARATORS = re.compile(r"(?:\-|\_)")
_AFTER_FIX = _rules(
    (r"\b[a-zA-Z]{1,3}\d{3,15}\b", ""), (r"\b[a-zA-Z]+\d+[a-zA-Z]+\b", ""), (r"\b\d+[a-zA-Z]+\d+\b", ""),
    (r"(worldwide\s+)?(free\s+)?shipping", ""), (r"(free\s)?download(\sfree)?", ""),
    (r"\bclick\b\s(?:for|on)\s\w+", ""), (r"\b(?:png|jpg|jpeg|bmp|webp|eps|pdf|apk|mp4)(\simage[s]?)?", ""),
    (r"\bpage\s+\d+\b", ""),
    (r"\b\d*[a-zA-Z]+\d+[a-zA-Z]+\d+[a-zA-Z\d]*\b", " "),
    (r"\b\d+\.?\d*[xх×]\d+\.?\d*\b", ""),
    (r"\b\s+\:\s+", ": "), (r"(\D[,\./])\b", r"\1 "), (r"\s+", " "),
    (r"^[\"\']([\w\W]+)[\"\']$", r"\1"), (r"^[\'\_,\-\:;]", ""), (r"[\'\_,\-\:\-\+]$", ""), (r"^\.\S+$", ""),
)


class _TextOnly(HTMLParser):
    """The text of an HTML fragment (what BeautifulSoup(..., "html.parser").text gives upstream, same parser)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []

    def handle_data(self, data: str) -> None:
        self.parts.append(data)


def _html_text(text: str) -> str:
    parser = _TextOnly()
    parser.feed(text)
    parser.close()
    return "".join(parser.parts)


def _apply(rules, text: str) -> str:
    for pattern, repl in rules:
        text = pattern.sub(repl, text)
    return text


def _clean_once(text: str) -> str:
    import ftfy

    text = urllib.parse.unquote_plus(str(text)).strip().lower()
    text = _html_text(_apply(_BEFORE_HTML, text))
    text = _apply(_AFTER_HTML, text)
    if len(_SEPARATORS.findall(text)) > 3:  # this-is-a-slug / this_is_a_slug
        text = _SEPARATORS.sub(" ", text)
    text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
    return _apply(_AFTER_FIX, text).strip()


def clean_caption(text: str) -> str:
    """Upstream applies its cleaning twice."""
    return _clean_once(_clean_once(text))


# -- features -----------------------------------------------------------------------------------------------------
def left_pad(features: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Right-padded T5 output [n, L, C] with mask [n, L] -> valid rows moved to the end, padded rows zero."""
    n, L = mask.shape
    valid = mask.long().sum(1, keepdim=True)
    # row j of the result reads row (j + valid) mod L: the padding first, then the valid rows in order
    src = (torch.arange(L, device=mask.device)[None] + valid) % L
    moved = features.gather(1, src[:, :, None].expand(-1, -1, features.shape[2]))
    new_mask = mask.bool().flip(-1)
    return moved * new_mask[:, :, None].to(moved.dtype), new_mask


def load_t5(folder: str | Path, device: torch.device, dtype: torch.dtype):
    """(tokenizer, encoder) from a local folder; nothing is downloaded."""
    from transformers import AutoTokenizer, T5EncoderModel
    from transformers.utils import logging

    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise UserError(f"--t5 {folder} is not a T5 model folder (no config.json); point it at a local flan-t5-xl")
    logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        model = T5EncoderModel.from_pretrained(folder, dtype=dtype, local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserError(f"--t5 {folder} could not be loaded as a T5 encoder and tokenizer: {first}") from None
    return tokenizer, model.to(device).eval()


@torch.no_grad()
def encode_t5(tokenizer, model, captions: list[str], max_length: int, batch: int) -> tuple[Tensor, Tensor]:
    """Left-padded features [n, max_length, C] (model dtype, on CPU) and masks [n, max_length]."""
    device = next(model.parameters()).device
    feats, masks = [], []
    for lo in range(0, len(captions), batch):
        texts = [clean_caption(c) for c in captions[lo : lo + batch]]
        tok = tokenizer(texts, max_length=max_length, padding="max_length", truncation=True,
                        return_attention_mask=True, add_special_tokens=True, return_tensors="pt")
        hidden = model(input_ids=tok["input_ids"].to(device),
                       attention_mask=tok["attention_mask"].to(device))["last_hidden_state"]
        f, m = left_pad(hidden, tok["attention_mask"].to(device))
        feats.append(f.cpu())
        masks.append(m.cpu())
    return torch.cat(feats), torch.cat(masks)


def feature_file(folder: Path, prompt_id: str) -> Path:
    return folder / f"{prompt_id}.npy"


def read_feature_files(folder: str | Path, ids: list[str], max_length: int, dtype: torch.dtype):
    """LlamaGen-layout features (one [1, L, C] .npy of valid rows per id) left-padded to max_length."""
    folder = Path(folder)
    missing = [i for i in ids if not feature_file(folder, i).is_file()]
    if missing:
        raise UserError(f"--features {folder} has no file for prompt id {missing[0]!r} ({len(missing)} missing); "
                        f"expected {feature_file(folder, missing[0])}")
    feats, masks, width = [], [], None
    for i in ids:
        path = feature_file(folder, i)
        try:
            x = torch.from_numpy(np.load(path, allow_pickle=False)).float()
        except (ValueError, OSError, EOFError) as e:
            raise UserError(f"--features {path} (prompt id {i!r}) is not a readable .npy file: {e}") from None
        x = x[0] if x.ndim == 3 and x.shape[0] == 1 else x
        if x.ndim != 2 or x.shape[0] < 1 or (width is not None and x.shape[1] != width):
            raise UserError(f"--features {path} (prompt id {i!r}) has shape {tuple(x.shape)}; expected [1, L, C]"
                            + (f" with C = {width} like the other files" if width else ""))
        width = x.shape[1]
        n = min(max_length, x.shape[0])  # longer files are cut at the end, as upstream's dataset does
        f = torch.zeros(max_length, width)
        f[max_length - n :] = x[:n]
        m = torch.zeros(max_length, dtype=torch.bool)
        m[max_length - n :] = True
        feats.append(f)
        masks.append(m)
    return torch.stack(feats).to(dtype), torch.stack(masks)


# -- the shard file -----------------------------------------------------------------------------------------------
def read_captions_file(path: str | Path, flag: str = "--captions", mmap: bool = False) -> dict:
    """A validated lantern-captions-v1 shard (see the module doc); every problem is a one-line UserError.
    mmap: leave the features on disk (drafter training reads 100k captions' features a batch at a time)."""
    path = Path(path)
    where = f"{flag} {path}"
    obj = load_torch(path, flag, "lantern encode-captions", mmap=mmap)
    if obj.get("format") != FORMAT:
        raise UserError(f"{where} is not a {FORMAT} file; write it with `lantern encode-captions`")
    missing = [k for k in KEYS if k not in obj]
    if missing:
        raise UserError(f"{where} lacks {', '.join(missing)}; rewrite it with `lantern encode-captions`")
    ids, captions, index, features, mask = (obj[k] for k in ("ids", "captions", "index", "features", "mask"))
    L = obj["max_length"]
    n = len(ids) if isinstance(ids, list) else -1
    problems = [
        (n < 1 or not all(isinstance(i, str) for i in ids), "ids must be a non-empty list of strings"),
        (not isinstance(captions, list) or len(captions) != n or not all(isinstance(c, str) for c in captions),
         "captions must be a list of strings, one per id"),
        (not isinstance(L, int) or isinstance(L, bool) or L < 1, "max_length must be a positive integer"),
        (not isinstance(obj["encoder"], str), "encoder must be a string"),
        (not isinstance(index, Tensor) or index.dtype != torch.long or tuple(index.shape) != (n,)
         or len(set(index.tolist())) != n or bool((index < 0).any()),
         "index must be a LongTensor [n] of distinct rows >= 0"),
        (not isinstance(features, Tensor) or not features.is_floating_point() or features.ndim != 3
         or tuple(features.shape[:2]) != (n, L), f"features must be a float tensor [n={n}, max_length={L}, C]"),
        (not isinstance(mask, Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != (n, L),
         f"mask must be a BoolTensor [n={n}, max_length={L}]"),
    ]
    for bad, what in problems:
        if bad:
            raise UserError(f"{where} is malformed: {what}; rewrite it with `lantern encode-captions`")
    return obj


def rows_for(captions: dict, start: int, end: int, where: str) -> list[int]:
    """Positions in a captions shard of image indices start..end-1; a shard that misses one is a UserError."""
    position = {int(r): p for p, r in enumerate(captions["index"].tolist())}
    missing = [i for i in range(start, end) if i not in position]
    if missing:
        lo, hi = int(captions["index"].min()), int(captions["index"].max())
        raise UserError(f"{where} covers prompt rows {lo}..{hi}, not image index {missing[0]} of [{start}, {end}); "
                        "give the captions shard that covers this range")
    return [position[i] for i in range(start, end)]


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="lantern encode-captions", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", required=True, help="prompt table CSV from `lantern prompts`")
    ap.add_argument("--start", type=int, default=0, help="first prompt row (image index)")
    ap.add_argument("--end", type=int, help="one past the last prompt row (default: all rows)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--t5", help="local T5 folder (flan-t5-xl: config.json, weights, tokenizer files)")
    src.add_argument("--features", help="folder of precomputed LlamaGen T5 features, <id>.npy [1, L, C] each")
    ap.add_argument("--out", required=True, help="captions shard (.pt, lantern-captions-v1)")
    ap.add_argument("--device", default="auto", help="T5 device: auto, cpu, cuda[:i]")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                    help="T5 compute dtype (upstream: bf16 on GPU) and the stored features' dtype")
    ap.add_argument("--max-length", type=int, default=UPSTREAM_MAX_LENGTH,
                    help="caption positions (the target's cls_token_num; upstream 120)")
    ap.add_argument("--batch", type=int, default=32, help="captions per T5 forward")
    a = ap.parse_args(argv)
    if a.max_length < 1 or a.batch < 1:
        raise UserError(f"--max-length {a.max_length} and --batch {a.batch} must be positive")
    prompts = read_prompts(a.prompts)
    a.end = len(prompts) if a.end is None else a.end
    if not 0 <= a.start < a.end <= len(prompts):
        raise UserError(f"need 0 <= --start < --end <= {len(prompts)} (the prompts in {a.prompts}), "
                        f"got {a.start} and {a.end}")
    ids = [p for p, _ in prompts[a.start : a.end]]
    captions = [c for _, c in prompts[a.start : a.end]]
    dtype = parse_dtype(a.dtype)
    if a.t5:
        device = parse_device(a.device)
        tokenizer, model = load_t5(a.t5, device, dtype)
        features, mask = encode_t5(tokenizer, model, captions, a.max_length, a.batch)
        encoder = (f"{type(model).__name__} {Path(a.t5).resolve()} ({a.dtype}, {device.type}); "
                   "LlamaGen T5Embedder caption cleaning; left padding")
    else:
        if not Path(a.features).is_dir():
            raise UserError(f"--features {a.features} is not a folder of <id>.npy files; fix the path")
        features, mask = read_feature_files(a.features, ids, a.max_length, dtype)
        encoder = f"precomputed LlamaGen T5 features {Path(a.features).resolve()}/<id>.npy; left padding"
    save_torch({"format": FORMAT, "ids": ids, "captions": captions,
                "index": torch.arange(a.start, a.end, dtype=torch.long), "features": features.contiguous(),
                "mask": mask, "encoder": encoder, "max_length": a.max_length}, a.out)
    print(f"wrote features [{features.shape[0]}, {features.shape[1]}, {features.shape[2]}] of prompts "
          f"[{a.start}, {a.end}) to {a.out}")
