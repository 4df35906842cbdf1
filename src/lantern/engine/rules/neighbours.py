"""`lantern neighbours`: latent-proximity tables over a VQ codebook (LANTERN's neighbour sets).

`--vq` takes a LlamaGen VQ file or a taming VQGAN's Lightning checkpoint (Chameleon's vqgan.ckpt: one codebook,
8192 x 256, serves Anole and Lumina-mGPT). The authors' own `top_{N-1}_indices.npy` (uint16) is read into this
format and written from it by `read_authors_table` / `save_authors_table`.

Row x of the table lists the K codes nearest to code x, self excluded, nearest first (as in the authors'
entrypoints/generate_codebook.py, whose full [N, N - 1] table fills the diagonal with inf). Equal distances are
ordered by code index, lower first (the authors' CUDA topk leaves that order unspecified). `l2` measures on the raw
codebook rows (the authors' code), `cosine` on L2-normalised rows (what a quantiser with codebook_l2_norm matches
on). Rows are computed a chunk at a time, so memory stays at a few chunk x N matrices, never N x N (LlamaGen's
16384 x 8 codebook at the paper's k = 1000: about 3 s and 100 MB above torch's own footprint on 2 CPU cores).

Indices are stored in the smallest signed type that holds every code (int16 up to 32768 codes, so LlamaGen's 16384
codes take 2 bytes each; int32 beyond) and the file says which (meta index_dtype). `load_neighbours` hands the
compact table out; acceptance.py widens the rows it reads. The file also records the metric, K and the codebook's
checksum; `load_neighbours` refuses a table built for another codebook.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from lantern.errors import UserError
from lantern.params import params_from
from lantern.io import load_torch, read_structured, save_torch

CODEBOOK_KEY = "quantize.embedding.weight"
FORMAT = "lantern-neighbours-v1"


@dataclass(frozen=True)
class NeighbourParams:
    metric: str = "l2"
    k: int = 100  # neighbours stored per code (>= every k a method will use)
    chunk: int = 128  # codes per distance block (memory ~ chunk x N x 4 bytes x a few)

    def __post_init__(self):
        if self.metric not in ("l2", "cosine"):
            raise UserError(f"neighbours metric must be 'l2' or 'cosine', got {self.metric!r}")
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise UserError(f"neighbours k={self.k!r} must be a positive integer")
        if isinstance(self.chunk, bool) or not isinstance(self.chunk, int) or self.chunk < 1:
            raise UserError(f"neighbours chunk={self.chunk!r} must be a positive integer")


def codebook_sha256(codebook: Tensor) -> str:
    """Checksum of the codebook's fp32 values and shape (independent of the file that holds it)."""
    cb = codebook.detach().to("cpu", torch.float32).contiguous()
    h = hashlib.sha256(f"{tuple(cb.shape)}".encode())
    h.update(cb.numpy().tobytes())
    return h.hexdigest()


def read_codebook(path: str | Path) -> Tensor:
    """The [N, D] codebook of a VQ checkpoint ({"model": state_dict}, as upstream ships it, or a raw state dict),
    read without building the VQ model."""
    from lantern.engine.models.checkpoint import extract_state_dict
    from lantern.engine.models.vqgan import read_lightning_state_dict

    try:  # mmap: only the codebook's bytes of a 288 MB upstream file are read
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - missing, legacy-format, Lightning or broken files: read below
        obj = None
    if isinstance(obj, dict):
        sd = extract_state_dict(obj, path)
    else:  # a Lightning checkpoint (Chameleon's vqgan.ckpt) or a legacy file; any other problem is one line
        sd = read_lightning_state_dict(path, "checkpoint")
    if not isinstance(sd.get(CODEBOOK_KEY), torch.Tensor):
        raise UserError(f"{path} has no {CODEBOOK_KEY}; pass a VQ tokenizer checkpoint, not a GPT or drafter")
    cb = sd[CODEBOOK_KEY].float()
    if cb.ndim != 2 or cb.shape[0] < 2:
        raise UserError(f"{path}: {CODEBOOK_KEY} has shape {tuple(cb.shape)}; expected [codes >= 2, dim]")
    if not torch.isfinite(cb).all():
        raise UserError(f"{path}: the codebook holds NaN or inf values; the VQ checkpoint is broken")
    return cb


