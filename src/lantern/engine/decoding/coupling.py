"""Coupled Jacobi drafts (SCD, So et al., arXiv 2510.24211): how jacobi.py re-drafts the window tokens after the
accepted prefix, so that a position whose target distribution barely moved between iterations keeps its token.

Which tokens are committed does not change: an iteration commits the accepted prefix and the token at the first
rejection (the rule's residual) or the bonus token, exactly as speculative Jacobi decoding (jacobi.py, step 3).
The coupling changes only step 4, the re-draft of the window tokens x_k after that prefix from this iteration's
target distribution P_k at their position (computed under the old, stale prefix), which becomes their q next time:
- independent (SJD): x'_k is a fresh draw from P_k, its own uniform;
- maximal: x'_k = x_k with probability min(1, P_k(x_k) / q_k(x_k)), else a draw from the residual (P_k - q_k)+,
  with ONE uniform u: keep if u < A, else the residual's inverse-CDF draw at (u - A) / (1 - A), which is uniform
  given u >= A. This is a maximal coupling of q_k and P_k: x'_k ~ P_k whenever x_k ~ q_k, and x'_k = x_k with
  probability 1 - TV(q_k, P_k). A window position with no earlier token (the bonus row, fresh positions) draws as
  SJD does. SJD-PAC's adaptive continuation (Kang et al., arXiv 2603.18599: after a rejection, keep each later
  draft that passes its test against the stale distribution, resample the failed ones from the residual, carry P
  as their q) is this same iteration;
- gumbel: x'_k = argmax(log P_k + g_k), g_k a vector of V Gumbel(0, 1) noises drawn once per image and absolute
  position k from the image's generator, reused at position k by every iteration (fresh positions: argmax g_k,
  a uniform draw), never by another position.

Exactness (every coupling, any acceptance rule's commit). Fix an image position k. Everything that happens at
positions < k, over all iterations (their drafts, P rows, tests, commits, hence the iteration t* at which position
k is tested or committed, and P_k in each iteration), depends on position k's randomness nowhere: the target is
causal, so a token at k enters only rows of later positions, and each test or draw uses its own uniform. By
induction over iterations, given all of that, the draft at k is distributed as its declared q_k: the first one is
uniform; independent re-drafts are P_k draws; a maximal coupling maps a q_k-distributed token to a P_k-distributed
one; and g_k is independent of the < k process, so argmax(log P_k + g_k) is a P_k draw given it (the Gumbel-max
trick), however often g_k was used before (earlier drafts at k were never tested: a tested position is committed).
At iteration t* position k is tested once against P_k (the target's conditional given the committed prefix) with a
fresh uniform, so the committed token has the law of plain speculative sampling with draft law q_k: under `exact`,
P_k. Hence every image's tokens have plain AR's joint law; tests/test_coupling.py checks it by chi-square on
exact enumeration, and checks that two broken variants fail the same test (a maximal coupling that resamples from
P_k instead of the residual; Gumbel noise shared by all positions, which lets the < k process see g_k).
Greedy decoding has nothing to couple: every coupling re-drafts argmaxes, i.e. is greedy Jacobi decoding.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lantern.engine.decoding.sampling import draw

COUPLINGS = ("independent", "maximal", "gumbel")


def maximal(P: Tensor, q: Tensor, x: Tensor, u: Tensor) -> Tensor:
    """Maximal coupling of q and P on the device, one uniform per row: P, q [..., V], x [...] drawn from q, u [...]
    float64 -> tokens [...] distributed as P, equal to x with probability 1 - TV(q, P)."""
    px, qx = P.gather(-1, x[..., None])[..., 0].double(), q.gather(-1, x[..., None])[..., 0].double()
    A = torch.where(qx > 0, (px / qx.clamp(min=1e-300)).clamp(max=1.0), torch.ones_like(px))
    keep = u < A
    v = ((u - A) / (1.0 - A).clamp(min=1e-300)).clamp(0.0, 1.0)
    return torch.where(keep, x, draw((P - q).clamp(min=0.0), v))


def gumbel_noise(generator: torch.Generator, positions: int, V: int, device) -> Tensor:
    """[positions, V] Gumbel(0, 1) noises, drawn from the image's generator on its device, moved to `device`."""
    u = torch.rand(positions, V, generator=generator, dtype=torch.float64, device=generator.device)
    return (-torch.log(-torch.log(u))).float().to(device)


def gumbel(P: Tensor, g: Tensor) -> Tensor:
    """The Gumbel-max draws argmax(log P + g) of P [..., V] under noises g [..., V]."""
    return (P.log() + g).argmax(-1)
