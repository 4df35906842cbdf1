"""Captions for the CLIP score: one per generated image, from `lantern sample` stats tables. A `caption` column (text
to image) wins; rows without one are class-conditional and are captioned by their `label`'s class name ("a goldfish"):
the toy world's names, ImageNet-1k's (the list torchvision ships with its classifier weights), or a text file with one
name per line."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from lantern.errors import UserError
from lantern.io import read_csv, sha256_file

NAME_SOURCES = ("toy", "imagenet")  # or a file path


@dataclass(frozen=True)
class Captions:
    texts: dict[int, str]  # image_index -> caption (without the prompt prefix)
    source: str  # where they came from, for the metrics row
    labelled: frozenset[int] = frozenset()  # images captioned by their class name (no text prompt: class-conditional)


def name_caption(name: str) -> str:
    return f"{'an' if name[0] in 'aeiouAEIOU' else 'a'} {name}"


def class_names(source: str) -> tuple[tuple[str, ...], str]:
    """(names indexed by label, a description for the protocol) of "toy", "imagenet" or a names file."""
    if source == "toy":
        from lantern.worlds.toy.data import CLASS_NAMES

        return CLASS_NAMES, "toy-world class names"
    if source == "imagenet":
        import torchvision
        from torchvision.models import ResNet50_Weights

        # the categories are part of torchvision's code: reading them downloads nothing
        return (tuple(ResNet50_Weights.IMAGENET1K_V1.meta["categories"]),
                f"ImageNet-1k class names (torchvision {torchvision.__version__})")
    if not os.path.isfile(source):
        raise UserError(f"clip.class_names = {source!r} is none of {', '.join(NAME_SOURCES)} and no such file exists; "
                        f"give a text file with one class name per line, line 1 = label 0")
    lines = Path(source).read_text(encoding="utf-8").splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    blank = [n for n, line in enumerate(lines, 1) if not line.strip()]
    if not lines or blank:
        raise UserError(f"class names file {source} {'has an empty line ' + str(blank[0]) if blank else 'is empty'}: "
                        f"write one class name per line, line 1 = label 0")
    return tuple(line.strip() for line in lines), f"class names file {source} (sha256 {sha256_file(source)[:16]})"


def read_captions(paths: list[str | os.PathLike], names_source: str = "toy") -> Captions:
    """image_index -> caption from CSV tables with an image_index column and a caption and/or label column."""
    texts: dict[int, str] = {}
    used: list[str] = []  # caption sources in order of first use
    names = None
    labelled: set[int] = set()
    for path in paths:
        if not os.path.isfile(path):
            raise UserError(f"captions table {path} does not exist")
        df = read_csv(path, "captions table", "give a CSV with image_index and caption or label columns")
        if "image_index" not in df.columns or not {"caption", "label"} & set(df.columns):
            raise UserError(f"captions table {path} needs an image_index column and a caption or label column")
        caption = df["caption"] if "caption" in df.columns else pd.Series(pd.NA, index=df.index)
        label = df["label"] if "label" in df.columns else pd.Series(pd.NA, index=df.index)
        for i, cap, lab in zip(df["image_index"].astype(int), caption, label):
            if pd.notna(cap) and str(cap).strip():
                text, source = str(cap), "stats caption column"
            elif pd.notna(lab):
                if names is None:
                    names, described = class_names(names_source)
                if not 0 <= int(lab) < len(names):
                    raise UserError(f"captions table {path}: label {int(lab)} has no name among the {len(names)} "
                                    f"{described}; set clip.class_names (imagenet, or a file with one name per line)")
                text, source = name_caption(names[int(lab)]), f"labels -> {described}"
                labelled.add(int(i))
            else:
                raise UserError(f"captions table {path}: image {i} has neither a caption nor a label")
            if texts.get(i, text) != text:
                raise UserError(f"image {i} has two different captions in {', '.join(map(str, paths))}")
            texts[i] = text
            if source not in used:
                used.append(source)
    return Captions(texts, " + ".join(used), frozenset(labelled))
