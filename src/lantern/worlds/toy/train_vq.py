"""`lantern train-vq`: train the toy VQ tokenizer.

Training: MSE (+ optional L1) reconstruction, codebook and commitment losses, AdamW with warm-up and cosine decay,
and dead-code restarts: every `restart_every` steps, codes chosen by no vector since the last restart are moved onto
random encoder outputs of the current batch, so the whole codebook stays in use.
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

from lantern.engine.models.checkpoint import save_checkpoint
from lantern.params import params_from
from lantern.worlds.toy.data import load_data, to_unit
from lantern.errors import UserError
from lantern.hparams import VQParams
from lantern.io import read_structured, write_json
from lantern.engine.models.vq import VQArgs, VQModel


def cosine_lr(step: int, total: int, lr: float, warmup: int, min_ratio: float) -> float:
    """Linear warm-up to lr, then cosine decay to lr * min_ratio at `total`."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))


def set_threads(n: int) -> None:
    # on a shared 2-core machine, more threads than free cores makes torch several times slower, not faster
    if n > 0:
        torch.set_num_threads(n)


@torch.no_grad()
def evaluate(model: VQModel, images: torch.Tensor, batch: int) -> dict:
    """PSNR (0..1 pixel scale, from the mean squared error over the set), codebook usage and code perplexity."""
    model.eval()
    se, counts = 0.0, torch.zeros(model.args.codebook_size)
    for lo in range(0, len(images), batch):
        x = to_unit(images[lo : lo + batch])
        idx = model.encode(x)
        rec = model.decode_code(idx).clamp(-1, 1)
        se += ((rec - x) / 2).pow(2).sum().item()
        counts += torch.bincount(idx.flatten(), minlength=len(counts)).float()
    model.train()
    mse = se / images.numel()
    p = counts / counts.sum()
    perplexity = math.exp(-(p[p > 0] * p[p > 0].log()).sum().item())
    return {"psnr": 10 * math.log10(1 / mse), "mse": mse, "codebook_usage": (counts > 0).float().mean().item(),
            "codes_used": int((counts > 0).sum()), "code_perplexity": perplexity}


@torch.no_grad()
def restart_dead_codes(model: VQModel, counts: torch.Tensor, latents: torch.Tensor, opt, gen) -> int:
    dead = (counts == 0).nonzero().flatten()
    if len(dead) == 0:
        return 0
    flat = latents.reshape(-1, latents.shape[-1])
    pick = torch.randint(len(flat), (len(dead),), generator=gen)
    w = model.quantize.embedding.weight
    w[dead] = flat[pick] + 0.01 * torch.randn(len(dead), w.shape[1], generator=gen)
    state = opt.state.get(w, {})
    for key in ("exp_avg", "exp_avg_sq"):
        if key in state:
            state[key][dead] = 0  # stale moments would drag the moved codes straight back
    return len(dead)


def train(params: VQParams, train_images: torch.Tensor, val_images: torch.Tensor) -> tuple[VQModel, dict]:
    gen = torch.Generator().manual_seed(params.seed)
    torch.manual_seed(params.seed)
    model = VQModel(params.vq_args())
    opt = torch.optim.AdamW(model.parameters(), lr=params.lr, betas=(0.9, 0.99), weight_decay=params.weight_decay)
    counts = torch.zeros(params.codebook_size)
    restarted = 0
    started = time.time()
    bar = tqdm(range(params.steps), desc="train-vq", mininterval=2.0)
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, params.steps, params.lr, params.warmup_steps, params.min_lr_ratio)
        x = to_unit(train_images[torch.randint(len(train_images), (params.batch_size,), generator=gen)])
        rec, codebook_loss, commit_loss, idx = model(x)
        mse = F.mse_loss(rec, x)
        loss = mse + codebook_loss + commit_loss
        if params.l1_weight:
            loss = loss + params.l1_weight * F.l1_loss(rec, x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        counts += torch.bincount(idx.flatten(), minlength=params.codebook_size).float()
        if params.restart_every and (step + 1) % params.restart_every == 0:
            if step < params.restart_until * params.steps:
                with torch.no_grad():
                    restarted += restart_dead_codes(model, counts, model.encode_latent(x), opt, gen)
            counts.zero_()
        # x spans 2 units; PSNR on the 0..1 pixel scale
        bar.set_postfix(mse=f"{mse.item():.4f}", psnr=f"{10 * math.log10(4 / max(mse.item(), 1e-10)):.1f}")
    train_s = time.time() - started
    metrics = evaluate(model, val_images, params.eval_batch)
    metrics.update(train_seconds=train_s, codes_restarted=restarted, steps=params.steps,
                   params=sum(p.numel() for p in model.parameters()))
    return model, metrics


def sidecar(path: str | Path) -> Path:
    """vq.pt -> vq.json: the config and metrics written beside every checkpoint."""
    return Path(path).with_suffix(".json")


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="lantern train-vq", description="train the toy VQ tokenizer")
    ap.add_argument("--data", required=True, help="training images (`lantern make-data` file)")
    ap.add_argument("--val", required=True, help="held-out images for PSNR and codebook usage")
    ap.add_argument("--out", required=True, help="checkpoint {'model': state_dict, 'args': VQArgs}; config and "
                    "metrics go to the same path with .json")
    ap.add_argument("--params", default=None, help="VQParams as inline JSON/YAML or a file path")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    a = ap.parse_args(argv)
    params = params_from(read_structured(a.params), VQParams)
    vq_args = params.vq_args()
    train_data, val_data = load_data(a.data, "--data"), load_data(a.val, "--val")
    side = train_data["images"].shape[-1]
    if side % vq_args.downsample:
        raise UserError(f"image size {side} is not divisible by the VQ downsample factor {vq_args.downsample}")
    set_threads(a.threads)
    model, metrics = train(params, train_data["images"], val_data["images"])
    save_checkpoint(a.out, model, args=dataclasses.asdict(vq_args))
    write_json(sidecar(a.out), {"kind": "vq", "vq_args": dataclasses.asdict(vq_args),
                                "params": dataclasses.asdict(params), "metrics": metrics,
                                "data": str(a.data), "val": str(a.val), "threads": torch.get_num_threads()})
    print(f"VQ: PSNR {metrics['psnr']:.2f} dB, codebook usage {metrics['codebook_usage']:.3f} "
          f"({metrics['codes_used']}/{params.codebook_size}), {metrics['train_seconds']:.0f} s -> {a.out}")
