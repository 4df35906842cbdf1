"""A Chameleon-family world written from scratch for the DAG tests: tiny_chameleon.write_world's released-layout files
(a transformers Chameleon target with the real id layout, the taming VQGAN with 8192 codes, tokenizer.json, the
authors' drafter folder), an MS-COCO-style captions file, reference images and random inception-v3-compat weights."""
from __future__ import annotations

import json
from pathlib import Path

from llamagen_world import _images, _inception_weights
from tiny_openclip import write_tiny_openclip
from tiny_chameleon import write_world

# words of the test vocabulary (tests/test_chameleon_text.WORDS) and unknown ones (<unk>): prompts of several lengths
CAPTIONS = ["a red cat on the mat", "a cat", "the red mat , a cat on a mat", "a red cat on a red mat , the cat",
            "an image of a cat"]


def build_chameleon_world(root: Path) -> dict[str, str]:
    root.mkdir(parents=True, exist_ok=True)
    files = {k: str(v) for k, v in write_world(root, positions=128).items()}
    annotations = [{"image_id": 10 + i, "id": 100 + i, "caption": c} for i, c in enumerate(CAPTIONS)]
    annotations += [{"image_id": 10 + i, "id": 200 + i, "caption": "a"} for i in range(len(CAPTIONS))]
    (root / "captions_val2017.json").write_text(json.dumps({"annotations": annotations}))
    _images(root / "reference", 6, seed=3, size=96)
    _inception_weights(root / "inception.pth")
    hps, _ = write_tiny_openclip(root / "hps")  # HPS v2.1's checkpoint layout, a tiny random OpenCLIP
    return {**files, "coco": str(root / "captions_val2017.json"), "reference": str(root / "reference"),
            "inception": str(root / "inception.pth"), "hpsv2": str(hps)}
