"""`lantern ambiguity`: how flat are the target's next-token distributions? (token selection ambiguity)

For each CFG scale, the distribution p the sampler draws from (CFG-mixed, then temperature / top-k / top-p) is
measured at every step of (a) the target's own samples and (b) held-out images, teacher-forced. Own samples are
made with the shared `generate`; their distributions are then recomputed in one teacher-forced pass, which equals
the cached decoding path step by step. Writes a summary table (one row per source x CFG scale) and every step's
top-1 probability and entropy, for distribution plots. With --stats-out it also records the world's model
quality, measured here on the held-out split: VQ PSNR and codebook usage, the target's validation loss, and whether
the target knows the classes at all (Bayes' rule over its own likelihoods, `target_class_stats`). With
--classifier, every row also says whether the images show their class: the classifier's accuracy on the decoded
samples per CFG scale (does guidance make the class visible?) and on the held-out reconstructions (the VQ's ceiling).
"""

from __future__ import annotations

import argparse
import math

import pandas as pd
import torch
import torch.nn.functional as F

from lantern.worlds.llamagen.upstream import load_gpt
from lantern.params import params_from
from lantern.errors import UserError
from lantern.hparams import AmbiguityParams
from lantern.engine.decoding.generate import generate
from lantern.engine.decoding.sampling import SamplingParams, image_generator, logits_to_probs, mix_cfg
from lantern.io import atomic_path, read_structured, write_json
from lantern.worlds.toy.train_gpt import load_tokens, validation_loss
from lantern.worlds.toy.train_vq import set_threads

LOW_TOP1 = 0.2  # the paper's notion of a flat step: no token above 20 %


