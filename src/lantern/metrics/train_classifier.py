"""`lantern train-classifier`: the toy world's class-accuracy classifier (classifier.py), trained on its images.

It learns from the training split and, when a VQ checkpoint is given, from the VQ reconstructions of the same
images: generated images are VQ decodes, and a model that has seen only originals may not read reconstructions
(the toy CLIP scored 93 % on originals but 35 % on reconstructions before it saw them). Held-out accuracy is
measured on the held-out split (--val), originals and reconstructions. Runs on CUDA when there is one (--device);
deterministic from params.seed on a given device and CPU thread count (both recorded). Output: <out>.pt and
<out>.json (config, params, device, held-out accuracy, training history).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from lantern.errors import UserError
from lantern.hparams import ClassifierParams
from lantern.io import read_structured, write_json
from lantern.metrics.classifier import ToyClassifier, load_classifier, predict, save_classifier
from lantern.params import add_threads_arg, check_device_name, params_from, use_threads, with_threads
from lantern.worlds.toy.data import load_data, reconstruct


def accuracy(net: ToyClassifier, images: torch.Tensor, labels: torch.Tensor) -> float:
    was_training = net.training
    net.eval()
    acc = float(predict(net, images).eq(labels.cpu()).float().mean())
    net.train(was_training)
    return acc


def train(net: ToyClassifier, images, labels, p: ClassifierParams, recon=None, val=None, progress: bool = True):
    """Cross-entropy training on (image or its reconstruction, class); returns the history of losses and held-out
    accuracies (val: (images, labels) or None)."""
    g = torch.Generator().manual_seed(p.seed)  # the batches: drawn on the CPU, the same on every device
    device = next(net.parameters()).device
    opt = torch.optim.AdamW(net.parameters(), lr=p.lr, weight_decay=p.weight_decay)
    net.train()
    history, losses, t0 = [], [], time.perf_counter()
    for step in tqdm(range(p.steps), desc="train-classifier", disable=not progress, mininterval=5.0):
        idx = torch.randint(0, len(images), (p.batch_size,), generator=g).to(images.device)
        x = images[idx]
        if recon is not None:
            use = (torch.rand(p.batch_size, generator=g) < p.recon_prob).to(device)
            x = torch.where(use[:, None, None, None], recon[idx], x)
        lr = p.lr * min(1.0, (step + 1) / p.warmup_steps) * 0.5 * (1 + math.cos(math.pi * step / p.steps))
        for group in opt.param_groups:
            group["lr"] = lr
        loss = F.cross_entropy(net(x.to(device)), labels[idx].to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if (step + 1) % p.eval_every == 0 or step + 1 == p.steps:
            entry = {"step": step + 1, "seconds": time.perf_counter() - t0,
                     "train_loss": sum(losses[-p.eval_every:]) / len(losses[-p.eval_every:])}
            if val is not None:
                entry["val_accuracy"] = accuracy(net, *val)
            history.append(entry)
    net.eval()
    return {"train_seconds": time.perf_counter() - t0, "history": history}


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="lantern train-classifier", description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="training split (`lantern make-data` file)")
    ap.add_argument("--val", required=True, help="held-out split (`lantern make-data` file): held-out accuracy")
    ap.add_argument("--vq", default=None, help="VQ checkpoint: also train (and test) on VQ reconstructions")
    ap.add_argument("--out", required=True, help="output <name>.pt; <name>.json beside it")
    ap.add_argument("--params", default=None, help="ClassifierParams as inline JSON/YAML or a file path")
    ap.add_argument("--device", default="auto", help="cpu | cuda | cuda:N | auto (cuda when available)")
    add_threads_arg(ap)
    a = ap.parse_args(argv)
    check_device_name(a.device, "--device")
    device = ("cuda" if torch.cuda.is_available() else "cpu") if a.device == "auto" else a.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {a.device}: no CUDA device here; use --device cpu or auto")
    p = params_from(read_structured(a.params), ClassifierParams)
    p = with_threads(p, a.threads)
    out = Path(a.out)
    if out.suffix != ".pt":
        raise UserError(f"--out must end in .pt (the record goes to the .json beside it), got {out}")
    data, val = load_data(a.data, "--data"), load_data(a.val, "--val")
    images, labels = data["images"], data["labels"]
    if len(images) < p.batch_size or not len(val["images"]):
        raise UserError(f"--data holds {len(images)} images (need >= batch_size = {p.batch_size}) and --val "
                        f"{len(val['images'])} (need >= 1)")
    if images.shape[1:] != val["images"].shape[1:]:
        raise UserError(f"--data images are {tuple(images.shape[1:])} but --val images {tuple(val['images'].shape[1:])}")
    num_classes = int(max(labels.max(), val["labels"].max())) + 1
    vq = None
    if a.vq:
        from lantern.worlds.llamagen.upstream import load_vq

        vq = load_vq(a.vq).to(device)
    p = use_threads(p)
    torch.manual_seed(p.seed)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    images, labels = images.to(device), labels.to(device)
    t0 = time.perf_counter()
    recon = reconstruct(vq, images) if vq is not None else None
    val_recon = reconstruct(vq, val["images"].to(device)).cpu() if vq is not None else None
    recon_seconds = time.perf_counter() - t0

    net = ToyClassifier(num_classes, p.width, images.shape[-1]).to(device)
    log = train(net, images, labels, p, recon, (val["images"], val["labels"]))
    save_classifier(net, out)
    net = load_classifier(out, device)  # the saved file is what gets evaluated
    record = {
        "kind": "classifier",
        "config": net.config,
        "params": dataclasses.asdict(p),
        "device": torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu",
        "metrics": {
            **log,
            "recon_seconds": recon_seconds,
            "n_train": len(images),
            "n_val": len(val["images"]),
            "num_params": sum(t.numel() for t in net.parameters()),
            "val_accuracy": accuracy(net, val["images"], val["labels"]),
            "val_accuracy_recon": accuracy(net, val_recon, val["labels"]) if val_recon is not None else None,
            "chance": 1 / num_classes,
        },
        "data": str(a.data), "val": str(a.val), "vq": a.vq,
    }
    write_json(out.with_suffix(".json"), record)
    m = record["metrics"]
    print(f"classifier -> {out} ({m['num_params'] / 1e3:.0f}k params, trained {log['train_seconds']:.0f} s): held-out "
          f"accuracy {m['val_accuracy']:.4f} on {m['n_val']} originals, "
          + (f"{m['val_accuracy_recon']:.4f} on their VQ reconstructions" if val_recon is not None else
             "no VQ reconstructions (no --vq)") + f" (chance {m['chance']:.3f})")
