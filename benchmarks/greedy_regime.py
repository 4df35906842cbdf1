"""Why greedy decoding accepts fewer drafts than sampling in the toy world (issue 55): the target's and the drafter's
next-token distributions along GREEDY trajectories against the same along SAMPLED ones.

    python benchmarks/greedy_regime.py [--world models/toy/default] [--images 48] [--cfgs 1 2 4] [--seed 0]
        [--threads 1] [--out greedy_regime.csv] [--grid greedy_regime.png]

For every CFG scale in --cfgs and both modes, plain AR decodes --images images (labels cycling over the classes,
image i from the generator of (--seed, i) as the sweep's vanilla point; greedy: argmax over the CFG-mixed logits,
which ignores the seed); the other sampling parameters are config/config.yaml's. The target and the drafter then
read each trajectory teacher-forced (the drafter from the true prefix and the target's true states, as after a
catch-up: every draft here is a chain's first), and at every image position from 1 on (the drafter's first
prediction) the script records:

- top1, margin: the target's top-1 probability and top-1 minus top-2 (the distribution greedy verification reads);
  ties: the share of positions with margin < 0.01;
- agree: the drafter's argmax is the target's argmax (greedy verification accepts a first draft iff it is);
  second: the drafter's argmax is the target's second code; q_top: the drafter's probability of the target's
  argmax; overlap: sum min(p, q), what sampling verification accepts of a first draft on average;
- lantern_accept: what LANTERN's rule at the sweep's default point (delta 0.1, k 3) accepts of a first draft in the
  mode's own verification: greedy, whether it accepts the drafter's argmax; sampling, the expected acceptance of a
  draft drawn from q;
- on_argmax: the trajectory's token is the target's argmax (1 along greedy paths: a check of the teacher forcing).

Per trajectory set: distinct token grids, class accuracy (the world's classifier on the decoded images, as the
metrics read them), the token grids' code statistics (distinct codes per image, share of the 3 most frequent
codes, entropy of the code histogram in nats: do greedy images collapse into a few codes?) and tau of the exact
chain at gamma 2 and of LANTERN at delta 0.1, k 3 (gamma 4; the sweep's points) decoded on the same images, labels,
seeds and mode. Printed: a summary per (mode, CFG), the default CFG's positions by grid row, and its agreement by margin bin (is low agreement a matter of
near-ties, or of trajectories the drafter never saw?). --out writes every group as a CSV row; --grid a PNG of
each class's first image per (CFG, mode). models/toy/clean (no drafter, no classifier) gives the target's columns.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
MARGIN_BINS = (0.0, 0.01, 0.03, 0.1, 1.0)
TIE = MARGIN_BINS[1]  # top-1 and top-2 within a point of probability: a coin flip for a drafter
CHAIN = {"name": "exact", "drafting": "chain", "gamma": 2}  # the default sweep's exact chain
LANTERN = {"name": "lantern", "drafting": "chain", "gamma": 4, "delta": 0.1, "k": 3}  # and its LANTERN default
NEIGHBOUR_METRIC = "l2"  # config.yaml's neighbours.metric
POSITION_COLUMNS = ("top1", "margin", "ties", "agree", "second", "q_top", "overlap", "lantern_accept", "on_argmax")
DRAFTER_COLUMNS = ("agree", "second", "q_top", "overlap", "lantern_accept")
COLUMNS = ("mode", "cfg_scale", "group", "positions", *POSITION_COLUMNS, "images", "distinct_images",
           "class_accuracy", "class_accuracy_se", "classes_shown", "codes_per_image", "top3_share", "code_entropy",
           "tau_exact_chain", "tau_lantern")


def config_sampling(path: Path = ROOT / "config" / "config.yaml") -> dict:
    """The default run's sampling section (cfg_scale, temperature, top_k, top_p, cfg_interval)."""
    import yaml

    return dict(yaml.safe_load(path.read_text())["sampling"])