@torch.no_grad()
def step_stats(model, labels: torch.Tensor, tokens: torch.Tensor, sp: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced top-1 probability and entropy (nats) of the sampling distribution at every step: [B, N] each."""
    cond = labels
    if sp.use_cfg:
        cond = torch.cat([labels, model.null_cond(len(labels), labels.device)])
        tokens = torch.cat([tokens, tokens])
    logits, _ = model(cond, tokens[:, :-1])
    probs = logits_to_probs(mix_cfg(logits, sp, 0), sp)  # no CFG interval here: token index is irrelevant
    entropy = -(probs * probs.clamp_min(1e-30).log()).sum(-1)
    return probs.max(-1).values, entropy


def summarise(source: str, cfg: float, top1: torch.Tensor, entropy: torch.Tensor) -> dict:
    return {"source": source, "cfg_scale": cfg, "images": top1.shape[0], "steps": top1.numel(),
            "mean_top1": top1.mean().item(), "median_top1": top1.median().item(),
            "frac_top1_below_0.2": (top1 < LOW_TOP1).float().mean().item(),
            "mean_entropy": entropy.mean().item()}


def long_rows(source: str, cfg: float, top1: torch.Tensor, entropy: torch.Tensor, labels: torch.Tensor) -> pd.DataFrame:
    B, N = top1.shape
    return pd.DataFrame({"source": source, "cfg_scale": cfg, "image": torch.arange(B).repeat_interleave(N).numpy(),
                         "label": labels.repeat_interleave(N).numpy(), "position": torch.arange(N).repeat(B).numpy(),
                         "top1": top1.flatten().numpy(), "entropy": entropy.flatten().numpy()})


def measure(model, params: AmbiguityParams, heldout: dict) -> tuple[pd.DataFrame, pd.DataFrame, dict, dict]:
    """Summary rows, per-step rows, the generated tokens per CFG scale and the (tokens, labels) of every summary
    row, keyed by (source, CFG scale)."""
    summary, steps, samples, measured = [], [], {}, {}
    num_classes = model.args.num_classes
    for cfg in params.cfg_scales:
        sp = params.sampling(cfg)
        sources = []
        if params.n_samples:
            toks, labs = [], []
            for lo in range(0, params.n_samples, params.batch):
                idx = range(lo, min(params.n_samples, lo + params.batch))
                labels = torch.tensor([i % num_classes for i in idx])
                t, _ = generate(model, labels, sp, [image_generator(params.seed, i) for i in idx])
                toks.append(t)
                labs.append(labels)
            samples[cfg] = (torch.cat(toks), torch.cat(labs))
            sources.append(("samples", *samples[cfg]))
        if params.n_heldout:
            sources.append(("heldout", heldout["tokens"][: params.n_heldout], heldout["labels"][: params.n_heldout]))
        for source, tokens, labels in sources:
            parts = [step_stats(model, labels[lo : lo + params.batch], tokens[lo : lo + params.batch], sp)
                     for lo in range(0, len(tokens), params.batch)]
            top1, entropy = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
            summary.append(summarise(source, cfg, top1, entropy))
            measured[(source, cfg)] = (tokens, labels)
            steps.append(long_rows(source, cfg, top1, entropy, labels))
            print(f"{source:8s} cfg {cfg:g}: mean top-1 {summary[-1]['mean_top1']:.3f}, "
                  f"{summary[-1]['frac_top1_below_0.2']:.0%} of steps below {LOW_TOP1}, "
                  f"entropy {summary[-1]['mean_entropy']:.2f} nats")
    return pd.DataFrame(summary), pd.concat(steps, ignore_index=True), samples, measured


@torch.no_grad()
def class_rows(summary: pd.DataFrame, sources: dict, classifier_path: str, vq_path: str, batch: int) -> pd.DataFrame:
    """The summary with class_accuracy (+ SE) of each (source, CFG scale) row's decoded images."""
    from lantern.worlds.llamagen.upstream import load_vq
    from lantern.metrics.classifier import class_accuracy, load_classifier
    from lantern.metrics.proximity import decode

    net, vq = load_classifier(classifier_path, key="--classifier"), load_vq(vq_path)
    rows = []
    for row in summary.to_dict("records"):
        tokens, labels = sources[(row["source"], row["cfg_scale"])]
        acc = class_accuracy(net, decode(vq, tokens, batch, "cpu"), labels, batch)
        rows.append({**row, "class_accuracy": acc["class_accuracy"], "class_accuracy_se": acc["class_accuracy_se"]})
        print(f"{row['source']:8s} cfg {row['cfg_scale']:g}: class accuracy {acc['class_accuracy']:.3f} "
              f"+- {acc['class_accuracy_se']:.3f} ({len(labels)} images)")
    return pd.DataFrame(rows)


@torch.no_grad()
def class_log_likelihoods(model, tokens: torch.Tensor, batch: int) -> torch.Tensor:
    """log p(image | c) in nats, teacher-forced, for every class c and (last column, if the model has one) the null
    class: [n, classes (+ 1)]."""
    device = model.output.weight.device
    conds = model.args.num_classes + int(model.args.null_class)
    out = torch.empty(len(tokens), conds)
    for c in range(conds):
        for lo in range(0, len(tokens), batch):
            t = tokens[lo : lo + batch].to(device)
            logits, _ = model(torch.full((len(t),), c, device=device), t[:, :-1])
            out[lo : lo + len(t), c] = -F.cross_entropy(logits.transpose(1, 2).float(), t, reduction="none").sum(1).cpu()
    return out


def target_class_stats(model, tokens: torch.Tensor, labels: torch.Tensor, batch: int) -> dict:
    """Does the target know the classes, apart from sampling? On held-out images: the share whose own class gives
    them the highest likelihood (the target as a Bayes classifier, uniform prior; chance = 1 / classes), and the
    nats per image their class adds over the null class, the unconditional stream that CFG extrapolates from."""
    ll = class_log_likelihoods(model, tokens, batch)
    classes = model.args.num_classes
    own = ll[torch.arange(len(labels)), labels]
    stats = {"target_class_probe_images": len(labels),
             "target_class_accuracy": (ll[:, :classes].argmax(1) == labels).float().mean().item()}
    if model.args.null_class:
        stats["target_class_nats_over_null"] = (own - ll[:, classes]).mean().item()
    return stats


@torch.no_grad()
def world_stats(model, heldout: dict, vq_path: str | None, val_images: str | None, batch: int,
                n_class_probe: int = 0) -> dict:
    """Model quality on the held-out split: the target's validation loss (teacher-forced, no CFG), what it knows of
    the classes on the first n_class_probe images, and, given the held-out images, the VQ's PSNR and codebook usage."""
    stats = {"target_params": sum(p.numel() for p in model.parameters()), "heldout_images": len(heldout["tokens"]),
             "target_val_loss": validation_loss(model, heldout["tokens"], heldout["labels"], batch)}
    if n_class_probe:
        n = min(n_class_probe, len(heldout["tokens"]))
        stats.update(target_class_stats(model, heldout["tokens"][:n], heldout["labels"][:n], batch))
    if val_images:
        from lantern.worlds.toy import train_vq
        from lantern.worlds.toy.data import load_data
        from lantern.worlds.llamagen.upstream import load_vq

        vq = train_vq.evaluate(load_vq(vq_path), load_data(val_images, "--val-images")["images"], batch)
        stats.update({f"vq_{k}": v for k, v in vq.items()})
    return stats


def save_grid(vq_path: str, samples: dict, num_classes: int, path: str, per_class: int = 8) -> None:
    """One PNG per run: a row per class, blocks side by side (held-out VQ reconstructions, then the target's
    samples per CFG scale), to check samples look like their class as far as the VQ allows."""
    from torchvision.utils import make_grid, save_image

    from lantern.worlds.llamagen.upstream import load_vq

    vq = load_vq(vq_path)
    blocks = []
    side = vq.args.downsample * math.isqrt(next(iter(samples.values()))[0].shape[1])
    for tokens, labels in samples.values():
        rows = []
        for c in range(num_classes):
            picked = tokens[labels == c][:per_class]
            with torch.no_grad():
                img = (vq.decode_code(picked).clamp(-1, 1) + 1) / 2 if len(picked) else torch.zeros(0, 3, side, side)
            rows.append(torch.cat([img, torch.full((per_class - len(img), *img.shape[1:]), 0.5)]))
        blocks.append(make_grid(torch.cat(rows), nrow=per_class, padding=1, pad_value=1.0))
    with atomic_path(path) as tmp:
        save_image(make_grid(torch.stack(blocks), nrow=len(blocks), padding=4, pad_value=0.0), tmp, format="png")


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="lantern ambiguity", description="token selection ambiguity of a target")
    ap.add_argument("--target", required=True, help="GPT checkpoint (c2i)")
    ap.add_argument("--heldout", required=True, help="held-out tokens (`lantern tokenize` file)")
    ap.add_argument("--out", required=True, help="summary CSV: source, cfg_scale, mean_top1, frac_top1_below_0.2, ...")
    ap.add_argument("--steps-out", required=True, help="per-step CSV: source, cfg_scale, image, label, position, top1, entropy")
    ap.add_argument("--vq", help="VQ checkpoint, to decode the samples for --grid and --classifier")
    ap.add_argument("--grid", help="PNG of the samples (a row per class, one block per CFG scale); needs --vq")
    ap.add_argument("--stats-out", help="JSON of model quality on the held-out split: target validation loss, "
                    "and with --val-images and --vq the VQ's PSNR and codebook usage")
    ap.add_argument("--val-images", help="held-out images (`lantern make-data` file) for the VQ's PSNR; needs --vq")
    ap.add_argument("--classifier", help="`lantern train-classifier` checkpoint: class accuracy of every row's decoded "
                    "images (samples per CFG scale, held-out reconstructions); needs --vq")
    ap.add_argument("--params", default=None, help="AmbiguityParams as inline JSON/YAML or a file path")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    a = ap.parse_args(argv)
    params = params_from(read_structured(a.params), AmbiguityParams)
    if a.grid and not a.vq:
        raise UserError("--grid decodes the samples: give the world's --vq too")
    if a.val_images and not (a.vq and a.stats_out):
        raise UserError("--val-images measures the VQ for --stats-out: give --vq and --stats-out too")
    if a.classifier and not a.vq:
        raise UserError("--classifier reads decoded images: give the world's --vq too")
    if a.grid and not params.n_samples:
        raise UserError("--grid needs own samples: set n_samples > 0")
    heldout = load_tokens(a.heldout, "--heldout")
    model = load_gpt(a.target)
    if model.args.model_type != "c2i":
        raise UserError("lantern ambiguity measures class-conditional targets; this checkpoint is t2i")
    if heldout["tokens"].shape[1] != model.args.image_tokens:
        raise UserError(f"--heldout has {heldout['tokens'].shape[1]} tokens per image, the target "
                        f"{model.args.image_tokens}; tokenize with the target's VQ")
    set_threads(a.threads)
    if a.classifier:
        from lantern.metrics.classifier import load_classifier

        load_classifier(a.classifier, key="--classifier")  # a bad file fails before the sampling, not after
    summary, steps, samples, measured = measure(model, params, heldout)
    if a.classifier:
        summary = class_rows(summary, measured, a.classifier, a.vq, params.batch)
    with atomic_path(a.out) as tmp:
        summary.to_csv(tmp, index=False)
    with atomic_path(a.steps_out) as tmp:
        steps.to_csv(tmp, index=False)
    if a.grid:
        # decoded held-out tokens are VQ reconstructions: the most a target's samples can look like their class
        blocks = {"reconstructions": (heldout["tokens"], heldout["labels"]), **samples}
        save_grid(a.vq, blocks, model.args.num_classes, a.grid)
    print(summary.to_string(index=False))
    if a.stats_out:
        stats = world_stats(model, heldout, a.vq, a.val_images, params.batch, params.n_class_probe)
        write_json(a.stats_out, stats)
        vq = (f"VQ PSNR {stats['vq_psnr']:.2f} dB, codebook usage {stats['vq_codebook_usage']:.3f} "
              f"({stats['vq_codes_used']} codes); " if a.val_images else "")
        print(f"{vq}target {stats['target_params'] / 1e6:.2f}M params, validation loss "
              f"{stats['target_val_loss']:.4f} on {stats['heldout_images']} held-out images")
        if "target_class_accuracy" in stats:
            print(f"the target classifies {stats['target_class_accuracy']:.3f} of {stats['target_class_probe_images']}"
                  f" held-out images by its own likelihoods (chance {1 / model.args.num_classes:.3f})")
