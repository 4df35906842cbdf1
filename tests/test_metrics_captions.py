"""Captions for the CLIP score: stats.csv captions win, class labels are named by the toy world, ImageNet-1k
(torchvision's list) or a names file, and the source is reported."""

import pandas as pd
import pytest

from lantern.errors import UserError
from lantern.metrics.captions import class_names, name_caption, read_captions


def table(path, **columns):
    pd.DataFrame(columns).to_csv(path, index=False)
    return path


def test_imagenet_labels_take_torchvision_names(tmp_path):
    names, described = class_names("imagenet")
    assert len(names) == 1000 and (names[0], names[1], names[999]) == ("tench", "goldfish", "toilet tissue")
    assert described.startswith("ImageNet-1k class names (torchvision ")
    got = read_captions([table(tmp_path / "s.csv", image_index=[0, 1, 2], label=[1, 0, 999])], "imagenet")
    assert got.texts == {0: "a goldfish", 1: "a tench", 2: "a toilet tissue"}
    assert got.source == f"labels -> {described}"


def test_caption_column_wins_and_labels_fill_the_rest(tmp_path):
    shard0 = table(tmp_path / "a.csv", image_index=[0, 1], caption=["a cat on a mat", None], label=[3, 7])
    shard1 = table(tmp_path / "b.csv", image_index=[2], caption=["a dog"])
    got = read_captions([shard0, shard1], "toy")
    assert got.texts == {0: "a cat on a mat", 1: "a square", 2: "a dog"}  # CLASS_NAMES[7]
    assert got.source == "stats caption column + labels -> toy-world class names"
    assert read_captions([shard1], "no-such-file.txt").source == "stats caption column"  # names never needed


def test_names_file(tmp_path):
    (tmp_path / "names.txt").write_text("apple\nbanana split\n\n")
    got = read_captions([table(tmp_path / "s.csv", image_index=[5, 6], label=[0, 1])], str(tmp_path / "names.txt"))
    assert got.texts == {5: "an apple", 6: "a banana split"} and "names.txt (sha256 " in got.source
    assert name_caption("egret") == "an egret"


@pytest.mark.parametrize("names, rows, message", [
    ("toy", {"image_index": [0], "label": [532]},
     r"label 532 has no name among the 16 toy-world class names; set clip.class_names"),
    ("nope.txt", {"image_index": [0], "label": [1]}, r"clip.class_names = 'nope.txt' is none of toy, imagenet"),
    ("blank", {"image_index": [0], "label": [1]}, r"has an empty line 2: write one class name per line"),
    ("toy", {"image_index": [0], "caption": [None], "label": [None]}, r"image 0 has neither a caption nor a label"),
    ("toy", {"image_index": [0], "prompt": ["x"]}, r"needs an image_index column and a caption or label column"),
])
def test_caption_errors_name_the_fix(tmp_path, names, rows, message):
    (tmp_path / "blank").write_text("a\n\nb\n")
    names = str(tmp_path / "blank") if names == "blank" else names
    with pytest.raises(UserError, match=message):
        read_captions([table(tmp_path / "s.csv", **rows)], names)


def test_conflicting_captions_across_tables(tmp_path):
    a = table(tmp_path / "a.csv", image_index=[0], caption=["one"])
    b = table(tmp_path / "b.csv", image_index=[0], caption=["two"])
    with pytest.raises(UserError, match="image 0 has two different captions"):
        read_captions([a, b])
