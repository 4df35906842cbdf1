"""`lantern train-gpt`: train the class-conditional GPT target of the toy world on VQ tokens.

Teacher-forced next-token cross-entropy over all image tokens, classifier-free-guidance training by replacing 10 %
of the labels with the null class, AdamW with warm-up and cosine decay, validation loss on held-out tokens.
The checkpoint is the upstream container {"model": state_dict} plus the ModelArgs ("args") so it loads by path.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from lantern.engine.models.checkpoint import save_checkpoint
from lantern.params import params_from
from lantern.errors import UserError
from lantern.hparams import GPTParams
from lantern.io import load_torch, read_resume, read_structured, save_torch, write_json
from lantern.engine.models.model import GPT, ModelArgs, num_params
from lantern.worlds.toy.train_vq import cosine_lr, set_threads, sidecar


def load_tokens(path: str | Path, what: str) -> dict:
    """Read a `lantern tokenize` file: tokens [n, N], labels [n], codebook_size."""
    obj = load_torch(path, what, "lantern tokenize")
    if not {"tokens", "labels", "codebook_size"} <= set(obj):
        raise UserError(f"{what} {path} is not a `lantern tokenize` file (needs tokens, labels, codebook_size)")
    return obj


def load_training_tokens(paths: list[str]) -> dict:
    """One training set from one or more `lantern tokenize` files of the same tokenizer, in the order given."""
    sets = [load_tokens(p, "--tokens") for p in paths]
    for p, other in zip(paths[1:], sets[1:]):
        if other["tokens"].shape[1] != sets[0]["tokens"].shape[1] or other["codebook_size"] != sets[0]["codebook_size"]:
            raise UserError(f"--tokens {p} comes from a different tokenizer than {paths[0]} "
                            "(token count or codebook size differ)")
    if len(sets) == 1:
        return sets[0]
    return {"tokens": torch.cat([d["tokens"] for d in sets]), "labels": torch.cat([d["labels"] for d in sets]),
            "codebook_size": sets[0]["codebook_size"]}


@torch.no_grad()
def validation_loss(model: GPT, tokens: torch.Tensor, labels: torch.Tensor, batch: int) -> float:
    """Mean next-token cross-entropy (nats) with the true labels (no condition dropout)."""
    model.eval()
    total = 0.0
    for lo in range(0, len(tokens), batch):
        t, y = tokens[lo : lo + batch], labels[lo : lo + batch]
        logits, _ = model(y, t[:, :-1])
        total += F.cross_entropy(logits.flatten(0, 1), t.flatten(), reduction="sum").item()
    model.train()
    return total / tokens.numel()


def run_identity(params: GPTParams, train_set: dict, val_set: dict) -> dict:
    """What a resume checkpoint must share with this run: the params that change the weights and the tokens."""
    kept = {k: v for k, v in dataclasses.asdict(params).items() if k != "checkpoint_every"}
    digest = lambda t: hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()  # noqa: E731
    return {"params": json.dumps(kept, sort_keys=True, default=str),
            "data": [digest(d[k]) for d in (train_set, val_set) for k in ("tokens", "labels")]}


def train(params: GPTParams, train_set: dict, val_set: dict, resume: Path | None = None) -> tuple[GPT, dict]:
    """resume: a checkpoint written every params.checkpoint_every steps and read back by a rerun of the same params
    and tokens, which then continues from it (model, optimizer, sampling generator, history)."""
    tokens, labels = train_set["tokens"], train_set["labels"]
    args = params.model_args(int(train_set["codebook_size"]), tokens.shape[1])
    torch.manual_seed(params.seed)
    gen = torch.Generator().manual_seed(params.seed)
    model = GPT(args)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": params.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=params.lr, betas=params.betas)
    history, started, first, spent = [], time.time(), 0, 0.0
    resume = resume if params.checkpoint_every else None
    identity = run_identity(params, train_set, val_set) if resume is not None else None
    state = read_resume(resume, identity, "train-gpt")
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        gen.set_state(state["generator"])
        history, first, spent = state["history"], state["step"], state["seconds"]
    bar = tqdm(range(first, params.steps), desc="train-gpt", initial=first, total=params.steps, mininterval=2.0)
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, params.steps, params.lr, params.warmup_steps, params.min_lr_ratio)
        rows = torch.randint(len(tokens), (params.batch_size,), generator=gen)
        t = tokens[rows]
        cond = model.drop_cond(labels[rows], params.class_dropout_prob, generator=gen)
        logits, _ = model(cond, t[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), t.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if params.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), params.grad_clip)
        opt.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if (step + 1) % params.eval_every == 0 or step + 1 == params.steps:
            val = validation_loss(model, val_set["tokens"], val_set["labels"], params.eval_batch)
            history.append({"step": step + 1, "train_loss": loss.item(), "val_loss": val,
                            "seconds": spent + time.time() - started})
            tqdm.write(f"step {step + 1}: train loss {loss.item():.4f}, val loss {val:.4f}")
        if resume is not None and (step + 1) % params.checkpoint_every == 0 and step + 1 < params.steps:
            save_torch({"identity": identity, "step": step + 1, "model": model.state_dict(),
                        "optimizer": opt.state_dict(), "generator": gen.get_state(), "history": history,
                        "seconds": spent + time.time() - started}, resume)
    metrics = {"val_loss": history[-1]["val_loss"], "train_loss": history[-1]["train_loss"],
               "val_perplexity": math.exp(history[-1]["val_loss"]), "train_seconds": spent + time.time() - started,
               "params": num_params(model), "history": history}
    return model, metrics


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="lantern train-gpt", description="train the class-conditional GPT target")
    ap.add_argument("--tokens", required=True, nargs="+", help="training tokens (`lantern tokenize` files, "
                    "concatenated in the order given)")
    ap.add_argument("--val", required=True, help="held-out tokens for the validation loss")
    ap.add_argument("--out", required=True, help="checkpoint {'model': state_dict, 'args': ModelArgs}; config and "
                    "metrics go to the same path with .json")
    ap.add_argument("--params", default=None, help="GPTParams as inline JSON/YAML or a file path")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    a = ap.parse_args(argv)
    params = params_from(read_structured(a.params), GPTParams)
    train_set, val_set = load_training_tokens(a.tokens), load_tokens(a.val, "--val")
    if train_set["tokens"].shape[1] != val_set["tokens"].shape[1] or train_set["codebook_size"] != val_set["codebook_size"]:
        raise UserError("--tokens and --val come from different tokenizers (token count or codebook size differ)")
    top = int(max(train_set["labels"].max(), val_set["labels"].max()))
    if top >= params.num_classes:
        raise UserError(f"labels go up to {top} but num_classes = {params.num_classes}; set num_classes: {top + 1}")
    set_threads(a.threads)
    resume = Path(f"{a.out}.resume.pt")
    model, metrics = train(params, train_set, val_set, resume)
    save_checkpoint(a.out, model, args=model.args.to_dict())
    write_json(sidecar(a.out), {"kind": "gpt", "model_args": model.args.to_dict(),
                                "params": dataclasses.asdict(params), "metrics": metrics,
                                "tokens": [str(t) for t in a.tokens], "val": str(a.val), "threads": torch.get_num_threads()})
    resume.unlink(missing_ok=True)  # the target is written: nothing left to resume
    print(f"GPT: {metrics['params'] / 1e6:.2f}M params, val loss {metrics['val_loss']:.4f} "
          f"(perplexity {metrics['val_perplexity']:.1f}), {metrics['train_seconds']:.0f} s -> {a.out}")
