"""The EAGLE-1 drafter and `lantern train-drafter`.

Architecture (method.md section 4): drafter position t reads the target's input embedding at position t + 1
(condition embeddings for t < T - 1, image-token embeddings after) and the target's post-norm hidden state h_t,
joins them with fc (2d -> d, bias), runs one decoder layer without input norm and no final norm, and predicts
h_{t+1}; the target's frozen output head turns that into logits for the token at t + 2. Token embedding and head
are frozen copies of the target's and are not stored in the drafter checkpoint. RoPE row t + 1 (the position of
the token read) is used, so the first image step is rotated like the target's img_0.

Training regresses the target's next hidden state (SmoothL1) plus 0.1 x soft cross-entropy against the target's
distribution, with uniform noise on the input hidden states and conditions dropped to the null condition at the
target's class-dropout rate, so the drafter learns the unconditional stream CFG needs.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm

from .errors import UserError
from .io import read_structured, save_torch
from .model import GPT, KVCache, ModelArgs, TransformerBlock, causal_mask, key_mask, precompute_rope_2d

FORMAT = "lantern-drafter-v1"
TRAINED = ("fc.", "layer.")  # the drafter's own weights; embedding and head come from the target


class Drafter(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.fc = nn.Linear(2 * args.dim, args.dim, bias=True)
        self.layer = TransformerBlock(args, input_norm=False)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        self.rope = precompute_rope_2d(args)
        self.key_valid: Tensor | None = None
        for m in (self.fc, *self.layer.modules()):
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
        nn.init.zeros_(self.fc.bias)

    @classmethod
    def from_target(cls, target: GPT) -> "Drafter":
        d = cls(target.args).to(device=target.output.weight.device)
        d.copy_frozen(target)
        return d

    def copy_frozen(self, target: GPT) -> None:
        with torch.no_grad():
            self.tok_embeddings.weight.copy_(target.tok_embeddings.weight)
            self.output.weight.copy_(target.output.weight)
        self.tok_embeddings.requires_grad_(False)
        self.output.requires_grad_(False)

    def _apply(self, fn, *a, **kw):
        out = super()._apply(fn, *a, **kw)
        self.rope = self.rope.to(self.fc.weight.device)  # fp32 on the weights' device, never in the state dict
        return out

    def trained_state(self) -> dict[str, Tensor]:
        return {k: v.detach().cpu() for k, v in self.state_dict().items() if k.startswith(TRAINED)}

    def head(self, hidden: Tensor) -> Tensor:
        return self.output(hidden).float()

    def embed_tokens(self, tokens: Tensor) -> Tensor:
        return self.tok_embeddings(tokens)

    def _run(self, emb: Tensor, hidden: Tensor, pos: Tensor, mask: Tensor | None, slots: Tensor | None) -> Tensor:
        x = self.fc(torch.cat([emb, hidden.to(emb.dtype)], dim=-1))
        return self.layer(x, self.rope[pos + 1], mask, slots)

    def forward(self, emb: Tensor, hidden: Tensor, mask: Tensor | None = None) -> Tensor:
        """Uncached pass over drafter positions 0..S-1: emb [B, S, d] (target inputs at t + 1), hidden [B, S, d]
        (target h_t); returns the predicted h_{t+1} [B, S, d]. mask None: causal."""
        return self._run(emb, hidden, torch.arange(emb.shape[1], device=emb.device), mask, None)

    # -- cached drafting ------------------------------------------------------------------------------------------
    def setup_cache(self, batch: int, extra: int = 0, cond_mask: Tensor | None = None) -> None:
        w = self.fc.weight
        max_len = self.args.max_seq_len + extra
        self.layer.attention.kv_cache = KVCache(batch, self.args.n_head, max_len, self.args.head_dim, w.dtype, w.device)
        self.key_valid = torch.ones(batch, max_len, dtype=torch.bool, device=w.device)
        if cond_mask is not None:
            # drafter position t reads condition t + 1, so the padding mask shifts by one
            self.key_valid[:, : cond_mask.shape[1] - 1] = cond_mask[:, 1:].bool()

    def clear_cache(self) -> None:
        self.layer.attention.kv_cache = None
        self.key_valid = None

    @property
    def cache_len(self) -> int:
        return self.layer.attention.kv_cache.k.shape[2]

    def forward_cached(self, emb: Tensor, hidden: Tensor, pos: Tensor, visible: Tensor,
                       slots: Tensor | None = None) -> Tensor:
        """Cached pass at drafter positions `pos` [S], written to cache `slots` [S] (default: the positions; tree
        nodes sharing a depth share a position but not a slot); visible [S, max_len] as in GPT."""
        slots = pos if slots is None else slots
        own = torch.zeros_like(visible)
        own[torch.arange(len(slots), device=slots.device), slots] = True
        mask = (visible[None, None] & self.key_valid[:, None, None, :]) | own[None, None]
        return self._run(emb, hidden, pos, mask, slots)

    def step(self, emb: Tensor, hidden: Tensor, start: int) -> Tensor:
        """Causal cached pass over consecutive drafter positions start.. start + S - 1."""
        S = emb.shape[1]
        pos = torch.arange(start, start + S, device=emb.device)
        return self.forward_cached(emb, hidden, pos, causal_mask(S, self.cache_len, emb.device, start=start))


def target_states(target: GPT, cond: Tensor, tokens: Tensor, cond_mask: Tensor | None = None):
    """Teacher-forced target pass keeping every position: (input embeddings, post-norm hidden, logits), each
    [B, T + N - 1, ...] for tokens = img[:, :-1] (GPT.forward keeps only the image-predicting positions)."""
    x = torch.cat([target.embed_cond(cond), target.embed_tokens(tokens)], dim=1)
    S = x.shape[1]
    mask = None
    if cond_mask is not None:
        mask = causal_mask(S, S, x.device) & key_mask(cond_mask, S)
        mask = mask | torch.eye(S, dtype=torch.bool, device=x.device)
    logits, hidden = target.run(x, torch.arange(S, device=x.device), mask)
    return x, hidden, logits


def drafter_mask(cond_mask: Tensor | None, S: int) -> Tensor | None:
    """Causal mask for the drafter's S positions; padded conditions (shifted by one) hidden."""
    if cond_mask is None:
        return None
    shifted = torch.ones_like(cond_mask, dtype=torch.bool)
    shifted[:, :-1] = cond_mask[:, 1:].bool()
    return (causal_mask(S, S, cond_mask.device) & key_mask(shifted, S)) | torch.eye(S, dtype=torch.bool, device=cond_mask.device)


