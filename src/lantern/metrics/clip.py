"""CLIP score through open_clip, and the toy CLIP's image tower as a torch-fidelity feature extractor.

Two conventions, both reported: clip_score (as torchmetrics' CLIPScore) = 100 * max(cos(image, prompt_prefix +
caption), 0), and clip_cosine = the raw cosine (what the LANTERN papers quote), each averaged over images.
A CLIP is an open_clip architecture plus a local weights file: a named architecture for real runs (OpenAI's ViT-B/32,
trained with QuickGELU, is "ViT-B-32-quickgelu"; the paper's prompt prefix "A photo depicts "), or the toy CLIP, whose
open_clip model config is the JSON file written beside its weights by `lantern train-clip` (toyclip.pt + toyclip.json;
the model name is the stem). Local files in every layout open_clip 3.3 reads: a state dict (also a training checkpoint
{"state_dict": ...}), safetensors, a big_vision .npz, or a TorchScript archive (OpenAI's released files).
Nothing is ever downloaded.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a named pretrained tag then fails in seconds instead of hanging

import open_clip  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torchvision.transforms.functional as TF  # noqa: E402
from torch_fidelity import FeatureExtractorBase  # noqa: E402

from lantern.hparams import CLASS_NAMES, PROMPT_PREFIX  # noqa: E402
from lantern.errors import UserError  # noqa: E402
from lantern.metrics.captions import name_caption  # noqa: E402



@dataclass
class ClipScoreParams:
    enabled: bool = True
    model: str = "ViT-B-32-quickgelu"  # open_clip architecture; "" = the JSON config beside weights_path (toy CLIP)
    weights_path: str = ""  # local checkpoint (see the module docstring for the layouts)
    prompt_prefix: str = PROMPT_PREFIX
    class_names: str = "toy"  # captions of class labels: toy | imagenet | a text file, one name per line
    batch_size: int = 64


def class_caption(label: int) -> str:
    """Caption of a toy-world class-conditional sample (the toy CLIP is trained on these too)."""
    return name_caption(CLASS_NAMES[label])


def config_path(weights_path: str | os.PathLike) -> Path:
    return Path(weights_path).with_suffix(".json")


def weights_format(path: str | os.PathLike) -> str:
    """The layout open_clip will read `path` as (mirrors open_clip.factory.load_checkpoint's dispatch)."""
    if Path(path).suffix in (".npz", ".npy"):
        return "big_vision numpy"
    if str(path).endswith(".safetensors"):
        return "safetensors"
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            if any(n.count("/") == 1 and n.endswith("/constants.pkl") for n in z.namelist()):
                return "TorchScript archive"
    return "state dict"


def load_clip(model: str, weights_path: str, device: str | torch.device = "cpu", key: str = "clip.weights_path"):
    """open_clip model (eval mode) and its tokenizer, from a local file only."""
    if not weights_path:
        raise UserError(f"{key} is empty: give the local checkpoint of the CLIP model {model or '(toy)'}; "
                        f"nothing is downloaded")
    if not os.path.isfile(weights_path):
        what = "the toy CLIP written by `lantern train-clip`" if not model else f"the open_clip {model} checkpoint"
        raise UserError(f"CLIP weights not found at {weights_path}: put {what} there, or point {key} at it")
    name = model
    if not model:
        cfg = config_path(weights_path)
        if not cfg.is_file():
            raise UserError(f"toy CLIP config {cfg} is missing beside {weights_path}; rerun `lantern train-clip`, "
                            f"or set clip.model to an open_clip architecture name")
        open_clip.add_model_config(cfg)  # (re)registering right before use: the newest file of that name wins
        name = cfg.stem
    if name not in open_clip.list_models():
        raise UserError(f"unknown open_clip model {name!r}; e.g. ViT-B-32 (OpenAI weights: ViT-B-32-quickgelu)")
    jit = weights_format(weights_path) == "TorchScript archive"
    if jit and not open_clip.get_model_config(name).get("quick_gelu", False):
        # strict loading would succeed and the GELU/QuickGELU mismatch would silently shift every score
        raise UserError(f"{weights_path} is a TorchScript CLIP (OpenAI's release format, trained with QuickGELU) but "
                        f"open_clip {name} uses GELU: set clip.model to its -quickgelu variant (ViT-B-32-quickgelu)")
    try:
        # torch.load refuses TorchScript archives under weights_only and hands them to torch.jit.load, which
        # restores modules and tensors rather than unpickling arbitrary objects
        net = open_clip.create_model(name, pretrained=str(weights_path), device=device, weights_only=not jit)
    except (RuntimeError, KeyError, ValueError, OSError, AssertionError, pickle.UnpicklingError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"cannot load {weights_path} as open_clip {name}: {first}") from None
    return net.eval(), open_clip.get_tokenizer(name)


class Preprocess(nn.Module):
    """uint8 [B, 3, H, W] -> the model's normalised input (open_clip's resize, center crop and mean/std)."""

    def __init__(self, net: nn.Module):
        super().__init__()
        cfg = open_clip.get_model_preprocess_cfg(net)
        size = cfg["size"]
        self.size = size if isinstance(size, int) else size[0]
        self.interpolation = TF.InterpolationMode(cfg.get("interpolation", "bicubic"))
        self.register_buffer("mean", torch.tensor(cfg["mean"]).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(cfg["std"]).view(1, 3, 1, 1), persistent=False)

    def describe(self, height: int, width: int) -> str:
        if (height, width) == (self.size, self.size):
            return "none"
        return f"{self.interpolation.value} (antialias) shortest side to {self.size} + center crop"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float() / 255
        if x.shape[-2:] != (self.size, self.size):
            x = TF.center_crop(TF.resize(x, self.size, self.interpolation, antialias=True), self.size)
        return (x - self.mean) / self.std


@torch.no_grad()
def embed_images(net: nn.Module, prep: Preprocess, images: torch.Tensor) -> torch.Tensor:
    return net.encode_image(prep(images), normalize=True)


@torch.no_grad()
def embed_texts(net: nn.Module, tokenizer, texts: list[str], device) -> torch.Tensor:
    return net.encode_text(tokenizer(texts).to(device), normalize=True)


def clip_score(cosines: torch.Tensor) -> torch.Tensor:
    """torchmetrics' CLIPScore convention: 100 * max(cos, 0)."""
    return 100 * cosines.clamp(min=0)


def clip_cosines(net: nn.Module, tokenizer, images, captions: list[str], prefix: str = PROMPT_PREFIX,
                 batch_size: int = 64) -> torch.Tensor:
    """Per-image cosine of image and prefixed caption embeddings. `images`: uint8 tensor [N, 3, H, W] or an
    ImageSet."""
    if len(images) != len(captions):
        raise ValueError(f"{len(images)} images but {len(captions)} captions")
    device = next(net.parameters()).device
    prep = Preprocess(net).to(device)
    out = []
    for lo in range(0, len(captions), batch_size):
        hi = min(lo + batch_size, len(captions))
        batch = images[lo:hi] if torch.is_tensor(images) else images.batch(lo, hi)
        img = embed_images(net, prep, batch.to(device))
        txt = embed_texts(net, tokenizer, [prefix + c for c in captions[lo:hi]], device)
        out.append((img * txt).sum(-1).cpu())
    return torch.cat(out)


class ToyClipFeatures(FeatureExtractorBase):
    """torch-fidelity extractor: L2-normalised image embeddings of a CLIP loaded from feature_extractor_weights_path
    (with its config JSON beside it). Frechet distance on these is a CLIP-feature FD, not an Inception FID."""

    internal_resize = "open_clip preprocessing (bicubic antialias to the CLIP's input size when they differ)"

    def __init__(self, name, features_list, feature_extractor_weights_path=None, **kwargs):
        super().__init__(name, features_list)
        net, _ = load_clip("", feature_extractor_weights_path or "", key="fidelity.weights_path")
        self.visual = net.visual
        self.prep = Preprocess(net)
        self.requires_grad_(False)
        self.eval()

    @staticmethod
    def get_provided_features_list():
        return ("clip",)

    @staticmethod
    def get_default_feature_layer_for_metric(metric):
        return "clip"

    @staticmethod
    def can_be_compiled():
        return False

    @staticmethod
    def get_dummy_input_for_compile():
        return torch.zeros(1, 3, 32, 32, dtype=torch.uint8)

    def forward(self, x):
        return (F.normalize(self.visual(self.prep(x)), dim=-1).float(),)