def index_dtype(num_codes: int) -> torch.dtype:
    """The smallest signed integer type that holds code indices 0 .. num_codes - 1 (signed because torch supports
    few operations on uint16, which the authors' numpy table uses)."""
    return torch.int16 if num_codes <= 2**15 else torch.int32


def _ordered_rows(d: Tensor, k: int) -> Tensor:
    """Indices of the k smallest entries per row of d [B, N] (finite or +inf, >= 0), ordered by (distance, index).

    The bits of a non-negative float32 order like the float, so (bits << 32) | index is one int64 key per entry
    with no ties: a single top-k gives the order, including among equal distances at the cut.
    """
    key = d.contiguous().view(torch.int32).to(torch.int64)
    key <<= 32
    key |= torch.arange(d.shape[1])
    return torch.topk(key, k, dim=1, largest=False, sorted=True).values & 0xFFFFFFFF


def nearest_neighbours(codebook: Tensor, k: int, metric: str = "l2", chunk: int = 128) -> Tensor:
    """[N, k] in index_dtype(N): for every code the k nearest other codes, nearest first (ties by lower index)."""
    n = codebook.shape[0]
    if not 1 <= k <= n - 1:
        raise UserError(f"neighbours k={k} must be between 1 and {n - 1} (the other codes of a {n}-code codebook)")
    cb = codebook.detach().to("cpu", torch.float32)
    if metric == "cosine":
        cb = F.normalize(cb, dim=1)
    out = torch.empty(n, k, dtype=index_dtype(n))
    for s in range(0, n, chunk):
        rows = cb[s : s + chunk]
        # Difference-based distances: identical codes get bit-identical distances, so ties are real ties.
        d = torch.cdist(rows, cb, compute_mode="donot_use_mm_for_euclid_dist")
        d[torch.arange(len(rows)), torch.arange(s, s + len(rows))] = float("inf")  # self is never a neighbour
        out[s : s + chunk] = _ordered_rows(d, k)
    return out


def build_table(codebook: Tensor, params: NeighbourParams, source: str = "") -> dict:
    table = nearest_neighbours(codebook, params.k, params.metric, params.chunk)
    meta = {
        "format": FORMAT, "metric": params.metric, "k": params.k, "num_codes": codebook.shape[0],
        "dim": codebook.shape[1], "index_dtype": str(table.dtype).removeprefix("torch."),
        "codebook_sha256": codebook_sha256(codebook), "source": source,
    }
    return {"neighbours": table, "meta": meta}


def save_authors_table(table: Tensor, path: str | Path) -> None:
    """A table [N, K] as the authors' generate_codebook.py stores theirs: a uint16 .npy (top_{K}_indices.npy)."""
    import numpy as np

    from lantern.io import atomic_path

    if table.shape[0] > 2**16:
        raise UserError(f"a {table.shape[0]}-code table does not fit the authors' uint16 format")
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.save(f, table.to(torch.int64).numpy().astype(np.uint16))


def read_authors_table(path: str | Path, codebook: Tensor, metric: str = "l2") -> dict:
    """The authors' top_{K}_indices.npy [N, K] (row x: the codes nearest x, self excluded, nearest first) as this
    module's table ({"neighbours", "meta"}) for `codebook`; save it with lantern.io.save_torch. Their order among
    equal distances comes from a CUDA top-k and may differ from ours (ties by lower index)."""
    import numpy as np

    path = Path(path)
    if not path.is_file():
        raise UserError(f"neighbour table {path} does not exist; give the authors' top_<K>_indices.npy")
    try:
        arr = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as e:
        raise UserError(f"neighbour table {path} is not a .npy array ({str(e)[:80]})") from None
    n = codebook.shape[0]
    if arr.ndim != 2 or arr.shape[0] != n or not 1 <= arr.shape[1] <= n - 1 or arr.dtype.kind not in "iu":
        raise UserError(f"neighbour table {path} holds a {arr.dtype} {arr.shape} array; a table of this {n}-code "
                        f"codebook is integer [{n}, K <= {n - 1}]")
    table = torch.from_numpy(arr.astype(np.int64))
    if int(table.min()) < 0 or int(table.max()) >= n or (table == torch.arange(n)[:, None]).any():
        raise UserError(f"neighbour table {path} names codes outside 0..{n - 1} or a code as its own neighbour; "
                        "it was built for another codebook")
    meta = {"format": FORMAT, "metric": metric, "k": arr.shape[1], "num_codes": n, "dim": codebook.shape[1],
            "index_dtype": str(index_dtype(n)).removeprefix("torch."),
            "codebook_sha256": codebook_sha256(codebook), "source": str(path)}
    return {"neighbours": table.to(index_dtype(n)), "meta": meta}


