"""Does the drafter know when its draft will pass? Its own probability q(x) of a first draft x against the exact
acceptance probability min(1, p(x) / q(x)), teacher-forced over the target's own samples.

    python benchmarks/draft_confidence.py [--world models/toy/default] [--images 64] [--cfg 2.0] [--threads 1]

The target draws --images samples (CFG --cfg, sampling, as the drafter trainer's self_generate with seed 123,
labels cycling over the classes); at every image position the drafter then predicts from the true prefix and the
target's true hidden states, as after a catch-up, so every draft here is a chain's first. Both distributions are the ones decoding verifies and
draws from (rounds.batch_probs: CFG-mixed and filtered). Each position's draft is drawn from q with a fixed
generator. Printed: the correlation of q(x) with the acceptance probability, their mean by bins of q(x), and the
expected acceptance sum min(p, q). A chain that stopped drafting on an unsure draft would need this correlation.
"""

import argparse
import dataclasses
from pathlib import Path

import torch

from lantern.engine.decoding.rounds import batch_probs
from lantern.worlds.llamagen.upstream import load_gpt
from lantern.engine.models.drafter import load_drafter, target_states
from lantern.engine.decoding.sampling import SamplingParams, draw
from lantern.pipeline.train_drafter import self_generate

BINS = (0.0, 0.02, 0.05, 0.1, 0.2, 1.0)


def own_samples(target, n: int, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """(labels [n], tokens [n, N]): the target's own samples as the drafter trainer draws them (seed 123), labels
    cycling over the classes."""
    labels = torch.arange(n) % target.args.num_classes
    return labels, self_generate(target, labels, dataclasses.asdict(params), seed=123)


def first_draft_confidence(target, drafter, labels: torch.Tensor, tokens: torch.Tensor, params: SamplingParams
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q(x), min(1, p(x) / q(x)), sum min(p, q)), each [n * (N - 1)]: a first draft x ~ q at every image position
    but the first (the drafter predicts from token 1 on), teacher-forced on `tokens` [n, N] of classes `labels`."""
    n, T, N = len(labels), target.args.cls_token_num, target.args.image_tokens

    def logits(cond):  # target and drafter logits for image tokens 0..N-1 (the drafter's: from 1 on)
        x, h, lt = target_states(target, cond, tokens[:, :-1])
        pred = drafter(drafter.inputs(x[:, :T], tokens[:, :-1]), h[:, :-1])[:, T - 1:]
        return lt[:, T - 1:].float(), drafter.head(pred)

    (pc, qc), (pu, qu) = logits(labels), logits(target.null_cond(n))
    index = torch.arange(N)[None].expand(n, -1)
    p = batch_probs(torch.cat([pc, pu]), params, index)[:, 1:]  # [n, N - 1, V]: tokens 1..N-1, as the drafter's
    q = batch_probs(torch.cat([qc, qu]), params, index[:, 1:])
    u = torch.rand(q.shape[:2], generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x = draw(q, u)
    qx, px = q.gather(-1, x[..., None])[..., 0], p.gather(-1, x[..., None])[..., 0]
    return qx.flatten(), (px / qx).clamp(max=1).flatten(), torch.minimum(p, q).sum(-1).flatten()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", default="models/toy/default", help="folder with target.pt and drafter.pt")
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--cfg", type=float, default=2.0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    a = ap.parse_args()
    if a.images < 2:
        ap.error(f"--images must be >= 2, got {a.images}")
    if a.threads < 0:
        ap.error(f"--threads must be >= 0 (0: torch's default), got {a.threads}")
    if a.threads:
        torch.set_num_threads(a.threads)
    world = Path(a.world)
    for name in ("target.pt", "drafter.pt"):
        if not (world / name).is_file():
            ap.error(f"--world {a.world} has no {name}: point it at a folder with the target and its drafter")
    target = load_gpt(world / "target.pt", dtype="fp32", device="cpu")
    drafter = load_drafter(world / "drafter.pt", target).eval()
    with torch.inference_mode():
        params = SamplingParams(cfg_scale=a.cfg)
        qx, accept, overlap = first_draft_confidence(target, drafter, *own_samples(target, a.images, params), params)
    corr = torch.corrcoef(torch.stack([qx, accept]).double())[0, 1].item()
    print(f"{qx.numel()} first drafts ({a.images} images, CFG {a.cfg}): mean acceptance {accept.mean():.3f}, "
          f"expected sum min(p, q) {overlap.mean():.3f}; corr(q(x), acceptance) {corr:.3f}")
    for lo, hi in zip(BINS, BINS[1:]):
        m = (qx >= lo) & (qx < hi)
        print(f"  q(x) in [{lo:.2f}, {hi:.2f}): {m.float().mean():.3f} of drafts, mean acceptance "
              f"{accept[m].mean() if m.any() else float('nan'):.3f}")


if __name__ == "__main__":
    main()
