"""`lantern prompts`: prompt tables from user files and the LANTERN authors' MS-COCO selection."""
import csv
import json

import pytest

from lantern.pipeline.cli import main as cli
from lantern.errors import UserError
from lantern.worlds.llamagen.prompts import coco_longest, main, read_prompts


def coco_file(path, annotations):
    path.write_text(json.dumps({"info": {}, "images": [], "annotations": annotations}))
    return path


def ann(image_id, ann_id, caption):
    return {"image_id": image_id, "id": ann_id, "caption": caption}


def table(path):
    with open(path, newline="") as f:
        return [tuple(r) for r in csv.reader(f)]


def test_coco_selection_is_each_images_longest_caption_in_order_of_first_appearance(tmp_path):
    src = coco_file(tmp_path / "captions_val2017.json", [
        ann(30, 1, "a dog"),
        ann(10, 2, "a cat on a mat"),
        ann(30, 3, "a dog runs fast "),  # longest of image 30, trailing space counted
        ann(20, 4, "tie one"),
        ann(10, 5, "a cat"),
        ann(20, 6, "tie two"),  # same length as "tie one": the first listed wins
        ann(30, 7, "a dog runs fast"),
    ])
    assert coco_longest(src) == [("30", "a dog runs fast "), ("10", "a cat on a mat"), ("20", "tie one")]
    main(["--coco", str(src), "--n", "2", "--out", str(tmp_path / "p.csv")])
    assert table(tmp_path / "p.csv") == [("id", "caption"), ("30", "a dog runs fast "), ("10", "a cat on a mat")]
    assert read_prompts(tmp_path / "p.csv") == [("30", "a dog runs fast "), ("10", "a cat on a mat")]


def test_user_csv_and_jsonl_round_trip_verbatim(tmp_path):
    rows = [("a", 'a "quoted", comma caption'), ("b", "two\nlines "), ("c", "plain")]
    with open(tmp_path / "in.csv", "w", newline="") as f:
        csv.writer(f).writerows([("id", "caption"), *rows])
    main(["--file", str(tmp_path / "in.csv"), "--out", str(tmp_path / "p.csv")])
    assert read_prompts(tmp_path / "p.csv") == rows

    (tmp_path / "in.jsonl").write_text("\n".join(json.dumps({"id": i, "caption": c}) for i, c in rows) + "\n\n")
    main(["--file", str(tmp_path / "in.jsonl"), "--n", "2", "--out", str(tmp_path / "q.csv")])
    assert read_prompts(tmp_path / "q.csv") == rows[:2]


def test_caption_only_csv_gets_row_numbers_as_ids(tmp_path):
    (tmp_path / "in.csv").write_text("caption\nfirst\nsecond\nthird\n")
    main(["--file", str(tmp_path / "in.csv"), "--out", str(tmp_path / "p.csv")])
    assert read_prompts(tmp_path / "p.csv") == [("0", "first"), ("1", "second"), ("2", "third")]


@pytest.mark.parametrize("name, text, match", [
    ("missing.csv", None, "does not exist"),
    ("no_caption.csv", "id,text\n1,a cat\n", "no 'caption' column"),
    ("empty.csv", "id,caption\n1,a cat\n2,  \n", "row 1 .* empty caption"),
    ("dupe.csv", "id,caption\n1,a cat\n1,a dog\n", "id '1' twice"),
    ("ragged.csv", "id,caption\n1,a cat, on a mat\n", "quote captions"),
    ("nothing.csv", "id,caption\n", "no prompts"),
    ("bad.jsonl", '{"id": 1, "caption": "a"}\nnot json\n', "line 2 is not JSON"),
    ("nocap.jsonl", '{"id": 1, "text": "a"}\n', "line 1 needs a string \"caption\""),
])
def test_bad_user_files_are_one_line_errors(tmp_path, name, text, match):
    if text is not None:
        (tmp_path / name).write_text(text)
    with pytest.raises(UserError, match=match) as e:
        main(["--file", str(tmp_path / name), "--out", str(tmp_path / "p.csv")])
    assert "\n" not in str(e.value) and "--file" in str(e.value)
    assert not (tmp_path / "p.csv").exists()


@pytest.mark.parametrize("content, match", [
    (None, "does not exist"),
    ("{not json", "not a JSON file"),
    (json.dumps({"images": []}), "no \"annotations\""),
    (json.dumps({"annotations": [{"image_id": 1, "id": 1}]}), "annotation 0 lacks"),
    (json.dumps({"annotations": [ann(1, 1, " ")]}), "empty caption"),
])
def test_bad_coco_files_are_one_line_errors(tmp_path, content, match):
    path = tmp_path / "captions.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(UserError, match=match):
        main(["--coco", str(path), "--out", str(tmp_path / "p.csv")])


def test_too_few_prompts_for_n(tmp_path, capsys):
    src = coco_file(tmp_path / "c.json", [ann(1, 1, "a"), ann(2, 2, "b")])
    assert cli(["prompts", "--coco", str(src), "--n", "3", "--out", str(tmp_path / "p.csv")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--n 3" in err and "(2)" in err


def test_read_prompts_needs_id_and_caption_columns(tmp_path):
    (tmp_path / "p.csv").write_text("caption\na cat\n")
    with pytest.raises(UserError, match="--prompts .* not a prompt table"):
        read_prompts(tmp_path / "p.csv")