def load_neighbours(path: str | Path, codebook: Tensor, k: int, metric: str | None = None) -> Tensor:
    """The first k columns of a stored table [N, k], in its compact index dtype (int16 / int32: index with
    `.long()` rows, as acceptance.py does), after checking it belongs to `codebook`."""
    obj = load_torch(path, "neighbour table", "lantern neighbours")
    meta, table = obj.get("meta"), obj.get("neighbours")
    if (not isinstance(meta, dict) or meta.get("format") != FORMAT or not isinstance(table, torch.Tensor)
            or not all(key in meta for key in ("codebook_sha256", "k", "metric", "num_codes"))):
        raise UserError(f"{path} is not a neighbour table written by `lantern neighbours`")
    if meta["codebook_sha256"] != codebook_sha256(codebook):
        raise UserError(
            f"neighbour table {path} was built for another codebook (source {meta['source'] or 'unknown'}); "
            "rebuild it from this VQ checkpoint"
        )
    if meta["k"] < k:
        raise UserError(f"neighbour table {path} stores k={meta['k']} neighbours but {k} are needed; rebuild with k >= {k}")
    if metric is not None and meta["metric"] != metric:
        raise UserError(f"neighbour table {path} uses metric {meta['metric']}, but {metric} was asked for")
    if table.dtype not in (torch.int16, torch.int32, torch.int64) or table.shape != (meta["num_codes"], meta["k"]):
        raise UserError(f"neighbour table {path} holds a {str(table.dtype)} {tuple(table.shape)} tensor; rebuild it")
    return table[:, :k].clone()  # a copy, so the unused columns are freed


def main(argv: list[str], codebook_of=None, prog: str = "lantern neighbours") -> None:
    """`lantern neighbours`; codebook_of(path) reads --vq's codebook (default read_codebook: a world's own reader,
    such as the Chameleon VQGAN's, checks its file against its config)."""
    ap = argparse.ArgumentParser(prog=prog, description=__doc__)
    ap.add_argument("--vq", required=True, help="VQ checkpoint holding quantize.embedding.weight")
    ap.add_argument("--out", required=True, help="output table (.pt)")
    ap.add_argument("--params", default=None, help="NeighbourParams: metric (l2|cosine), k, chunk (JSON/YAML or file)")
    ap.add_argument("--from-authors", default=None, help="convert the authors' top_<K>_indices.npy (for --vq's "
                    "codebook) instead of building; --params is then ignored")
    ap.add_argument("--authors-out", default=None, help="also write the table as the authors' uint16 .npy")
    a = ap.parse_args(argv)
    params = params_from(read_structured(a.params), NeighbourParams)
    codebook = (codebook_of or read_codebook)(a.vq)
    if params.k > codebook.shape[0] - 1 and not a.from_authors:
        raise UserError(f"neighbours k={params.k} exceeds the {codebook.shape[0] - 1} other codes of {a.vq}; lower k")
    rss_mb = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # noqa: E731 - peak so far
    before_mb, t0 = rss_mb(), time.perf_counter()
    if a.from_authors:
        obj = read_authors_table(a.from_authors, codebook)
    else:
        obj = build_table(codebook, params, source=str(a.vq))
    seconds = time.perf_counter() - t0
    save_torch(obj, a.out)
    if a.authors_out:
        save_authors_table(obj["neighbours"], a.authors_out)
    # torch alone takes several hundred MB of RSS here; the build's own share is the rise above that
    print(json.dumps({**obj["meta"], "seconds": round(seconds, 2), "peak_rss_mb": round(rss_mb()),
                      "rss_before_build_mb": round(before_mb), "out": a.out}))