# -- training -----------------------------------------------------------------------------------------------------
@dataclass
class DrafterParams:
    data: str = "real"  # real: teacher-forced on --tokens; self: on the target's own samples; both
    n_self: int = 0  # self-generated sequences (data self / both)
    self_sampling: dict = field(default_factory=dict)  # SamplingParams for the self-generated sequences
    epochs: int = 20
    batch_size: int = 32
    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0
    grad_clip: float = 0.5  # clip each gradient value to [-0.5, 0.5] (EAGLE)
    ce_weight: float = 0.1
    hidden_noise: float = 0.1  # uniform noise in [-a, a] on the input hidden states
    val_frac: float = 0.05
    max_sequences: int = 0  # 0: all
    seed: int = 0
    threads: int = 0

    def __post_init__(self):
        self.betas = tuple(self.betas)
        if self.data not in ("real", "self", "both"):
            raise UserError(f"drafter data must be real, self or both; got {self.data!r}")
        if self.data != "real" and self.n_self < 1:
            raise UserError(f"drafter data {self.data} needs n_self >= 1 self-generated sequences")
        if self.epochs < 1 or self.batch_size < 1 or self.lr <= 0:
            raise UserError("drafter epochs, batch_size and lr must be positive")
        if not 0 < self.val_frac < 1:
            raise UserError(f"drafter val_frac={self.val_frac} must lie in (0, 1)")
        if len(self.betas) != 2 or self.grad_clip <= 0 or self.hidden_noise < 0 or self.ce_weight < 0:
            raise UserError("drafter betas must be two numbers, grad_clip > 0, hidden_noise and ce_weight >= 0")


def drafter_losses(drafter: Drafter, target: GPT, cond: Tensor, tokens: Tensor, noise: float = 0.0,
                   cond_mask: Tensor | None = None) -> dict[str, Tensor]:
    """Losses over the image-predicting drafter positions, plus agreement metrics (no grad through the target)."""
    T = target.args.cls_token_num
    with torch.no_grad():
        x, h, logits = target_states(target, cond, tokens, cond_mask)
    h_in = h[:, :-1]
    if noise > 0:
        h_in = h_in + (torch.rand_like(h_in) * 2 - 1) * noise
    pred = drafter(x[:, 1:], h_in, drafter_mask(cond_mask, x.shape[1] - 1))[:, T - 1 :]
    want_h, want_p = h[:, T:], logits[:, T:].float().softmax(-1)
    q_logits = drafter.head(pred)
    reg = F.smooth_l1_loss(pred.float(), want_h.float())
    ce = -(want_p * q_logits.log_softmax(-1)).sum(-1).mean()
    with torch.no_grad():
        top1 = (q_logits.argmax(-1) == logits[:, T:].argmax(-1)).float().mean()
        accept = 1 - 0.5 * (q_logits.softmax(-1) - want_p).abs().sum(-1).mean()  # exact SD acceptance at temperature 1, no CFG
    return {"reg": reg, "ce": ce, "top1": top1, "accept": accept}


