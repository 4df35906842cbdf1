"""Too few images per sweep point (issue #29, item 6): check-config refuses fewer than FID / KID need, and
`lantern evaluate` marks precision / recall skipped, with the reason, where k = 3 nearest neighbours do not fit."""

import pytest

from lantern.errors import UserError
from lantern.metrics.fidelity import FidelityParams, fidelity_metrics
from lantern.pipeline.config import validate_config
from test_metrics_fidelity import blobs, write  # also registers the test-tiny extractor

P = FidelityParams(extractor="test-tiny", kid_subset_size=50, bootstrap=20)


@pytest.mark.parametrize("n_gen, skipped", [(2, True), (3, True), (4, False)])
def test_precision_recall_skipped_below_k_plus_one(tmp_path, n_gen, skipped):
    ref = write(tmp_path / "ref", blobs(8, 0))
    gen = write(tmp_path / "gen", blobs(n_gen, 1, 0.1))
    row = fidelity_metrics(gen, ref, P)
    assert row["fid"] > 0 and row["kid_mean"] is not None and row["fid_se"] is not None
    if skipped:
        assert row["precision"] is None and row["recall"] is None and row["precision_se"] is None
        assert row["fidelity_skipped"] == (f"precision, recall: k = 3 nearest neighbours need at least 4 images "
                                           f"per set, got {n_gen} generated and 8 reference")
    else:
        assert row["precision"] is not None and row["recall_se"] is not None and row["fidelity_skipped"] == "none"


@pytest.mark.parametrize("sweep, message", [
    ({"n_images": 1, "shards": 1, "modes": ["sampling"]},
     "config: sweep.n_images = 1 gives each sampling point 1 image; FID and KID need at least 2 (precision / recall "
     "4): raise sweep.n_images"),
    ({"n_images": 8, "shards": 1, "modes": ["sampling", "greedy"], "mode_images": {"greedy": 1}},
     "config: sweep.mode_images.greedy = 1 gives each greedy point 1 image; FID and KID need at least 2 (precision / "
     "recall 4): raise sweep.mode_images.greedy"),
])
def test_check_config_refuses_a_point_without_two_images(sweep, message):
    with pytest.raises(UserError) as e:
        validate_config({"sweep": sweep})
    assert str(e.value) == message
    sweep = {**sweep, "n_images": 2} if "mode_images" not in sweep else {**sweep, "mode_images": {"greedy": 2}}
    validate_config({"sweep": sweep})  # two images pass (precision / recall are then skipped by evaluate)


def test_tables_take_precision_skipped_at_every_point():
    """A sweep whose every point skipped precision / recall (a column of None) still gets its z-scores: NaN there,
    numbers elsewhere (was a TypeError in the tables job)."""
    import math

    import pandas as pd

    from lantern.pipeline.relative import quality_z

    sweep = pd.DataFrame({"point": ["vanilla", "x", "vanilla", "x"], "mode": ["sampling", "sampling", "greedy", "greedy"],
                          "precision": [None] * 4, "precision_se": [None] * 4,
                          "fid": [1.0, 2.0, 3.0, 5.0], "fid_se": [0.5, 0.5, 1.0, 1.0]})
    assert all(math.isnan(z) for z in quality_z(sweep, "precision", "precision_se"))
    z = quality_z(sweep, "fid", "fid_se").tolist()
    assert math.isnan(z[0]) and math.isnan(z[2]) and z[1] == pytest.approx(2 ** 0.5) and z[3] == pytest.approx(2 ** 0.5)
