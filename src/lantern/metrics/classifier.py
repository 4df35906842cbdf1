"""Class accuracy: does a class-conditional sample show the class it was conditioned on?

A small CNN trained on the toy world's images (`lantern train-classifier`, train_classifier.py) labels each
generated image; class_accuracy is the share of images labelled with their conditioning class (the `label` column
of `lantern sample`'s stats.csv). Its standard error is the binomial one, sqrt(p (1 - p) / (n - 1)), which is the
per-image standard error of the mean of the 0/1 hits: the same convention as the CLIP score's SEM.

Checkpoint: <name>.pt = {"format": FORMAT, "config": {...}, "state_dict": {...}}; <name>.json beside it holds the
config, the training parameters, the held-out accuracy and the training history.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from lantern.errors import UserError
from lantern.io import load_torch, read_csv

FORMAT = "lantern-classifier-v1"


@dataclass
class ClassAccuracyParams:
    weights_path: str = ""  # a `lantern train-classifier` checkpoint; empty = no class accuracy (columns absent)
    batch_size: int = 256


class ToyClassifier(nn.Module):
    """Three conv blocks (conv-BN-ReLU x 2, then 2x2 max-pool) and a linear head on the global average: 164k
    parameters at the default width 24 (330 kB in float16), enough for 16 rotated shapes on textured backgrounds."""

    def __init__(self, num_classes: int, width: int = 16, image_size: int = 32):
        super().__init__()
        self.config = {"num_classes": num_classes, "width": width, "image_size": image_size}
        layers, c_in = [], 3
        for c in (width, 2 * width, 4 * width):
            layers += [nn.Conv2d(c_in, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(inplace=True),
                       nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(inplace=True),
                       nn.MaxPool2d(2)]
            c_in = c
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(c_in, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 [B, 3, H, W] (any size: resized to the training size) -> logits [B, num_classes]."""
        x = images.float() / 127.5 - 1
        size = self.config["image_size"]
        if x.shape[-2:] != (size, size):
            x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
        return self.head(self.features(x).mean((2, 3)))


def save_classifier(net: ToyClassifier, path: str | os.PathLike) -> None:
    from lantern.io import save_torch

    state = {k: v.cpu() for k, v in net.state_dict().items()}
    save_torch({"format": FORMAT, "config": net.config, "state_dict": state}, path)


def load_classifier(path: str | os.PathLike, device: str = "cpu", key: str = "classifier") -> ToyClassifier:
    """A saved classifier, in eval mode; a missing file or a checkpoint of another kind is one UserError line."""
    obj = load_torch(path, f"{key} checkpoint", "lantern train-classifier")
    if obj.get("format") != FORMAT or not isinstance(obj.get("config"), dict):
        raise UserError(f"{key} checkpoint {path} is not a `lantern train-classifier` checkpoint (format "
                        f"{obj.get('format')!r}, expected {FORMAT!r}); train one with `lantern train-classifier`")
    net = ToyClassifier(**obj["config"])
    try:
        net.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in obj["state_dict"].items()})
    except (RuntimeError, AttributeError) as e:
        raise UserError(f"{key} checkpoint {path} does not match its own config ({str(e).splitlines()[0][:120]}); "
                        "retrain it") from None
    return net.to(device).eval()


@torch.no_grad()
def predict(net: ToyClassifier, images, batch_size: int = 256) -> torch.Tensor:
    """Predicted class of each image: `images` a uint8 tensor [N, 3, H, W] or an ImageSet (read batch by batch)."""
    device = next(net.parameters()).device
    out = []
    for lo in range(0, len(images), batch_size):
        hi = min(lo + batch_size, len(images))
        batch = images[lo:hi] if torch.is_tensor(images) else images.batch(lo, hi)
        out.append(net(batch.to(device)).argmax(1).cpu())
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)


def accuracy_se(hits: torch.Tensor) -> tuple[float, float]:
    """(mean, standard error) of 0/1 hits: the binomial SE with n - 1, i.e. the SEM of the hits (NaN below 2)."""
    n = len(hits)
    p = float(hits.float().mean()) if n else math.nan
    return p, math.sqrt(p * (1 - p) / (n - 1)) if n > 1 else math.nan


def read_labels(paths: list[str | os.PathLike]) -> dict[int, int]:
    """image_index -> conditioning class from CSV tables with image_index and label columns (`lantern sample`'s
    stats.csv)."""
    labels: dict[int, int] = {}
    for path in paths:
        if not os.path.isfile(path):
            raise UserError(f"labels table {path} does not exist")
        df = read_csv(path, "labels table", "give a `lantern sample` stats.csv (image_index, label)")
        if not {"image_index", "label"} <= set(df.columns) or df["label"].isna().any():
            raise UserError(f"labels table {path} needs image_index and label columns with a label on every row "
                            "(class accuracy is for class-conditional samples)")
        for i, lab in zip(df["image_index"].astype(int), df["label"].astype(int)):
            if labels.setdefault(i, lab) != lab:
                raise UserError(f"image {i} has two different labels in {', '.join(map(str, paths))}")
    return labels


def class_accuracy(net: ToyClassifier, images, labels: torch.Tensor, batch_size: int = 256) -> dict:
    """class_accuracy (+ SE) of images against their conditioning labels."""
    if len(images) != len(labels):
        raise ValueError(f"{len(images)} images but {len(labels)} labels")
    if len(labels) and int(labels.max()) >= net.config["num_classes"]:
        raise UserError(f"label {int(labels.max())} is outside the classifier's {net.config['num_classes']} classes; "
                        "give the classifier of this world")
    acc, se = accuracy_se(predict(net, images, batch_size).eq(labels))
    return {"class_accuracy": acc, "class_accuracy_se": se, "class_accuracy_chance": 1 / net.config["num_classes"]}


def labels_for(images, labels: dict[int, int]) -> torch.Tensor:
    """The labels of an ImageSet's images, in its order; an image without one is a UserError."""
    missing = [i for i in images.indices() if i not in labels]
    if missing:
        raise UserError(f"{len(missing)} generated image(s) have no label for class accuracy, e.g. index "
                        f"{missing[0]}; pass the point's stats.csv with --captions")
    return torch.tensor([labels[i] for i in images.indices()], dtype=torch.long)