def self_generate(target: GPT, labels: Tensor, sampling: dict, seed: int, batch: int = 64) -> Tensor:
    """Token sequences sampled from the target itself, one generator per sequence.

    Seeds live in their own namespace (derived from `seed`), so training sequences never coincide with the images
    an evaluation draws from (global seed, index).
    """
    from .generate import SamplingParams, generate, image_generator, image_seed

    try:
        params = SamplingParams(**sampling)
    except TypeError as e:
        raise UserError(f"drafter self_sampling has an unknown key: {e}") from None
    out = []
    device = target.output.weight.device
    for lo in tqdm(range(0, len(labels), batch), desc="self-generate", mininterval=2.0):
        cond = labels[lo : lo + batch].to(device)
        gens = [image_generator(image_seed(seed, -1), i) for i in range(lo, lo + len(cond))]
        out.append(generate(target, cond, params, gens)[0].cpu())
    return torch.cat(out)


def train_drafter(target: GPT, tokens: Tensor, cond: Tensor, params: DrafterParams,
                  cond_mask: Tensor | None = None) -> tuple[Drafter, dict]:
    """Train a drafter for `target` on image token sequences [n, N] with their conditions (labels or features)."""
    device = target.output.weight.device
    target.eval().requires_grad_(False)
    torch.manual_seed(params.seed)
    drafter = Drafter.from_target(target).train()
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
        c = cond[idx].to(device)
        if drop:  # null-condition rows at the target's own class-dropout rate (global RNG, seeded above)
            c = target.drop_cond(c, target.args.class_dropout_prob)
        m = None if cond_mask is None else cond_mask[idx].to(device)
        return c, tokens[idx][:, :-1].to(device), m

    history = []
    bar = tqdm(total=params.epochs * batches, desc="train-drafter", mininterval=2.0)
    for epoch in range(params.epochs):
        drafter.train()
        perm = train_idx[torch.randperm(len(train_idx), generator=shuffle)]
        total = 0.0
        for b in range(batches):
            c, t, m = batch_of(perm[b * params.batch_size : (b + 1) * params.batch_size], drop=True)
            losses = drafter_losses(drafter, target, c, t, params.hidden_noise, m)
            loss = losses["reg"] + params.ce_weight * losses["ce"]
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_value_(trainable, params.grad_clip)
            opt.step()
            total += loss.item()
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.4f}", refresh=False)
        row = {"epoch": epoch + 1, "train_loss": total / batches}
        row.update(evaluate(drafter, target, [batch_of(val_idx[lo : lo + params.batch_size], drop=False)
                                             for lo in range(0, len(val_idx), params.batch_size)], params.ce_weight))
        history.append(row)
        tqdm.write(" ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    bar.close()
    return drafter.eval(), {"history": history, "n_train": len(train_idx), "n_val": len(val_idx)}


@torch.no_grad()
def evaluate(drafter: Drafter, target: GPT, batches: list, ce_weight: float) -> dict:
    """Validation losses and agreement (no noise, no condition dropout), averaged over sequences."""
    drafter.eval()
    sums, count = {}, 0
    for c, t, m in batches:
        for k, v in drafter_losses(drafter, target, c, t, 0.0, m).items():
            sums[k] = sums.get(k, 0.0) + v.item() * len(c)
        count += len(c)
    out = {f"val_{k}": v / count for k, v in sums.items()}
    out["val_loss"] = out["val_reg"] + ce_weight * out["val_ce"]
    return out


# -- checkpoints --------------------------------------------------------------------------------------------------
def save_drafter(path: str | Path, drafter: Drafter, params: DrafterParams | None = None, **extra) -> None:
    obj = {
        "format": FORMAT, "drafter": drafter.trained_state(), "target_args": drafter.args.to_dict(),
        "params": dataclasses.asdict(params) if params else {}, **extra,
    }
    save_torch(obj, path)


def load_drafter(path: str | Path, target: GPT) -> Drafter:
    """A drafter for `target`, on its device and dtype; a drafter trained for another target is a UserError."""
    from .checkpoint import read_checkpoint

    obj = read_checkpoint(path)
    if obj.get("format") != FORMAT:
        raise UserError(f"{path} is not a drafter checkpoint written by `lantern train-drafter`")
    saved, have = obj["target_args"], target.args.to_dict()
    for key in ("dim", "vocab_size", "model_type", "cls_token_num", "image_tokens"):
        if saved.get(key) != have[key]:
            raise UserError(
                f"drafter {path} was trained for a target with {key}={saved.get(key)}, but this target has "
                f"{key}={have[key]}; train a drafter for this target (`lantern train-drafter`)"
            )
    drafter = Drafter(ModelArgs(**saved))
    missing = drafter.load_state_dict(obj["drafter"], strict=False).missing_keys
    if any(k.startswith(TRAINED) for k in missing):
        raise UserError(f"drafter {path} is incomplete: missing {', '.join(k for k in missing if k.startswith(TRAINED))}")
    w = target.output.weight
    drafter = drafter.to(device=w.device, dtype=w.dtype)
    drafter.copy_frozen(target)
    return drafter.eval().requires_grad_(False)


# -- CLI ----------------------------------------------------------------------------------------------------------
def params_from(mapping: dict) -> DrafterParams:
    names = {f.name for f in dataclasses.fields(DrafterParams)}
    unknown = sorted(set(mapping) - names)
    if unknown:
        raise UserError(f"unknown train-drafter --params key(s) {unknown}; valid keys: {sorted(names)}")
    return DrafterParams(**mapping)


def read_tokens(path: str | Path, target: GPT):
    """(tokens [n, N], cond, cond_mask or None) from a `lantern tokenize` file, checked against the target."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--tokens {path} does not exist; make it with `lantern tokenize`")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same one-line answer
        raise UserError(f"--tokens {path} is unreadable (truncated or not a torch file): {type(e).__name__}") from None
    if not isinstance(obj, dict) or "tokens" not in obj:
        raise UserError(f"--tokens {path} is not a `lantern tokenize` file (no tokens)")
    tokens, a = obj["tokens"].long(), target.args
    if tokens.ndim != 2 or tokens.shape[1] != a.image_tokens:
        raise UserError(f"--tokens {path} holds sequences of {tuple(tokens.shape[1:])} tokens; the target makes {a.image_tokens}")
    if tokens.max() >= a.vocab_size or tokens.min() < 0:
        raise UserError(f"--tokens {path} has codes outside the target's vocabulary of {a.vocab_size}")
    if a.model_type == "c2i":
        labels = obj["labels"].long()
        if labels.max() >= a.num_classes:
            raise UserError(f"--tokens {path} has class {int(labels.max())}; the target knows {a.num_classes} classes")
        return tokens, labels, None
    if "caption_features" not in obj:
        raise UserError(f"--tokens {path} has no caption_features; a text-to-image drafter needs them")
    return tokens, obj["caption_features"].float(), obj.get("caption_mask")


def main(argv: list[str]) -> None:
    from .checkpoint import load_gpt, parse_device

    ap = argparse.ArgumentParser(prog="lantern train-drafter", description=__doc__)
    ap.add_argument("--target", required=True, help="GPT checkpoint the drafter serves")
    ap.add_argument("--tokens", help="`lantern tokenize` file of real image codes (data real / both)")
    ap.add_argument("--out", required=True, help="drafter checkpoint")
    ap.add_argument("--params", default=None, help="DrafterParams (JSON/YAML or file)")
    ap.add_argument("--device", default="auto")
    a = ap.parse_args(argv)
    params = params_from(read_structured(a.params))
    if params.data != "self" and not a.tokens:
        raise UserError(f"drafter data {params.data} needs --tokens (a `lantern tokenize` file)")
    if params.threads > 0:
        torch.set_num_threads(params.threads)
    target = load_gpt(a.target, device=str(parse_device(a.device)))
    parts = []
    if params.data != "self":
        parts.append(read_tokens(a.tokens, target))
    if params.data != "real":
        if target.args.model_type != "c2i":
            raise UserError("self-generated drafter data is only available for class-conditional targets")
        labels = torch.arange(params.n_self) % target.args.num_classes
        parts.append((self_generate(target, labels, params.self_sampling, params.seed), labels, None))
    tokens = torch.cat([p[0] for p in parts])
    cond = torch.cat([p[1] for p in parts])
    cond_mask = parts[0][2] if len(parts) == 1 else None
    if params.max_sequences:
        tokens, cond = tokens[: params.max_sequences], cond[: params.max_sequences]
        cond_mask = None if cond_mask is None else cond_mask[: params.max_sequences]
    drafter, metrics = train_drafter(target, tokens, cond, params, cond_mask)
    save_drafter(a.out, drafter, params, metrics=metrics, target=str(a.target), tokens=str(a.tokens))
    last = metrics["history"][-1]
    print(f"drafter -> {a.out}: val top-1 agreement {last['val_top1']:.3f}, val acceptance {last['val_accept']:.3f}")
