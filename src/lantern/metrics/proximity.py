"""`lantern proximity`: are a code's nearest neighbours in the VQ latent space interchangeable? (LANTERN, Fig. 3)

LANTERN lets a drafted token borrow its latent neighbours' probability on the premise that swapping a token for a
near code barely changes the image. This stage tests the premise without any target model: in held-out token
grids a fraction f of the positions is replaced by the m-th nearest neighbour of the code there (m = 0: the code
itself, a null check; `random`: a uniformly random other code, the control), the grids are decoded by the VQ, and
the decodes are compared with the unmodified decodes, through the feature extractor of the run's FD: the Frechet
distance between the two feature sets, the mean per-image feature cosine, and pixel PSNR / mean absolute error;
with a classifier (`--classifier`, the toy world's class-accuracy CNN), also the fraction of decodes whose
predicted class stays that of the unmodified decode (`class_agreement`, ± its binomial SE): whether a swap keeps
what the image shows, not only its feature statistics.

Invariants:
- positions: one seeded draw ranks the positions of every grid; fraction f replaces the round(f * N) first. The
  positions are the same for every m and nested across fractions, so two curves differ only by m.
- random codes: one seeded draw per position, shared by every fraction, never the code already there.
- every variant is decoded in the same batches as the originals, so f = 0 or m = 0 give the original decodes bit
  for bit, and zero shift (the FD up to its float rounding).
- noise reference (`fd_noise_halves`): the FD between two random halves of the unmodified decodes, i.e. what an
  unpaired FD (a sweep point against its control) sees between two samples of one distribution at half this size.
  The paired FD of a variant carries no such sampling noise: it is 0 at f = 0.

Token grids: a `lantern tokenize` file (the toy world: its held-out split), or `lantern sample` stats.csv files,
whose `tokens` column holds every image's codes (the llamagen and Chameleon worlds: the vanilla sweep point's own
samples, which every run makes, while their real images may be given only as FID statistics).

The VQ: a LlamaGen-family checkpoint (--vq), decoded and rounded to uint8 as `lantern sample` writes its PNGs; or,
with --vqgan-yaml, Chameleon's VQGAN (vqgan.ckpt at --vq) through its reader, decoded as a Chameleon world writes its
PNGs (worlds/chameleon/world.pixels_of: uint8 by truncation, as the authors do).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor
from torch_fidelity.metric_fid import KEY_METRIC_FID, fid_features_to_statistics, fid_statistics_to_metric

from lantern.engine.models.checkpoint import parse_device
from lantern.engine.models.vqgan import VQGAN
from lantern.engine.rules.neighbours import load_neighbours, read_codebook
from lantern.worlds.chameleon.world import load_vqgan, pixels_of
from lantern.worlds.llamagen.upstream import load_vq
from lantern.errors import UserError
from lantern.io import atomic_path, load_torch, read_csv, read_structured
from lantern.metrics.classifier import accuracy_se, load_classifier, predict
from lantern.metrics.fidelity import FidelityParams, fid_feature_extractor
from lantern.metrics.images import ImageSet
from lantern.params import params_from
from lantern.worlds.toy.train_gpt import load_tokens

RANDOM = "random"


@dataclass
class ProximityParams:
    fractions: list[float] = field(default_factory=lambda: [0.0, 0.1, 0.25, 0.5, 1.0])
    ranks: list = field(default_factory=lambda: [1, 5, 50, RANDOM])  # m-th nearest neighbour, or "random"
    n_images: int = 500  # the first n token grids (all of them when fewer)
    seed: int = 0
    batch: int = 64  # grids per VQ decode and feature batch
    strip_images: int = 8  # images in the PNG strip
    strip_fraction: float = 0.25  # fraction replaced in the strip
    decide_fraction: float = 0.25  # fraction at which interchangeable_m is read (LANTERN's k is chosen from it)

    def __post_init__(self):
        if not self.fractions or any(isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 <= f <= 1
                                     for f in self.fractions):
            raise UserError(f"proximity.fractions = {self.fractions!r} must be a non-empty list of numbers in [0, 1]")
        bad = [m for m in self.ranks if m != RANDOM and (isinstance(m, bool) or not isinstance(m, int) or m < 0)]
        if not self.ranks or bad or len(set(map(str, self.ranks))) != len(self.ranks):
            raise UserError(f"proximity.ranks = {self.ranks!r} must be a list of distinct integers >= 0 (m-th "
                            f"nearest neighbour, 0 = the code itself) or '{RANDOM}'")
        if self.n_images < 4 or self.batch < 1 or self.strip_images < 1:
            raise UserError("proximity.n_images must be >= 4 (the noise reference splits it in two halves), "
                            "batch and strip_images >= 1")
        if not 0 <= self.strip_fraction <= 1:
            raise UserError(f"proximity.strip_fraction = {self.strip_fraction} must be in [0, 1]")

    @property
    def max_rank(self) -> int:
        return max([m for m in self.ranks if m != RANDOM], default=0)


def read_grids(paths: list[str]) -> tuple[Tensor, str]:
    """Token grids [n, N] (int64) and a description of their source."""
    if len(paths) == 1 and not paths[0].endswith(".csv"):
        return load_tokens(paths[0], "--tokens")["tokens"].long(), f"lantern tokenize file {paths[0]}"
    if not all(p.endswith(".csv") for p in paths):
        raise UserError("--tokens takes one `lantern tokenize` .pt file or `lantern sample` stats.csv file(s)")
    frames = []
    for path in paths:
        if not Path(path).is_file():
            raise UserError(f"--tokens {path} does not exist; it is a `lantern sample` stats.csv")
        df = read_csv(path, "--tokens", "regenerate it with `lantern sample`")
        if not {"image_index", "tokens"} <= set(df.columns):
            raise UserError(f"--tokens {path} has no image_index / tokens columns; is it a `lantern sample` stats.csv?")
        frames.append(df[["image_index", "tokens"]])
    df = pd.concat(frames).sort_values("image_index")
    try:
        rows = [[int(t) for t in str(s).split()] for s in df["tokens"]]
    except ValueError:
        raise UserError(f"--tokens {', '.join(paths)}: the tokens column must hold space-separated integers") from None
    if not rows or len({len(r) for r in rows}) != 1 or not rows[0]:
        raise UserError(f"--tokens {', '.join(paths)}: every image needs the same, non-zero number of tokens")
    return torch.tensor(rows, dtype=torch.long), f"stats.csv tokens of {len(paths)} file(s), e.g. {paths[0]}"


def check_table(path: str, codebook: Tensor, max_rank: int) -> tuple[Tensor, str]:
    """The table's first max_rank columns and its metric, after checking it holds that many neighbours."""
    meta = load_torch(path, "neighbour table", "lantern neighbours", mmap=True).get("meta")
    if isinstance(meta, dict) and isinstance(meta.get("k"), int) and meta["k"] < max_rank:
        raise UserError(f"proximity rank m={max_rank} exceeds the {meta['k']} neighbours per code of {path}; "
                        f"lower proximity.ranks or rebuild the table with `lantern neighbours` k >= {max_rank}")
    table = load_neighbours(path, codebook, max(max_rank, 1))
    return table[:, :max_rank].long(), meta["metric"]


