"""Peak memory of the precision / recall bootstrap (metrics/bootstrap.py), chunked against one full block.

    python benchmarks/bootstrap_memory.py [--n-ref 8000] [--n-gen 4000] [--dim 256] [--chunk 256 8000]

Each chunk size runs in a fresh subprocess on the CPU: the figure is the process's peak resident memory above what
it held with the random features loaded and one
tiny warm-up call made (ru_maxrss), so torch's own allocations are counted, which tracemalloc
does not see. A chunk >= n_ref is the computation before chunking (one n x n distance block). Also prints the
analytic float64 figures for ImageNet-val (50k references, 50k generated images, VGG16's 4096-d features).
"""

import argparse
import json
import resource
import subprocess
import sys

GIB = 2**30


def analytic(n_ref: int = 50_000, n_gen: int = 50_000, dim: int = 4096, chunk: int = 1024) -> dict:
    """float64 bytes: the features, one full distance matrix, one chunk block."""
    return {"n_ref": n_ref, "n_gen": n_gen, "dim": dim, "chunk": chunk,
            "features_gib": round(8 * (n_ref + n_gen) * dim / GIB, 2),
            "full_distance_matrix_gib": round(8 * n_ref * n_ref / GIB, 2),
            "chunk_block_gib": round(8 * chunk * max(n_ref, n_gen) / GIB, 3)}


def measure(n_ref: int, n_gen: int, dim: int, chunk: int) -> dict:
    import torch

    from lantern.metrics.bootstrap import prc_values, resamples

    torch.set_num_threads(1)
    ref = torch.randn(n_ref, dim, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    gen = torch.randn(n_gen, dim, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    draws = resamples(n_gen, 20, 0)
    prc_values(gen[:64], ref[:64], 3, draws[:, :64] % 64, chunk=16)  # kernels and libraries loaded before the count
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    precision, recall = prc_values(gen, ref, 3, draws, chunk=chunk)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"n_ref": n_ref, "n_gen": n_gen, "dim": dim, "chunk": chunk, "peak_above_features_mb": round(peak - before),
            "full_block_mb": round(8 * n_ref * n_ref / 2**20), "chunk_block_mb": round(8 * chunk * n_ref / 2**20),
            "precision_mean": float(precision.mean()), "recall_mean": float(recall.mean())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-ref", type=int, default=8000)
    ap.add_argument("--n-gen", type=int, default=4000)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--chunk", type=int, nargs="+", default=[256, 8000])
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # the subprocess's own run
    a = ap.parse_args()
    if a.one is not None:
        print(json.dumps(measure(a.n_ref, a.n_gen, a.dim, a.one)))
        return
    print(json.dumps({"analytic_imagenet_val": analytic()}))
    for chunk in a.chunk:
        out = subprocess.run([sys.executable, __file__, "--n-ref", str(a.n_ref), "--n-gen", str(a.n_gen),
                              "--dim", str(a.dim), "--one", str(chunk)], check=True, capture_output=True, text=True)
        print(out.stdout.strip())


if __name__ == "__main__":
    main()
