"""A tiny random OpenCLIP written locally, in the layout of HPS v2.1's release: what tests (and fake worlds' DAGs)
score with where the real HPS_v2.1_compressed.pt (OpenCLIP ViT-H-14, 1 B parameters) cannot be had.

`write_tiny_openclip(folder)` saves `{name}.json` (an open_clip model config: 32-px images, one transformer layer per
tower, open_clip's own tokenizer) and beside it `{name}.pt`, a training checkpoint {"state_dict": ...} with DDP's
"module." prefix, as HPS's file is. The config is also registered with open_clip under `name`, so `model: name` and
`model: ""` (the config beside the weights) both load it: set metrics.hpsv2 {enabled: true, model: "", weights_path:
<the .pt>} in a pipeline config.
"""
from __future__ import annotations

import json
from pathlib import Path

import open_clip
import torch

TINY_OPENCLIP = {"embed_dim": 16,
                 "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 16, "head_width": 16},
                 "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1}}


def write_tiny_openclip(folder, name: str = "tiny-hps", seed: int = 0):
    """(weights path, the model in eval mode) of a random tiny OpenCLIP saved under `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / f"{name}.json"
    config.write_text(json.dumps(TINY_OPENCLIP))
    open_clip.add_model_config(config)
    with torch.random.fork_rng(devices=[]):  # the caller's random state stays as it was
        torch.manual_seed(seed)
        net = open_clip.create_model(name).eval()
    weights = folder / f"{name}.pt"
    torch.save({"state_dict": {f"module.{k}": v for k, v in net.state_dict().items()}}, weights)
    return weights, net