def replace(tokens: Tensor, rank: Tensor, fraction: float, m, table: Tensor, random_codes: Tensor) -> Tensor:
    """`tokens` with the round(fraction * N) lowest-`rank` positions of every grid swapped for their m-th neighbour."""
    mask = rank < round(fraction * tokens.shape[1])
    if m == RANDOM:
        new = random_codes
    elif m == 0:
        new = tokens
    else:
        new = table[tokens, m - 1]
    return torch.where(mask, new, tokens)


@torch.no_grad()
def decode(vq, tokens: Tensor, batch: int, device) -> Tensor:
    """uint8 [n, 3, H, W] as the VQ's world writes its PNGs (a LlamaGen VQ rounded as `lantern sample`; a Chameleon
    VQGAN truncated, through its world's pixels_of); always in the same batches."""
    out = []
    for lo in range(0, len(tokens), batch):
        codes = tokens[lo : lo + batch].to(device)
        if isinstance(vq, VQGAN):
            out.append(torch.from_numpy(pixels_of(vq, math.isqrt(codes.shape[1]))(codes)).permute(0, 3, 1, 2))
            continue
        x = vq.decode_code(codes)
        out.append(((x.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).cpu())
    return torch.cat(out)


def codebook_of(vq) -> Tensor:
    """The code vectors the decoder sees [V, D] (float64, CPU)."""
    return (vq.codebook if isinstance(vq, VQGAN) else vq.quantize.codebook()).detach().cpu().double()


@torch.no_grad()
def features(net, images: Tensor, p: FidelityParams, batch: int, device) -> Tensor:
    """float64 [n, d]: the FID extractor's features, after the run's evaluation resize (metrics.resolution)."""
    ds = ImageSet("decodes", images=images).dataset(p.resolution, p.resize_filter)
    out = []
    for lo in range(0, len(ds), batch):
        x = torch.stack([ds[i] for i in range(lo, min(lo + batch, len(ds)))]).to(device)
        out.append(net(x)[0].double().cpu())
    return torch.cat(out)


def frechet(a: Tensor, b: Tensor) -> float:
    return fid_statistics_to_metric(fid_features_to_statistics(a), fid_features_to_statistics(b), False)[KEY_METRIC_FID]


def shift(orig: Tensor, mod: Tensor, f_orig: Tensor, f_mod: Tensor) -> dict:
    """How far the modified decodes moved from the originals: feature FD and cosine, pixel PSNR and MAE (0..1)."""
    diff = (mod.double() - orig.double()) / 255
    mse = diff.pow(2).mean().item()
    return {"fd": frechet(f_mod, f_orig), "feature_cosine": F.cosine_similarity(f_mod, f_orig, dim=1).mean().item(),
            "psnr": 10 * math.log10(1 / mse) if mse > 0 else math.inf, "mae": diff.abs().mean().item()}


def strip(vq, tokens: Tensor, rank: Tensor, table: Tensor, random_codes: Tensor, p: ProximityParams, device,
          path: str) -> None:
    """PNG: the first strip_images originals (top row), then one row per m at strip_fraction (ranks' order)."""
    from torchvision.utils import make_grid, save_image

    sl = slice(0, p.strip_images)
    rows = [tokens[sl]] + [replace(tokens[sl], rank[sl], p.strip_fraction, m, table, random_codes[sl])
                           for m in p.ranks]
    images = decode(vq, torch.cat(rows), p.batch, device)
    scale = max(1, 96 // images.shape[-1])  # 32-pixel toy images are enlarged (nearest) so that they can be seen
    images = images.repeat_interleave(scale, -1).repeat_interleave(scale, -2)
    with atomic_path(path) as tmp:
        save_image(make_grid(images.float() / 255, nrow=len(rows[0]), padding=2, pad_value=1.0), tmp, format="png")


def measure(vq, tokens: Tensor, table: Tensor, net, fp: FidelityParams, p: ProximityParams, device,
            classifier=None) -> tuple:
    """One row per (fraction, m), the noise reference, and the seeded draws (position ranks, random codes);
    with a classifier, each row's class agreement with the unmodified decodes."""
    n, N = tokens.shape
    g = torch.Generator().manual_seed(p.seed)
    rank = torch.rand(n, N, generator=g).argsort(1).argsort(1)
    codebook = codebook_of(vq)
    r = torch.randint(0, codebook.shape[0] - 1, (n, N), generator=g)
    random_codes = r + (r >= tokens)  # uniform over the other codes
    halves = torch.randperm(n, generator=g)
    orig = decode(vq, tokens, p.batch, device)
    f_orig = features(net, orig, fp, p.batch, device)
    c_orig = None if classifier is None else predict(classifier, orig, p.batch)
    noise = frechet(f_orig[halves[: n // 2]], f_orig[halves[n // 2 : 2 * (n // 2)]])
    rows = []
    for fraction in p.fractions:
        for m in p.ranks:
            new = replace(tokens, rank, fraction, m, table, random_codes)
            changed = new != tokens
            moved = (codebook[new] - codebook[tokens]).norm(dim=-1)[rank < round(fraction * N)]
            mod = decode(vq, new, p.batch, device)
            rows.append({"fraction": fraction, "m": str(m), "n_images": n,
                         "tokens_changed": changed.double().mean().item(),
                         "code_distance": moved.mean().item() if len(moved) else math.nan,
                         **shift(orig, mod, f_orig, features(net, mod, fp, p.batch, device)),
                         "fd_noise_halves": noise})
            if classifier is not None:
                agree, se = accuracy_se(predict(classifier, mod, p.batch) == c_orig)
                rows[-1].update(class_agreement=agree, class_agreement_se=se)
            print(f"fraction {fraction:g}, m {m}: " + ", ".join(
                f"{k} {rows[-1][k]:.4g}" for k in ("fd", "feature_cosine", "psnr", "mae", "class_agreement")
                if k in rows[-1]), flush=True)
    return rows, rank, random_codes


def interchangeable_rank(df: pd.DataFrame, fraction: float = 0.25) -> int | None:
    """The largest measured neighbour rank m such that replacing `fraction` of the tokens by their m-th nearest
    code, and by every nearer measured rank, keeps the FD shift under the noise reference (two halves of the
    originals): how far LANTERN's k can reach before a relaxed code stops being interchangeable. None when even the
    nearest measured rank leaves the noise band (or the fraction was not measured)."""
    at = df[(df["fraction"] == fraction) & (df["m"].astype(str) != RANDOM)]
    at = at.assign(rank=at["m"].astype(int)).sort_values("rank")
    best = None
    for _, row in at[at["rank"] > 0].iterrows():
        if row["fd"] > row["fd_noise_halves"]:
            break
        best = int(row["rank"])
    return best


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="lantern proximity", description=__doc__.split("\n")[0])
    ap.add_argument("--vq", required=True, help="VQ checkpoint that decodes the grids (with --vqgan-yaml: "
                    "Chameleon's vqgan.ckpt)")
    ap.add_argument("--vqgan-yaml", default=None, help="a Chameleon world: the VQGAN's vqgan.yaml (--vq is its "
                    "vqgan.ckpt), read through its reader and decoded as the world writes its PNGs")
    ap.add_argument("--neighbours", required=True, help="`lantern neighbours` table built for this VQ")
    ap.add_argument("--tokens", nargs="+", required=True, help="held-out grids: a `lantern tokenize` file, or "
                    "`lantern sample` stats.csv file(s) (tokens column)")
    ap.add_argument("--fidelity", default=None, help="FidelityParams of the run's FD (extractor, weights_path, "
                    "resolution, resize_filter) as JSON/YAML or a file; other keys are ignored")
    ap.add_argument("--params", default=None, help="ProximityParams (fractions, ranks, n_images, seed, ...)")
    ap.add_argument("--world", default="toy", help="world name written in the table's world column")
    ap.add_argument("--out", required=True, help="tidy CSV: world, fraction, m, fd, feature_cosine, psnr, ...")
    ap.add_argument("--strip", required=True, help="PNG: originals and their replaced versions, one row per m")
    ap.add_argument("--classifier", default=None, help="`lantern train-classifier` checkpoint: also report how often a "
                    "swap keeps the decode's predicted class (class_agreement)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    a = ap.parse_args(argv)
    p = params_from(read_structured(a.params), ProximityParams)
    fp = params_from(read_structured(a.fidelity, "--fidelity"), FidelityParams, "fidelity.")
    if not a.out.endswith(".csv") or not a.strip.endswith(".png"):
        raise UserError(f"--out must end in .csv and --strip in .png, got {a.out} and {a.strip}")
    device = parse_device(a.device)
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    tokens, source = read_grids(a.tokens)
    if a.vqgan_yaml is not None:
        from lantern.worlds.chameleon.vqgan import read_codebook as read_vqgan_codebook

        codebook = read_vqgan_codebook(a.vq, a.vqgan_yaml)  # checked against vqgan.yaml, as the table was built
    else:
        codebook = read_codebook(a.vq)
    V = codebook.shape[0]
    if tokens.min() < 0 or tokens.max() >= V:
        raise UserError(f"--tokens hold codes {tokens.min()}..{tokens.max()} but {a.vq} has {V} codes; give grids "
                        "made with this VQ")
    if math.isqrt(tokens.shape[1]) ** 2 != tokens.shape[1]:
        raise UserError(f"--tokens grids have {tokens.shape[1]} tokens, not a square grid the VQ can decode")
    table, metric = check_table(a.neighbours, codebook, p.max_rank)
    net, sha = fid_feature_extractor(fp.extractor, fp.weights_path)  # a bad extractor fails before any decoding
    classifier = None if a.classifier is None else load_classifier(a.classifier, str(device))
    vq = load_vq(a.vq, device=str(device)) if a.vqgan_yaml is None else load_vqgan(a.vq, a.vqgan_yaml, device)
    net = net.to(device).eval()
    tokens = tokens[: p.n_images]
    if len(tokens) < 4:
        raise UserError(f"--tokens hold {len(tokens)} grids; the FD noise reference needs at least 4")
    rows, rank, random_codes = measure(vq, tokens, table, net, fp, p, device, classifier)
    protocol = {"world": a.world, "extractor": fp.extractor, "extractor_sha256": sha, "neighbour_metric": metric,
                "seed": p.seed, "strip_fraction": p.strip_fraction, "tokens_source": source}
    df = pd.DataFrame([{**protocol, **row} for row in rows])
    lead = ["world", "fraction", "m", "fd", "fd_noise_halves", "feature_cosine", "psnr", "mae", "tokens_changed",
            "code_distance", "n_images"]
    df = df[lead + [c for c in df.columns if c not in lead]]
    m = interchangeable_rank(df, p.decide_fraction)
    df["interchangeable_m"] = m  # one value per table: it decides the sweep's k grid (config.yaml, docs/metrics.md)
    strip(vq, tokens, rank, table, random_codes, p, device, a.strip)
    with atomic_path(a.out) as tmp:
        df.to_csv(tmp, index=False)
    print(f"largest m whose {p.decide_fraction:g} replacement keeps the FD shift under the noise reference: "
          f"{m if m is not None else 'none (even the nearest measured rank leaves it)'}")
    print(f"wrote {a.out} ({len(df)} rows, {len(tokens)} images) and {a.strip}")
