"""The bootstrap standard errors behind the tables' noise band: the right metric per resample, the right size."""

import numpy as np
import pytest
import torch
from torch_fidelity.metric_fid import fid_features_to_statistics, fid_statistics_to_metric
from torch_fidelity.metric_prc import calculate_precision_recall_full

from lantern.metrics.bootstrap import fid_se, fid_values, knn_radii, prc_se, prc_values, resamples


def gaussian(n, d=8, shift=0.0, seed=0):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) + shift


def fid(a, b):
    return fid_statistics_to_metric(fid_features_to_statistics(a), fid_features_to_statistics(b), False)[
        "frechet_inception_distance"]


def test_resamples_are_seeded_and_in_range():
    a, b = resamples(50, 20, 3), resamples(50, 20, 3)
    assert a.shape == (20, 50) and (a == b).all() and a.min() >= 0 and a.max() < 50
    assert not (a == resamples(50, 20, 4)).all()


def test_each_resample_is_torch_fidelitys_metric_of_the_resampled_set():
    gen, ref = gaussian(120, shift=0.3), gaussian(300, seed=1)
    mu, sigma = fid_features_to_statistics(ref).values()
    draws = np.concatenate([np.arange(120)[None], resamples(120, 4, 0)])
    assert fid_values(gen, mu, sigma, draws) == pytest.approx([fid(gen[idx], ref) for idx in draws], rel=1e-6)
    precision, recall = prc_values(gen, ref, 3, draws)
    p_all, r_all = calculate_precision_recall_full(gen, ref, 3)
    assert (precision[0], recall[0]) == pytest.approx((p_all, r_all))  # the full set: torch-fidelity's numbers
    # a resample: precision is the mean of the drawn images' indicators, recall the union of their full-set balls
    assert precision[1] == pytest.approx(np.mean([calculate_precision_recall_full(gen[i:i + 1].repeat(4, 1), ref, 3)[0]
                                                  for i in draws[1]]))
    assert 0 < recall[1] <= r_all


def test_no_spread_without_resampling_and_a_clear_spread_with_it():
    gen, ref = gaussian(120, shift=0.3), gaussian(300, seed=1)
    mu, sigma = fid_features_to_statistics(ref).values()
    same = np.tile(np.arange(120), (3, 1))
    assert fid_se(gen, mu, sigma, same) == pytest.approx(0.0, abs=1e-9) and prc_se(gen, ref, 3, same) == (0.0, 0.0)
    assert fid_se(gen, mu, sigma, resamples(120, 50, 0)) > 0.01


def test_standard_errors_shrink_like_one_over_root_n():
    ref = gaussian(2000, seed=9)
    mu, sigma = fid_features_to_statistics(ref).values()
    small, large = gaussian(100, shift=0.2, seed=2), gaussian(400, shift=0.2, seed=3)
    se_small = fid_se(small, mu, sigma, resamples(100, 200, 0))
    se_large = fid_se(large, mu, sigma, resamples(400, 200, 0))
    assert 0.3 < se_large / se_small < 0.75  # 1/sqrt(4) = 0.5
    # precision is a mean of fixed indicators: its bootstrap SE is the binomial one
    p, _ = calculate_precision_recall_full(large, ref[:400], 3)
    se_p, se_r = prc_se(large, ref[:400], 3, resamples(400, 400, 1))
    assert se_p == pytest.approx(np.sqrt(p * (1 - p) / 400), rel=0.2)
    assert 0 < se_r < 0.1


# -- distances in row chunks (an ImageNet-val reference: 50k x 4096 VGG16 features) -------------------------------
def test_chunked_radii_and_memberships_equal_the_unchunked_ones():
    """A chunk that does not divide either set (a partial last block) gives the numbers of one full block."""
    gen, ref = gaussian(90, d=16, shift=0.3), gaussian(150, d=16, seed=1)
    draws = np.concatenate([np.arange(90)[None], resamples(90, 6, 0)])
    one_block = prc_values(gen, ref, 3, draws, chunk=10_000)
    for chunk in (1, 7, 64):
        assert [a.tolist() for a in prc_values(gen, ref, 3, draws, chunk=chunk)] == [a.tolist() for a in one_block]
    assert torch.allclose(knn_radii(ref, 3, 7), torch.cdist(ref, ref).kthvalue(4, dim=1).values, rtol=1e-12)
    p_all, r_all = calculate_precision_recall_full(gen, ref, 3)
    assert (one_block[0][0], one_block[1][0]) == pytest.approx((p_all, r_all))


def test_imagenet_val_shapes_stay_within_one_chunk_of_rows(monkeypatch):
    """ImageNet-val's shape logic (VGG16's 4096-d features, more references than generated images, neither a
    multiple of the chunk) at a size CI affords: every distance block the bootstrap computes has at most `chunk`
    rows, so its memory is chunk x n x 8 bytes, never n_ref x n_gen or n_ref^2."""
    from lantern.metrics import bootstrap

    n_ref, n_gen, d, chunk = 500, 200, 4096, 64
    ref = torch.randn(n_ref, d, generator=torch.Generator().manual_seed(0))
    gen = torch.randn(n_gen, d, generator=torch.Generator().manual_seed(1)) * 1.1
    blocks = []
    cdist = torch.cdist

    def recorded(a, b, *args, **kw):
        out = cdist(a, b, *args, **kw)
        blocks.append(tuple(out.shape))
        return out

    monkeypatch.setattr(bootstrap.torch, "cdist", recorded)
    draws = resamples(n_gen, 3, 0)
    precision, recall = prc_values(gen, ref, 3, draws, chunk=chunk)
    monkeypatch.undo()
    rows_against = {n: sum(rows for rows, cols in blocks if cols == n) for n in (n_gen, n_ref)}
    # radii of the references against the references; radii of the generated images, then the memberships, against
    # the generated images: every row once per pass, in blocks of at most `chunk` rows
    assert max(rows for rows, _ in blocks) == chunk and {cols for _, cols in blocks} == {n_gen, n_ref}
    assert rows_against == {n_ref: n_ref, n_gen: n_gen + n_ref}
    want = prc_values(gen, ref, 3, draws, chunk=n_ref)
    assert precision.tolist() == want[0].tolist() and recall.tolist() == want[1].tolist()


def test_bad_chunk_is_refused():
    with pytest.raises(ValueError, match="chunk=0"):
        prc_values(gaussian(10), gaussian(10), 3, resamples(10, 2, 0), chunk=0)