def params_for(sampling: dict, mode: str, cfg: float):
    from lantern.engine.decoding.sampling import SamplingParams
    from lantern.params import params_from
    from lantern.pipeline.sample import GREEDY

    return params_from({**sampling, "cfg_scale": cfg, **(GREEDY if mode == "greedy" else {})}, SamplingParams,
                       "sampling.")


def lantern_rule(codebook: torch.Tensor):
    """(AcceptRule, neighbour table) of the default run's LANTERN point on this codebook."""
    from lantern.engine.methods import normalize, rule
    from lantern.engine.rules.neighbours import nearest_neighbours

    accept = rule(normalize(dict(LANTERN)))
    return accept, nearest_neighbours(codebook, accept.table_width, NEIGHBOUR_METRIC)


def trajectories(target, drafter, labels: torch.Tensor, params, seed: int, batch: int, table=None):
    """(plain AR tokens [n, N], exact-chain tokens [n, N], {method: tau}): plain AR, the exact chain and (given the
    neighbour table) LANTERN on the same images, image i with the generator of (seed, i), in batches of `batch`
    aligned to the image index (in float32 a batch can change a rare sampled image against another batch size:
    docs/decoders.md#batches). Without a drafter: (AR tokens, None, {})."""
    from lantern.engine.decoding.generate import generate
    from lantern.engine.methods import drafting, normalize, rule
    from lantern.engine.decoding.sampling import image_generator
    from lantern.engine.decoding.speculative import decode

    specs = {"exact_chain": CHAIN, **({"lantern": LANTERN} if table is not None else {})}
    specs = {name: normalize(dict(spec)) for name, spec in specs.items()} if drafter is not None else {}
    ar, chain, tokens, forwards = [], [], dict.fromkeys(specs, 0), dict.fromkeys(specs, 0)
    for lo in range(0, len(labels), batch):
        idx = range(lo, min(lo + batch, len(labels)))
        cond = labels[lo : idx.stop]
        ar.append(generate(target, cond, params, [image_generator(seed, i) for i in idx])[0])
        for name, spec in specs.items():
            out, stats = decode(target, drafter, cond, params, rule(spec), drafting(spec),
                                [image_generator(seed, i) for i in idx], table)
            if name == "exact_chain":
                chain.append(out)
            tokens[name] += sum(s.n_tokens for s in stats)
            forwards[name] += sum(s.target_forwards for s in stats)
    # tau as the tables aggregate it: all tokens over all target forwards
    return torch.cat(ar), torch.cat(chain) if chain else None, {k: tokens[k] / forwards[k] for k in specs}


