"""A llamagen-shaped world written from scratch: the files a researcher would place for the paper's runs, in the
upstream layouts, with random weights at small widths (nothing can be downloaded here).

- GPT c2i / t2i: upstream `{"model": state_dict}` files without any config entry (vocab 16384, 16 x 16 tokens,
  120 caption positions for t2i), so the pipeline must take the model from `llamagen.*` keys and the tensors;
- VQ-16: the upstream key layout (five levels, downsample 16, codebook 16384 x 8) at small channel widths; the file
  carries its widths as an `args` entry, since they are not upstream's;
- a tiny random FLAN-T5 encoder and tokenizer saved with `transformers`;
- an MS-COCO-style captions annotation file, a captioned image folder for drafter training, reference images,
  and random inception-v3-compat weights for the FID extractor.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from fake_t5 import write_tiny_t5
from lantern.engine.models.checkpoint import save_checkpoint
from lantern.engine.models.model import GPT, ModelArgs
from lantern.engine.models.vq import VQArgs, VQModel

GPT_SIZE = {"dim": 64, "n_layer": 2, "n_head": 2}
VQ_ARGS = VQArgs(codebook_size=16384, codebook_embed_dim=8, ch=8, ch_mult=(1, 1, 2, 2, 4), z_channels=16,
                 norm_groups=4)
CAPTIONS = [
    "a red double decker bus driving down a wet city street past tall buildings",
    "two dogs playing with a frisbee on a sunny beach",
    "a plate with a sandwich, a pickle and a handful of potato chips on a wooden table",
    "a man riding a wave on top of a surfboard",
    "a cat sleeping on a laptop keyboard next to a cup of coffee",
    "an old clock tower standing in the middle of a snowy town square at dusk",
    "a bowl of fruit",
    "three giraffes eating leaves from the top of a tall tree in a grassy savanna",
]


def _picture(rng: np.random.Generator, size: int) -> Image.Image:
    """A smooth random picture: a colour gradient with a few discs, so the VQ sees structure, not white noise."""
    y, x = np.mgrid[0:size, 0:size] / size
    img = np.stack([a * x + b * y + c for a, b, c in rng.uniform(-0.5, 0.5, (3, 3))], -1) + 0.5
    for _ in range(3):
        cx, cy, r = rng.uniform(0.2, 0.8), rng.uniform(0.2, 0.8), rng.uniform(0.05, 0.2)
        img[(x - cx) ** 2 + (y - cy) ** 2 < r * r] = rng.uniform(0, 1, 3)
    return Image.fromarray((img.clip(0, 1) * 255).astype(np.uint8))


def _images(folder: Path, n: int, seed: int, size: int = 256) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    names = [f"img{i:03d}.png" for i in range(n)]
    for name in names:
        _picture(rng, size).save(folder / name)
    return names


def _inception_weights(path: Path) -> None:
    """Random weights in torch-fidelity's inception-v3-compat layout (its constructor would load real ones)."""
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

    load, sd_load = torch.load, FeatureExtractorInceptionV3.load_state_dict
    torch.load, FeatureExtractorInceptionV3.load_state_dict = (lambda *a, **k: {}), (lambda self, sd: None)
    try:
        net = FeatureExtractorInceptionV3("inception-v3-compat", ["2048"], feature_extractor_weights_path="x")
    finally:
        torch.load, FeatureExtractorInceptionV3.load_state_dict = load, sd_load
    torch.save(net.state_dict(), path)


def write_gpt(path: Path, model_type: str, caption_dim: int = 2048, seed: int = 0) -> None:
    torch.manual_seed(seed)
    extra = {"cls_token_num": 120, "caption_dim": caption_dim} if model_type == "t2i" else {"num_classes": 10}
    model = GPT(ModelArgs(**GPT_SIZE, vocab_size=16384, image_tokens=256, model_type=model_type, **extra))
    save_checkpoint(path, model, container="model")  # upstream: weights only, no config


def write_authors_drafter(folder: Path, gpt_path: str, seed: int = 0) -> Path:
    """An EAGLE drafter in the LANTERN authors' layout for the GPT at `gpt_path` (lantern-authors-format.md: HF-style
    keys, one layer, fc with bias, own token embedding, fp16, config.json beside the weights)."""
    sd = torch.load(gpt_path, map_location="cpu", weights_only=True)["model"]
    V, d = sd["tok_embeddings.weight"].shape
    ffn = sd["layers.0.feed_forward.w1.weight"].shape[0]
    g = torch.Generator().manual_seed(seed)
    shapes = {"embed_tokens.weight": (V, d), "fc.weight": (d, 2 * d), "fc.bias": (d,),
              **{f"layers.0.self_attn.{p}_proj.weight": (d, d) for p in "qkvo"},
              "layers.0.mlp.gate_proj.weight": (ffn, d), "layers.0.mlp.up_proj.weight": (ffn, d),
              "layers.0.mlp.down_proj.weight": (d, ffn), "layers.0.post_attention_layernorm.weight": (d,)}
    weights = {k: (torch.randn(s, generator=g) * 0.05).half() for k, s in shapes.items()}
    weights["layers.0.post_attention_layernorm.weight"] = torch.ones(d).half()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({
        "hidden_size": d, "intermediate_size": ffn, "num_attention_heads": GPT_SIZE["n_head"], "num_hidden_layers": 1,
        "vocab_size": V, "rms_norm_eps": 1e-6, "torch_dtype": "float16"}))
    torch.save(weights, folder / "pytorch_model.bin")
    return folder


def build_world(root: Path) -> dict[str, str]:
    """Every file of both worlds under `root`; returns their paths by config role."""
    root.mkdir(parents=True, exist_ok=True)
    t5 = write_tiny_t5(root / "flan-t5-tiny")
    d_model = json.loads((Path(t5) / "config.json").read_text())["d_model"]
    write_gpt(root / "t2i_tiny_256.pt", "t2i", caption_dim=d_model)
    write_gpt(root / "c2i_tiny_256.pt", "c2i")
    torch.manual_seed(1)
    save_checkpoint(root / "vq_ds16_tiny.pt", VQModel(VQ_ARGS), args=dataclasses.asdict(VQ_ARGS))

    annotations = [{"image_id": 100 + i, "id": 1000 + i, "caption": c} for i, c in enumerate(CAPTIONS)]
    annotations += [{"image_id": 100 + i, "id": 2000 + i, "caption": "a photo"} for i in range(len(CAPTIONS))]
    (root / "captions_val2017.json").write_text(json.dumps({"annotations": annotations}))
    names = _images(root / "drafter_images", len(CAPTIONS), seed=2)
    with open(root / "drafter_images" / "captions.csv", "w") as f:
        f.write("image,caption\n" + "".join(f'{n},"{c}"\n' for n, c in zip(names, CAPTIONS)))
    for c in range(2):  # c2i drafter data: ImageNet-style class folders
        _images(root / "class_images" / f"n0000000{c}", 4, seed=10 + c)
    _images(root / "reference", 6, seed=3)
    _inception_weights(root / "inception.pth")
    write_authors_drafter(root / "authors_drafter", str(root / "t2i_tiny_256.pt"))
    return {
        "t2i": str(root / "t2i_tiny_256.pt"), "c2i": str(root / "c2i_tiny_256.pt"), "vq": str(root / "vq_ds16_tiny.pt"),
        "t5": str(t5), "coco": str(root / "captions_val2017.json"), "drafter_images": str(root / "drafter_images"),
        "class_images": str(root / "class_images"), "reference": str(root / "reference"),
        "inception": str(root / "inception.pth"), "authors_drafter": str(root / "authors_drafter"),
    }
