"""`lantern train-drafter`: train an EAGLE-1 drafter (engine/models/drafter.py) for a target.

Training regresses the target's next hidden state (SmoothL1) plus 0.1 x soft cross-entropy against the target's
distribution, with uniform noise on the input hidden states and conditions dropped to the null condition at the
target's class-dropout rate, so the drafter learns the unconditional stream CFG needs. unroll > 1 also trains chain
steps 2..n on the drafter's own predictions, attending as decoding does (`unrolled`). Data: real token sequences
(`lantern tokenize` / `lantern encode-images` files, with caption features for t2i), the target's own samples,
or both. A Chameleon target (--family; its pieces in train_drafter_chameleon.py) gets the LANTERN authors' drafter,
trained on the target's own generations from --prompts, its dropped rows on the family's uncond prompt.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm

from lantern.errors import UserError
from lantern.hparams import DrafterParams
from lantern.params import add_threads_arg, check_feature_layers, params_from, use_threads, with_threads
from lantern.io import load_torch, read_resume, read_structured, save_torch
from lantern.engine.models.chameleon import Chameleon, ChameleonDrafter
from lantern.engine.models.model import GPT, causal_mask

from lantern.engine.models.drafter import Drafter, DrafterOptions, save_drafter, target_states


# -- training -----------------------------------------------------------------------------------------------------
def unrolled_mask(base: Tensor, steps: int) -> Tensor:
    """The attention mask of `steps` query streams over S drafter positions, laid out one after another: stream 1
    at positions 0..S-1 (the catch-up, teacher-forced), stream s at positions s-1..S-1 (chain step s). A step-s query
    at position i sees what it sees in decoding: the catch-up's keys as its catch-up position c = i - s + 1 sees
    them (`base` [..., S, S], bool), and the keys of steps 2..s of its own chain (step k's at position c + k - 1).
    Returns [..., M, M] with M = the streams' total length."""
    S, device = base.shape[-1], base.device
    lengths = [S - s for s in range(steps)]
    M = sum(lengths)
    out = torch.zeros(*base.shape[:-2], M, M, dtype=torch.bool, device=device)
    starts = [sum(lengths[:s]) for s in range(steps)]
    for s in range(steps):  # query stream s + 1
        i = torch.arange(s, S, device=device)  # its positions
        rows = slice(starts[s], starts[s] + lengths[s])
        out[..., rows, : S] = base[..., i - s, :]
        for k in range(1, s + 1):  # key stream k + 1: position i - s + k, at index (i - s + k) - k of the stream
            out[..., rows, starts[k] : starts[k] + lengths[k]] |= (torch.arange(lengths[k], device=device)
                                                                  == (i - s)[:, None])
    return out


def drafter_losses(drafter: Drafter, target: GPT, cond: Tensor, tokens: Tensor, noise: float = 0.0,
                   cond_mask: Tensor | None = None, unroll: int = 1) -> dict[str, Tensor]:
    """Losses over the image-predicting drafter positions, plus agreement metrics (no grad through the target).
    unroll > 1: also chain steps 2..unroll, each fed the drafter's own prediction of the step before, as in
    decoding (losses and metrics suffixed _2, _3, ..)."""
    T = target.args.cls_token_num
    with torch.no_grad():
        x, h, logits = target_states(target, cond, tokens, cond_mask)
        emb = drafter.inputs(x[:, :T], tokens)
    h_in = h[:, :-1]
    if noise > 0:
        h_in = h_in + (torch.rand_like(h_in) * 2 - 1) * noise
    S = emb.shape[1]
    preds = unrolled(drafter, emb, h_in, drafter.padding_mask(cond_mask, S), unroll,
                     drafter.uncached_positions(cond_mask, S))
    out, h = {}, h[..., -target.args.dim :]  # the post-norm state, behind any feature layers' outputs
    for s, pred in enumerate(preds):  # step s + 1 at positions s..S-1; its image-predicting ones: s + lo >= T - 1
        lo = max(T - 1 - s, 0)
        out |= step_losses(drafter, pred[:, lo:], h[:, s + lo + 1 :], logits[:, s + lo + 1 :], f"_{s + 1}" if s else "")
    return out


def unrolled(drafter: Drafter, emb: Tensor, hidden: Tensor, mask: Tensor | None, steps: int,
             pos: Tensor | None = None) -> list[Tensor]:
    """The drafter's predictions over S positions (emb, hidden [B, S, d]; mask and positions pos ([S] or per row
    [B, S], default 0..S-1) as Drafter.forward's) as chain steps 1..steps: step 1 the teacher-forced pass, step
    s + 1 at positions s..S-1, fed step s's predictions at positions s-1..S-2 and attending as in decoding
    (unrolled_mask), in one pass over all streams per step."""
    hidden = drafter.fused(hidden)  # d wide, as the predictions the later streams read
    S = emb.shape[1]
    pos = torch.arange(S, device=emb.device) if pos is None else pos
    preds = [drafter(emb, hidden, mask, pos)]
    if steps > 1:
        base = causal_mask(S, S, emb.device) if mask is None else mask
        streams = [(emb, hidden, pos)]
        for s in range(1, steps):
            streams.append((emb[:, s:], preds[-1][:, :-1], pos[..., s:]))
            e, h, p = (torch.cat(parts, dim) for parts, dim in zip(zip(*streams), (1, 1, -1)))
            preds.append(drafter(e, h, unrolled_mask(base, s + 1), p)[:, -(S - s) :])
    return preds


def step_losses(drafter: Drafter, pred: Tensor, want_h: Tensor, logits: Tensor, suffix: str) -> dict[str, Tensor]:
    """SmoothL1 to the target's next hidden states, soft CE to its distributions, top-1 agreement and exact
    acceptance at temperature 1 without CFG, of predictions pred [B, S, d] against want_h and logits [B, S, ...]."""
    want_p, q_logits = logits.float().softmax(-1), drafter.head(pred)
    reg = F.smooth_l1_loss(pred.float(), want_h.float())
    ce = -(want_p * q_logits.log_softmax(-1)).sum(-1).mean()
    with torch.no_grad():
        top1 = (q_logits.argmax(-1) == logits.argmax(-1)).float().mean()
        accept = 1 - 0.5 * (q_logits.softmax(-1) - want_p).abs().sum(-1).mean()
    return {f"reg{suffix}": reg, f"ce{suffix}": ce, f"top1{suffix}": top1, f"accept{suffix}": accept}


def total_loss(losses: dict[str, Tensor], ce_weight: float) -> Tensor:
    """reg + ce_weight x ce, summed over the trained chain steps."""
    return sum(v + ce_weight * losses["ce" + k[3:]] for k, v in losses.items() if k.startswith("reg"))


def learning_rate(params: DrafterParams, step: int, total_steps: int) -> float:
    """The lr of optimizer step `step` (0-based) of `total_steps` under params.lr_schedule."""
    if params.lr_schedule == "constant":
        return params.lr
    cosine = 0.5 * (1 + math.cos(math.pi * step / max(total_steps - 1, 1)))
    return params.lr * (params.lr_floor + (1 - params.lr_floor) * cosine)


def to_target(cond: Tensor, target: GPT) -> Tensor:
    """Conditions on the target's device; caption features also in its dtype (labels stay integers)."""
    w = target.output.weight
    return cond.to(device=w.device, dtype=w.dtype if cond.is_floating_point() else cond.dtype)


def self_generate(target: GPT, cond, sampling: dict, seed: int, batch: int = 64,
                  cond_mask: Tensor | None = None, layout=None, done: Tensor | None = None,
                  on_batch=None) -> Tensor:
    """Token sequences sampled from the target itself for conditions `cond` (labels, caption features or
    CaptionRows, with cond_mask for captions; a Chameleon target's prompt ids and mask), one generator per sequence.
    layout: a family's head layout (engine/models/layout.py): the sequences are then its generated steps, forced
    tokens included, as the target reads them. done: the first sequences, already generated (a resumed data step);
    on_batch(sequences so far) is called after each batch.

    Seeds live in their own namespace (derived from `seed`), so training sequences never coincide with the images
    an evaluation draws from (global seed, index); sequence i draws from its own generator whatever the batches.
    """
    from lantern.engine.decoding.generate import generate
    from lantern.engine.decoding.sampling import SamplingParams, image_generator, image_seed
    from lantern.engine.models.layout import codes_to_ids

    params = params_from(sampling, SamplingParams, "drafter self_sampling.")
    out = [] if done is None or not len(done) else [done]
    device = target.output.weight.device
    for lo in tqdm(range(0 if done is None else len(done), len(cond), batch), desc="self-generate", mininterval=2.0):
        rows = torch.arange(lo, min(lo + batch, len(cond)))
        c = to_target(cond[rows], target)
        m = None if cond_mask is None else cond_mask[rows].to(device)
        gens = [image_generator(image_seed(seed, -1), i) for i in rows.tolist()]
        tokens = generate(target, c, params, gens, cond_mask=m, layout=layout)[0]
        out.append((tokens if layout is None else codes_to_ids(layout, tokens)).cpu())
        if on_batch is not None:
            on_batch(torch.cat(out))
    return torch.cat(out)


def autocast(device: torch.device):
    """bf16 autocast on CUDA (the drafter's fp32 master weights and AdamW state stay fp32; bf16 needs no loss
    scaling); a CPU trains in fp32 as before."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def run_identity(target: GPT, tokens: Tensor, cond, params: DrafterParams) -> dict:
    """What a resume checkpoint must share with this run: the params that change the weights, the target's shape,
    the training tokens and their conditions (checksums; caption features by the rows they are gathered from)."""
    kept = {k: v for k, v in dataclasses.asdict(params).items() if k != "checkpoint_every"}
    digest = lambda t: hashlib.sha256(t.detach().cpu().contiguous().numpy().tobytes()).hexdigest()  # noqa: E731
    return {"params": json.dumps(kept, sort_keys=True, default=str), "target": json.dumps(target.args.to_dict(),
            sort_keys=True, default=str), "tokens": digest(tokens), "tokens_shape": list(tokens.shape),
            "cond": digest(cond.where if isinstance(cond, CaptionRows) else cond)}


# the LANTERN authors' Chameleon drafter data: 90 % cond, 10 % uncond sequences (chameleon-targets.md section 5)
CHAMELEON_UNCOND = 0.1


def dropout_rate(target: GPT, params: DrafterParams) -> float:
    """The fraction of training rows whose condition becomes the null condition: params.cond_dropout, else the
    target's own class-dropout rate (LlamaGen) or the authors' uncond share (Chameleon)."""
    if params.cond_dropout is not None:
        return params.cond_dropout
    return CHAMELEON_UNCOND if isinstance(target, Chameleon) else target.args.class_dropout_prob


def new_drafter(target: GPT, params: DrafterParams) -> Drafter:
    """A freshly initialised drafter for `target` (seeded by the caller): ours, or for a Chameleon target the
    authors' architecture (their embedding, fc with bias, one Chameleon layer), its trained weights in fp32 beside
    the target's dtype (the frozen embedding and the shared head stay the target's)."""
    from lantern.pipeline.train_drafter_chameleon import check_params

    if not isinstance(target, Chameleon):
        return Drafter.from_target(target, DrafterOptions(feature_layers=tuple(params.feature_layers)))
    check_params(params)
    drafter = ChameleonDrafter.from_target(target)
    drafter.fc.float(), drafter.layer.float()
    return drafter


def train_drafter(target: GPT, tokens: Tensor, cond, params: DrafterParams,
                  cond_mask: Tensor | None = None, resume: str | Path | None = None) -> tuple[Drafter, dict]:
    """Train a drafter for `target` on image token sequences [n, N] with their conditions (labels, caption features,
    or CaptionRows gathered batch by batch); the target's hidden states are computed per batch, never stored.
    resume: a checkpoint file written every params.checkpoint_every steps and read back by a rerun, which then
    ends with the weights of an uninterrupted run (same machine, threads and device)."""
    device = target.output.weight.device
    target.eval().requires_grad_(False)
    torch.manual_seed(params.seed)
    drafter = new_drafter(target, params).train()
    dropout = dropout_rate(target, params)
    n = tokens.shape[0]
    n_val = max(1, int(round(n * params.val_frac)))
    if n - n_val < 1:
        raise UserError(f"drafter training needs at least 2 sequences, got {n}")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(params.seed))
    train_idx, val_idx = order[n_val:], order[:n_val]
    trainable = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=params.lr, betas=params.betas, weight_decay=params.weight_decay)
    shuffle = torch.Generator().manual_seed(params.seed + 1)
    batches = math.ceil(len(train_idx) / params.batch_size)

    def batch_of(idx, drop: bool):
        c = to_target(cond[idx], target)
        m = None if cond_mask is None else cond_mask[idx].to(device)
        if drop:  # null-condition rows at the dropout rate (global RNG, seeded above)
            c, m = target.drop_conditions(c, m, dropout)
        return c, tokens[idx][:, :-1].to(device), m

    resume = Path(resume) if resume is not None and params.checkpoint_every else None
    identity = run_identity(target, tokens, cond, params) if resume is not None else None
    state = read_resume(resume, identity, "train-drafter")
    history, step, start_epoch, start_b, perm, total = [], 0, 0, 0, None, 0.0
    if state is not None:
        drafter.load_state_dict(state["drafter"])
        opt.load_state_dict(state["optimizer"])
        shuffle.set_state(state["shuffle"])
        torch.set_rng_state(state["rng"])
        if device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"], device)
        history, step, start_epoch, start_b = state["history"], state["step"], state["epoch"], state["batch"]
        perm, total = state["perm"], state["total"]

    def checkpoint(epoch: int, b: int) -> None:
        save_torch({"identity": identity, "step": step, "epoch": epoch, "batch": b, "perm": perm, "total": total,
                    "history": history, "drafter": drafter.state_dict(), "optimizer": opt.state_dict(),
                    "shuffle": shuffle.get_state(), "rng": torch.get_rng_state(),
                    **({"cuda_rng": torch.cuda.get_rng_state(device)} if device.type == "cuda" else {})}, resume)

    bar = tqdm(total=params.epochs * batches, initial=step, desc="train-drafter", mininterval=2.0)
    for epoch in range(start_epoch, params.epochs):
        drafter.train()
        if epoch > start_epoch or perm is None:  # a resumed epoch keeps the order it was drawn with
            perm, total = train_idx[torch.randperm(len(train_idx), generator=shuffle)], 0.0
        for b in range(start_b if epoch == start_epoch else 0, batches):
            c, t, m = batch_of(perm[b * params.batch_size : (b + 1) * params.batch_size], drop=True)
            with autocast(device):
                losses = drafter_losses(drafter, target, c, t, params.hidden_noise, m, params.unroll)
                loss = total_loss(losses, params.ce_weight)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            for group in opt.param_groups:
                group["lr"] = learning_rate(params, step, params.epochs * batches)
            torch.nn.utils.clip_grad_value_(trainable, params.grad_clip)
            opt.step()
            total += loss.item()
            step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.4f}", refresh=False)
            if resume is not None and step % params.checkpoint_every == 0:
                checkpoint(epoch, b + 1)
        row = {"epoch": epoch + 1, "train_loss": total / batches}
        # one batch on the device at a time: t2i caption features of a 100k-image set would not fit at once
        with autocast(device):
            row.update(evaluate(drafter, target, (batch_of(val_idx[lo : lo + params.batch_size], drop=False)
                                                 for lo in range(0, len(val_idx), params.batch_size)), params.ce_weight,
                                params.unroll))
        history.append(row)
        tqdm.write(" ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    bar.close()
    return drafter.eval(), {"history": history, "n_train": len(train_idx), "n_val": len(val_idx)}


@torch.no_grad()
def evaluate(drafter: Drafter, target: GPT, batches: list, ce_weight: float, unroll: int = 1) -> dict:
    """Validation losses and agreement (no noise, no condition dropout), averaged over sequences."""
    drafter.eval()
    sums, count = {}, 0
    for c, t, m in batches:
        for k, v in drafter_losses(drafter, target, c, t, 0.0, m, unroll).items():
            sums[k] = sums.get(k, 0.0) + v.item() * len(c)
        count += len(c)
    out = {f"val_{k}": v / count for k, v in sums.items()}
    out["val_loss"] = float(total_loss(sums, ce_weight)) / count
    return out


# -- data ---------------------------------------------------------------------------------------------------------
class CaptionRows:
    """Caption features of several shards addressed by one row index and gathered batch by batch: the shards stay
    memory-mapped, since a real set (100k captions x 120 x 2048 in fp16, ~49 GB) does not belong in RAM."""

    def __init__(self, shards: list[Tensor], where: Tensor):
        self.shards, self.where = shards, where  # where [n, 2]: (shard, row in shard) of each row

    def __len__(self) -> int:
        return len(self.where)

    def __getitem__(self, rows: Tensor) -> Tensor:
        where = self.where[rows]
        out = torch.empty(len(where), *self.shards[0].shape[1:], dtype=torch.float32)
        for s in where[:, 0].unique().tolist():
            pick = where[:, 0] == s
            out[pick] = self.shards[s][where[pick, 1]].float()
        return out

    def subset(self, rows: Tensor) -> "CaptionRows":
        return CaptionRows(self.shards, self.where[rows])

    @staticmethod
    def cat(parts: list["CaptionRows"]) -> "CaptionRows":
        return CaptionRows(parts[0].shards, torch.cat([p.where for p in parts]))


def _load(path: Path, flag: str, maker: str) -> dict:
    return load_torch(path, flag, maker)


def read_caption_features(paths: list[str], target: GPT) -> tuple[dict[str, int], CaptionRows, Tensor]:
    """(id -> row, every row as CaptionRows, masks [n, T]) of `lantern encode-captions` files, checked against the
    target."""
    from lantern.worlds.llamagen.captions import read_captions_file

    a, index, shards, where, masks = target.args, {}, [], [], []
    for s, path in enumerate(map(Path, paths)):
        obj = read_captions_file(path, "--caption-features", mmap=True)
        feats, mask, ids = obj["features"], obj["mask"], list(obj["ids"])
        if feats.ndim != 3 or tuple(feats.shape[1:]) != (a.cls_token_num, a.caption_dim) or len(ids) != len(feats) \
                or tuple(mask.shape) != tuple(feats.shape[:2]):
            raise UserError(
                f"--caption-features {path} holds features {tuple(feats.shape)} for {len(ids)} ids with mask "
                f"{tuple(mask.shape)}; the target needs [n, {a.cls_token_num}, {a.caption_dim}] and a mask [n, {a.cls_token_num}]")
        for i, name in enumerate(ids):
            if name in index:
                raise UserError(f"--caption-features: id {name!r} appears twice (second time in {path}); give each shard once")
            index[name] = len(index)
        shards.append(feats)
        where.append(torch.stack([torch.full((len(ids),), s), torch.arange(len(ids))], 1))
        masks.append(mask.bool())
    return index, CaptionRows(shards, torch.cat(where)), torch.cat(masks)


def read_tokens(path: str | Path, target: GPT) -> dict:
    """A `lantern tokenize` or `lantern encode-images` file, checked against the target: tokens [n, N] plus what
    it holds of labels, ids, caption_features and caption_mask."""
    path = Path(path)
    obj = _load(path, "--tokens", "lantern tokenize` or `lantern encode-images")
    if "tokens" not in obj:
        raise UserError(f"--tokens {path} is not a `lantern tokenize` / `lantern encode-images` file (no tokens)")
    tokens, a = obj["tokens"].long(), target.args
    if tokens.ndim != 2 or tokens.shape[1] != a.image_tokens:
        raise UserError(f"--tokens {path} holds sequences of {tuple(tokens.shape[1:])} tokens; the target makes {a.image_tokens}")
    if tokens.max() >= a.vocab_size or tokens.min() < 0:
        raise UserError(f"--tokens {path} has codes outside the target's vocabulary of {a.vocab_size}")
    out = {"tokens": tokens, **{k: obj[k] for k in ("labels", "ids", "caption_features", "caption_mask") if k in obj}}
    if a.model_type == "c2i":
        if "labels" not in out:
            raise UserError(f"--tokens {path} has no class labels; encode a class-folder layout (--layout classes)")
        if out["labels"].max() >= a.num_classes:
            raise UserError(f"--tokens {path} has class {int(out['labels'].max())}; the target knows {a.num_classes} classes")
    return out


def real_data(paths: list[str], target: GPT, captions) -> tuple[Tensor, object, Tensor | None]:
    """(tokens, conditions, cond_mask) of --tokens files in order; t2i conditions come from the --caption-features
    rows whose ids match (`captions` from read_caption_features) or else from the tokens files themselves."""
    files = [read_tokens(p, target) for p in paths]
    tokens = torch.cat([f["tokens"] for f in files])
    if target.args.model_type == "c2i":
        return tokens, torch.cat([f["labels"].long() for f in files]), None
    if captions is None:
        for p, f in zip(paths, files):
            if "caption_features" not in f:
                raise UserError(f"--tokens {p} carries no caption features; give --caption-features "
                                "(`lantern encode-captions` files for its ids)")
        feats = torch.cat([f["caption_features"].float() for f in files])
        masks = [f.get("caption_mask") for f in files]
        mask = None if any(m is None for m in masks) else torch.cat(masks).bool()
        return tokens, feats, mask
    index, rows, mask = captions
    picks = []
    for p, f in zip(paths, files):
        if "ids" not in f:
            raise UserError(f"--tokens {p} has no image ids to match --caption-features; make it with `lantern encode-images`")
        missing = [i for i in f["ids"] if i not in index]
        if missing:
            raise UserError(f"--tokens {p}: id {missing[0]!r} (and {len(missing) - 1} more) has no row in --caption-features; "
                            "encode the captions of every shard (`lantern encode-captions --prompts <shard>.csv`)")
        picks += [index[i] for i in f["ids"]]
    picks = torch.tensor(picks, dtype=torch.long)
    return tokens, rows.subset(picks), mask[picks]


def self_conditions(target: GPT, n: int, captions) -> tuple[object, Tensor | None]:
    """Conditions of n self-generated sequences: classes in turn (c2i) or the --caption-features rows in turn."""
    if target.args.model_type == "c2i":
        return torch.arange(n) % target.args.num_classes, None
    if captions is None:
        raise UserError("self-generated text-to-image drafter data needs --caption-features (the captions to draw)")
    _, rows, mask = captions
    picks = torch.arange(n) % len(rows)
    return rows.subset(picks), mask[picks]


def _cat(conds: list):
    return CaptionRows.cat(conds) if isinstance(conds[0], CaptionRows) else torch.cat(conds)


def _take(cond, rows: Tensor):
    return cond.subset(rows) if isinstance(cond, CaptionRows) else cond[rows]


# -- CLI ----------------------------------------------------------------------------------------------------------
def main(argv: list[str]) -> None:
    from lantern.engine.models.checkpoint import parse_device
    from lantern.worlds.llamagen.upstream import load_gpt
    from lantern.pipeline.determinism import configure as configure_determinism

    ap = argparse.ArgumentParser(prog="lantern train-drafter", description=__doc__)
    ap.add_argument("--target", required=True, help="GPT checkpoint the drafter serves (with --family: the released "
                    "Chameleon HF folder)")
    ap.add_argument("--target-spec", default=None, help="llamagen target config (JSON/YAML or file) for upstream files")
    ap.add_argument("--tokens", nargs="+", help="`lantern tokenize` / `lantern encode-images` files (shards, in order)")
    ap.add_argument("--caption-features", nargs="+", help="`lantern encode-captions` files covering the tokens' ids (t2i)")
    ap.add_argument("--out", required=True, help="drafter checkpoint")
    ap.add_argument("--params", default=None, help="DrafterParams (JSON/YAML or file)")
    ap.add_argument("--device", default="auto")
    add_threads_arg(ap)
    ap.add_argument("--dtype", default="fp32", help="target dtype (fp32, bf16, fp16); the drafter's weights are fp32 "
                    "(on CUDA its forward runs under bf16 autocast)")
    cham = ap.add_argument_group("Chameleon targets (pipeline/train_drafter_chameleon.py)")
    cham.add_argument("--family", choices=("anole", "lumina-mgpt"), help="train the authors' Chameleon drafter for "
                      "this family's target, on its own generations; --out is then a folder")
    cham.add_argument("--prompts", help="captions to generate from: PartiPrompts-style TSV, JSON list or prompt CSV")
    cham.add_argument("--tokenizer", help="the model's tokenizer.json (or its folder)")
    cham.add_argument("--vqgan-ckpt", help="the model's tokenizer/vqgan.ckpt")
    cham.add_argument("--vqgan-yaml", help="its vqgan.yaml (default: beside the checkpoint)")
    cham.add_argument("--pixels", type=int, help="image side (default: Anole 512, Lumina-mGPT 768)")
    cham.add_argument("--prompt-tokens", type=int, default=128, help="prompt slots (prompts left-padded to it)")
    cham.add_argument("--gen-batch", type=int, default=8, help="sequences generated per batch (memory; each sequence draws from its own seed)")
    a = ap.parse_args(argv)
    params = params_from(read_structured(a.params), DrafterParams)
    params = with_threads(params, a.threads)
    if a.family:
        return chameleon_main(a, use_threads(params))
    given = [f for f in ("prompts", "tokenizer", "vqgan_ckpt", "vqgan_yaml", "pixels") if getattr(a, f) is not None]
    if given:
        raise UserError(f"--{given[0].replace('_', '-')} is for Chameleon targets; give --family anole or lumina-mgpt")
    if params.data != "self" and not a.tokens:
        raise UserError(f"drafter data {params.data} needs --tokens (`lantern tokenize` / `lantern encode-images` files)")
    params = use_threads(params)
    spec = {"spec": read_structured(a.target_spec, "--target-spec")} if a.target_spec else {}
    device = parse_device(a.device)
    configure_determinism(device)  # CUDA: deterministic kernels, so a resumed run ends where an uninterrupted one does
    target = load_gpt(a.target, **spec, dtype=a.dtype, device=str(device))
    check_feature_layers(params.feature_layers, target.args.n_layer)  # before any self-generation
    captions = None
    if a.caption_features:
        if target.args.model_type != "t2i":
            raise UserError("--caption-features is for text-to-image targets; this target is class-conditional")
        captions = read_caption_features(a.caption_features, target)
    parts = []
    if params.data != "self":
        parts.append(real_data(a.tokens, target, captions))
    if params.data != "real":
        cond, mask = self_conditions(target, params.n_self, captions)
        parts.append((self_generate(target, cond, params.self_sampling, params.seed, cond_mask=mask), cond, mask))
    tokens, cond = torch.cat([p[0] for p in parts]), _cat([p[1] for p in parts])
    masks = [p[2] for p in parts]
    cond_mask = None if any(m is None for m in masks) else torch.cat(masks)
    if params.max_sequences:
        keep = torch.arange(min(params.max_sequences, len(tokens)))
        tokens, cond = tokens[keep], _take(cond, keep)
        cond_mask = None if cond_mask is None else cond_mask[keep]
    resume = Path(f"{a.out}.resume.pt")
    drafter, metrics = train_drafter(target, tokens, cond, params, cond_mask, resume=resume)
    save_drafter(a.out, drafter, params, metrics=metrics, target=str(a.target), tokens=a.tokens or [],
                 caption_features=a.caption_features or [])
    resume.unlink(missing_ok=True)  # the drafter is written: nothing left to resume
    last = metrics["history"][-1]
    print(f"drafter -> {a.out}: val top-1 agreement {last['val_top1']:.3f}, val acceptance {last['val_accept']:.3f}")


def chameleon_self_data(world, captions: list[str], params: DrafterParams, path: Path, batch: int):
    """(steps [n, N], prompt ids [n, T], masks [n, T]) of params.n_self sequences the world's Chameleon target
    generates from `captions` in turn, kept in `path` as they are made (train_drafter_chameleon.SelfData)."""
    from lantern.pipeline.train_drafter_chameleon import SelfData

    data = SelfData(world, captions, params, path)
    tokens = data.done if data.complete else self_generate(
        world.target, data.cond, data.sampling, params.seed, batch, data.mask, world.layout, data.done, data.keep)
    return tokens, data.cond, data.mask


def chameleon_main(a, params: DrafterParams) -> None:
    """`lantern train-drafter --family`: the authors' drafter for a released Chameleon target, trained on its own
    generations and written in their folder layout (pipeline/train_drafter_chameleon.py)."""
    from lantern.pipeline.train_drafter_chameleon import load, save_authors_folder

    world, captions = load(a, params)
    out = Path(a.out)
    tokens, cond, mask = chameleon_self_data(world, captions, params, Path(f"{out}.self.pt"), a.gen_batch)
    if params.max_sequences:
        tokens, cond, mask = (t[: params.max_sequences] for t in (tokens, cond, mask))
    resume = Path(f"{out}.resume.pt")
    drafter, metrics = train_drafter(world.target, tokens, cond, params, mask, resume=resume)
    record = {"family": a.family, "target": str(a.target), "prompts": str(a.prompts), "sequences": len(tokens),
              "params": dataclasses.asdict(params), **metrics}
    save_authors_folder(out, drafter, world.target, a.target, record)
    resume.unlink(missing_ok=True)  # the drafter is written: nothing left to resume (the data stays, for reuse)
    last = metrics["history"][-1]
    print(f"drafter -> {out}: val top-1 agreement {last['val_top1']:.3f}, val acceptance {last['val_accept']:.3f}")