@torch.inference_mode()
def position_stats(target, drafter, labels: torch.Tensor, tokens: torch.Tensor, params, relaxed=None
                   ) -> dict[str, torch.Tensor]:
    """Per image position 1..N-1 of trajectories `tokens` [n, N]: POSITION_COLUMNS, each [n, N - 1] (float); the
    drafter's columns NaN without a drafter, lantern_accept NaN without `relaxed` ((AcceptRule, table): greedy, 1 if
    the rule accepts the drafter's argmax; sampling, sum over x of min(q(x), p(x) + the neighbour mass x may claim),
    the expected acceptance of a draft x ~ q)."""
    from lantern.engine.rules.acceptance import greedy_accept, relaxed_mass
    from lantern.engine.decoding.rounds import batch_probs
    from lantern.engine.models.drafter import target_states

    n, T, N = len(labels), target.args.cls_token_num, target.args.image_tokens

    def logits(cond):  # as benchmarks/draft_confidence.py: target logits and the drafter's, teacher-forced
        x, h, lt = target_states(target, cond, tokens[:, :-1])
        if drafter is None:  # a stand-in q; its columns are blanked below
            return lt[:, T - 1 :].float(), lt[:, T:].float()
        pred = drafter(drafter.inputs(x[:, :T], tokens[:, :-1]), h[:, :-1])[:, T - 1 :]
        return lt[:, T - 1 :].float(), drafter.head(pred)

    (pc, qc), (pu, qu) = logits(labels), logits(target.null_cond(n))
    index = torch.arange(N)[None].expand(n, -1)
    if params.use_cfg:
        p = batch_probs(torch.cat([pc, pu]), params, index)[:, 1:]  # [n, N - 1, V]: tokens 1..N-1
        q = batch_probs(torch.cat([qc, qu]), params, index[:, 1:])
    else:  # without CFG the unconditional rows are not part of the forward layout
        p, q = batch_probs(pc, params, index)[:, 1:], batch_probs(qc, params, index[:, 1:])
    top = p.topk(2, dim=-1)
    first, second = top.indices[..., 0], top.indices[..., 1]
    margin = top.values[..., 0] - top.values[..., 1]
    draft = q.argmax(-1)
    out = {"top1": top.values[..., 0], "margin": margin, "ties": (margin < TIE).float(),
           "agree": (draft == first).float(), "second": (draft == second).float(),
           "q_top": q.gather(-1, first[..., None])[..., 0], "overlap": torch.minimum(p, q).sum(-1),
           "on_argmax": (tokens[:, 1:] == first).float(), "lantern_accept": torch.full_like(margin, math.nan)}
    if relaxed is not None:
        accept, table = relaxed
        if params.greedy:
            out["lantern_accept"] = greedy_accept(p, draft, table, accept).float()
        else:  # every code's claimable mass at once: p broadcast over the codes (a view, no copy)
            V = p.shape[-1]
            codes = torch.arange(V).expand(*p.shape[:-1], V)
            c, _ = relaxed_mass(p.unsqueeze(-2).expand(*p.shape[:-1], V, V), codes, table, accept)
            out["lantern_accept"] = torch.minimum(q, p + c).sum(-1)
    if drafter is None:
        for k in DRAFTER_COLUMNS:
            out[k] = torch.full_like(out[k], math.nan)
    return out


def code_stats(tokens: torch.Tensor, vocab: int) -> dict[str, float]:
    """Means over images of: distinct codes, share of the 3 most frequent codes, entropy (nats) of the codes."""
    counts = torch.zeros(len(tokens), vocab).scatter_add_(1, tokens, torch.ones_like(tokens, dtype=torch.float))
    freq = counts / tokens.shape[1]
    entropy = -(freq * freq.clamp_min(1e-30).log()).sum(1)
    return {"codes_per_image": (counts > 0).sum(1).float().mean().item(),
            "top3_share": freq.topk(3, dim=1).values.sum(1).mean().item(), "code_entropy": entropy.mean().item()}


def group_row(stats: dict[str, torch.Tensor], mask: torch.Tensor) -> dict:
    row = {"positions": int(mask.sum())}
    for k in POSITION_COLUMNS:
        row[k] = stats[k][mask].mean().item() if mask.any() else math.nan
    return row


