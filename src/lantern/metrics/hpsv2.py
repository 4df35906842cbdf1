"""HPS v2.1 (Human Preference Score): the preference metric the LANTERN authors report for Anole and Lumina-mGPT
(their eval_hpsv2.py: `hpsv2.score(image, prompt, hps_version="v2.1")` per image, the mean printed).

HPS v2.1 is OpenCLIP ViT-H-14 fine-tuned on human preferences (`HPS_v2.1_compressed.pt`, a training checkpoint
{"state_dict": ...}). Its score is the cosine of the L2-normalised image and text features, with no prompt prefix
and no logit scale: the diagonal of image_features @ text_features.T that the hpsv2 package computes. So it runs
through the CLIP-score machinery of clip.py unchanged (the same open_clip loading from a local file, the same
resize + centre crop + normalisation, the same per-image cosine); only the model, the weights and the absent
prefix differ. Nothing is downloaded: a missing weights file is one line naming `hpsv2.weights_path`.
The parameters and the file check import no torch: the pipeline's config check runs them at every start.
Differences from the hpsv2 package, at the tolerance level: it resizes PIL images (bicubic) where clip.py resizes
tensors (bicubic, antialiased), and it scores under CUDA autocast (fp16) where this runs in the model's dtype.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lantern.errors import UserError

if TYPE_CHECKING:
    import torch

KEY = "hpsv2.weights_path"


@dataclass
class HPSv2Params:
    enabled: bool = False
    model: str = "ViT-H-14"  # open_clip architecture of HPS v2.1; "" = the JSON config beside weights_path (tests)
    weights_path: str = ""  # local HPS_v2.1_compressed.pt
    batch_size: int = 16

    def __post_init__(self):
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise UserError(f"hpsv2.batch_size = {self.batch_size!r} must be a positive integer")


def check_hpsv2(p: HPSv2Params, section: str = "hpsv2") -> None:
    """Before any job starts: the weights file a run with HPS v2.1 enabled needs. `section`: where the keys live
    (`metrics.hpsv2` in a pipeline config)."""
    if p.enabled and not (p.weights_path and os.path.isfile(p.weights_path)):
        where = f"at {p.weights_path}" if p.weights_path else f"({section}.weights_path is empty)"
        raise UserError(f"HPS v2.1 weights not found {where}: put HPS_v2.1_compressed.pt there and point "
                        f"{section}.weights_path at it, or set {section}.enabled: false")


def load_hpsv2(p: HPSv2Params, device: str | torch.device = "cpu"):
    """(open_clip model, tokenizer) of HPS v2.1 from the local weights file."""
    from lantern.metrics.clip import config_path, load_clip

    check_hpsv2(HPSv2Params(enabled=True, model=p.model, weights_path=p.weights_path, batch_size=p.batch_size))
    if not p.model and not config_path(p.weights_path).is_file():  # clip.py's own line speaks of the toy CLIP
        raise UserError(f"hpsv2.model is empty, so the open_clip config {config_path(p.weights_path)} must lie beside "
                        f"{p.weights_path}; put it there, or set hpsv2.model: ViT-H-14 (HPS v2.1)")
    return load_clip(p.model, p.weights_path, device, key=KEY)


def hps_scores(net, tokenizer, images, prompts: list[str], batch_size: int = 16) -> torch.Tensor:
    """Per-image HPS v2.1 score [N]: cosine of the normalised image and prompt features (the prompt as given).
    `images`: uint8 [N, 3, H, W] or an ImageSet."""
    from lantern.metrics.clip import clip_cosines

    return clip_cosines(net, tokenizer, images, prompts, prefix="", batch_size=batch_size)