def groups(stats: dict[str, torch.Tensor], grid: int) -> list[tuple[str, torch.Tensor]]:
    """(name, mask [n, N - 1]): all positions, each row of the grid, each margin bin."""
    n, S = stats["top1"].shape
    row_of = (torch.arange(1, S + 1) // grid)[None].expand(n, -1)  # position j + 1's row of the token grid
    out = [("all", torch.ones(n, S, dtype=torch.bool))]
    out += [(f"row {r}", row_of == r) for r in range(grid)]
    m = stats["margin"]
    for lo, hi in zip(MARGIN_BINS, MARGIN_BINS[1:]):
        out.append((f"margin [{lo:g}, {hi:g})", (m >= lo) & ((m < hi) | (hi == MARGIN_BINS[-1]))))
    return out


def classes_shown(hits: torch.Tensor, labels: torch.Tensor, num_classes: int) -> str:
    """The classes whose images show them at least half the time, by name (greedy: one image per class)."""
    from lantern.hparams import CLASS_NAMES

    return " ".join(CLASS_NAMES[c] for c in range(num_classes) if hits[labels == c].float().mean() >= 0.5)


def measure(world: Path, images: int, cfgs: list[float], seed: int, batch: int, sampling: dict,
            grid: list | None = None) -> list[dict]:
    """Every (mode, CFG, group) row of COLUMNS; `grid` (a list) gets each (mode, CFG)'s first image of every
    class, decoded (uint8 [classes, 3, H, W])."""
    from lantern.worlds.llamagen.upstream import load_gpt
    from lantern.engine.models.drafter import load_drafter
    from lantern.engine.rules.neighbours import read_codebook
    from lantern.worlds.llamagen.upstream import load_vq
    from lantern.metrics.classifier import accuracy_se, load_classifier, predict
    from lantern.metrics.proximity import decode

    target = load_gpt(world / "target.pt", dtype="fp32", device="cpu")
    # the clean control world ships a target and a VQ only: its rows keep the target's columns
    drafter = load_drafter(world / "drafter.pt", target).eval() if (world / "drafter.pt").is_file() else None
    net = load_classifier(world / "classifier.pt") if (world / "classifier.pt").is_file() else None
    vq = load_vq(world / "vq.pt")
    relaxed = lantern_rule(read_codebook(world / "vq.pt")) if drafter is not None else None
    labels = torch.arange(images) % target.args.num_classes
    rows = []
    for cfg in cfgs:
        for mode in ("greedy", "sampling"):
            params = params_for(sampling, mode, cfg)
            with torch.inference_mode():
                tokens, chain, tau = trajectories(target, drafter, labels, params, seed, batch,
                                                  relaxed[1] if relaxed else None)
                if mode == "greedy" and chain is not None and not torch.equal(tokens, chain):
                    raise SystemExit("greedy exact chain left greedy AR's tokens: the engine is broken")
                pixels = decode(vq, tokens, batch, "cpu")
                hits = predict(net, pixels, batch).eq(labels) if net is not None else None
            if grid is not None:
                grid.append(pixels[[int((labels == c).nonzero()[0]) for c in labels.unique()]])
            acc = (dict(zip(("class_accuracy", "class_accuracy_se"), accuracy_se(hits)),
                        classes_shown=classes_shown(hits, labels, target.args.num_classes)) if hits is not None
                   else {"class_accuracy": math.nan, "class_accuracy_se": math.nan, "classes_shown": ""})
            stats = position_stats(target, drafter, labels, tokens, params, relaxed)
            whole = {"images": images, "distinct_images": len({tuple(t) for t in tokens.tolist()}), **acc,
                     **code_stats(tokens, target.args.vocab_size),
                     "tau_exact_chain": tau.get("exact_chain", math.nan), "tau_lantern": tau.get("lantern", math.nan)}
            for name, mask in groups(stats, target.args.grid):
                rows.append({"mode": mode, "cfg_scale": cfg, "group": name, **group_row(stats, mask),
                             **(whole if name == "all" else {k: "" if k == "classes_shown" else math.nan
                                                             for k in whole})})
    return rows


def report(rows: list[dict], cfg: float) -> str:
    import pandas as pd

    df = pd.DataFrame(rows, columns=COLUMNS)
    lines = []
    summary = df[df.group == "all"].copy()
    summary = summary.astype({"images": int, "distinct_images": int})
    show = ["mode", "cfg_scale", "images", "distinct_images", "top1", "margin", "ties", "agree", "second", "q_top",
            "overlap", "lantern_accept", "tau_exact_chain", "tau_lantern", "class_accuracy", "codes_per_image",
            "top3_share", "code_entropy"]
    lines += ["per mode and CFG scale (positions 1-63 of every image; agree = greedy first-draft acceptance, "
              "overlap = sampling's; lantern_accept = LANTERN's (delta 0.1, k 3), in the mode's own rule):",
              summary[show].to_string(index=False, float_format=lambda v: f"{v:.3f}")]
    scored = summary[summary.class_accuracy.notna()]  # a world without a classifier has no class column
    lines += [f"{r.mode} CFG {r.cfg_scale:g}: images show {r.classes_shown or 'no class'}" for r in scored.itertuples()]
    at = df[df.cfg_scale == cfg]
    shown = ("positions", "top1", "margin", "agree", "second", "overlap", "lantern_accept")
    for prefix, title in (("row", f"by row of the token grid, CFG {cfg:g}"),
                          ("margin", f"by the target's top-1 - top-2 margin, CFG {cfg:g}")):
        part = at[at.group.str.startswith(prefix)]
        wide = part.pivot(index="group", columns="mode", values=list(shown))
        wide = wide.reindex(part.group.drop_duplicates())  # in row / bin order
        wide = wide[[(k, mode) for mode in ("greedy", "sampling") for k in shown]]
        wide.columns = [f"{mode[0]}:{k.removesuffix('_accept')}" for k, mode in wide.columns]
        wide.index.name = None
        wide = wide.astype({c: int for c in wide.columns if c.endswith("positions")})
        lines += ["", f"{title} (g: greedy paths, s: sampled paths):",
                  wide.to_string(float_format=lambda v: f"{v:.3f}")]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", default=str(ROOT / "models/toy/default"),
                    help="folder with target.pt and vq.pt, and drafter.pt and classifier.pt for their columns "
                         "(models/toy/clean has neither)")
    ap.add_argument("--images", type=int, default=48, help="images per mode and CFG scale (labels cycle)")
    ap.add_argument("--cfgs", type=float, nargs="+", help="CFG scales (default: 1, the config's, 4)")
    ap.add_argument("--seed", type=int, default=0, help="global seed: image i draws from (seed, i)")
    ap.add_argument("--batch", type=int, default=16,
                    help="images decoded together (greedy images never change with it; in float32 a sampled one "
                         "rarely does, as in the sweep: docs/decoders.md#batches)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    ap.add_argument("--out", help="CSV of every (mode, cfg_scale, group) row")
    ap.add_argument("--grid", help="PNG: a row per (CFG, mode), greedy first, of each class's first image")
    a = ap.parse_args(argv)
    if a.images < 2 or a.batch < 1:
        ap.error(f"--images must be >= 2 and --batch >= 1, got {a.images} and {a.batch}")
    if a.threads < 0:
        ap.error(f"--threads must be >= 0 (0: torch's default), got {a.threads}")
    world = Path(a.world)
    missing = [n for n in ("target.pt", "vq.pt") if not (world / n).is_file()]
    if missing:
        ap.error(f"--world {a.world} lacks {', '.join(missing)}")
    if a.threads:
        torch.set_num_threads(a.threads)
    sampling = config_sampling()
    default_cfg = float(sampling["cfg_scale"])
    cfgs = a.cfgs or sorted({1.0, default_cfg, 4.0})
    if any(c < 1 for c in cfgs):
        ap.error(f"--cfgs must be >= 1, got {cfgs}")
    grid = [] if a.grid else None
    rows = measure(world, a.images, cfgs, a.seed, a.batch, sampling, grid)
    print(report(rows, default_cfg if default_cfg in cfgs else cfgs[0]))
    if a.out:
        import pandas as pd

        from lantern.io import atomic_path

        with atomic_path(a.out) as tmp:
            pd.DataFrame(rows, columns=COLUMNS).to_csv(tmp, index=False)
    if a.grid:
        from torchvision.utils import make_grid, save_image

        from lantern.io import atomic_path

        with atomic_path(a.grid) as tmp:
            save_image(make_grid(torch.cat(grid).float() / 255, nrow=len(grid[0]), padding=1), tmp, format="png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
