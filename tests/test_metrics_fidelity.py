"""FID / KID / precision-recall through torch-fidelity: values, reference cache, and the weights-file rules."""

import numpy as np
import pytest
import torch
import torch_fidelity
from PIL import Image
from torch_fidelity import FeatureExtractorBase

from lantern.errors import UserError
from lantern.metrics.fidelity import FidelityParams, fidelity_metrics, register_extractor
from lantern.metrics.images import ImageSet


class TinyFeatures(FeatureExtractorBase):
    """A fixed random conv net: enough to tell image distributions apart, and cheap."""

    calls = 0  # images seen, to prove the reference cache is used

    def __init__(self, name, features_list, **kwargs):
        super().__init__(name, features_list)
        g = torch.Generator().manual_seed(0)
        self.w1 = torch.nn.Parameter(torch.randn(16, 3, 5, 5, generator=g) / 8, requires_grad=False)
        self.w2 = torch.nn.Parameter(torch.randn(24, 16, 3, 3, generator=g) / 12, requires_grad=False)

    @staticmethod
    def get_provided_features_list():
        return ("tiny",)

    @staticmethod
    def get_default_feature_layer_for_metric(metric):
        return "tiny"

    @staticmethod
    def can_be_compiled():
        return False

    @staticmethod
    def get_dummy_input_for_compile():
        return torch.zeros(1, 3, 32, 32, dtype=torch.uint8)

    def forward(self, x):
        TinyFeatures.calls += len(x)
        x = x.float() / 127.5 - 1
        h = torch.relu(torch.nn.functional.conv2d(x, self.w1, stride=2))
        h = torch.relu(torch.nn.functional.conv2d(h, self.w2, stride=2))
        return (torch.cat([h.mean((2, 3)), x.mean((2, 3))], 1),)


register_extractor("test-tiny", TinyFeatures)
register_extractor("test-tiny", TinyFeatures)  # idempotent


def blobs(n, seed, noise=0.0):
    """Smooth random colour fields with a bright disc: a simple image distribution."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:32, 0:32] / 31.0
    out = []
    for _ in range(n):
        c0, c1, fg = rng.random((3, 3))
        img = c0[:, None, None] * (1 - xx) + c1[:, None, None] * xx
        cx, cy, r = rng.uniform(0.3, 0.7, 2).tolist() + [rng.uniform(0.1, 0.3)]
        disc = ((xx - cx) ** 2 + (yy - cy) ** 2) < r * r
        img = np.where(disc, fg[:, None, None], img) + noise * rng.standard_normal((3, 32, 32))
        out.append((np.clip(img, 0, 1) * 255).round().astype(np.uint8))
    return np.stack(out)


def write(folder, images):
    folder.mkdir(parents=True)
    for i, im in enumerate(images):
        Image.fromarray(im.transpose(1, 2, 0)).save(folder / f"{i:06d}.png")
    return ImageSet.from_folders([folder], "test images")


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    root = tmp_path_factory.mktemp("fid")
    ref = blobs(120, 0)
    return {
        "ref": write(root / "ref", ref),
        "same": write(root / "same", ref),
        "noise10": write(root / "noise10", blobs(120, 0, 0.10)),
        "noise30": write(root / "noise30", blobs(120, 0, 0.30)),
    }


P = FidelityParams(extractor="test-tiny", kid_subset_size=50)


def test_self_fid_is_zero_and_grows_with_noise(sets):
    same = fidelity_metrics(sets["same"], sets["ref"], P)
    low = fidelity_metrics(sets["noise10"], sets["ref"], P)
    high = fidelity_metrics(sets["noise30"], sets["ref"], P)
    print(f"FID self {same['fid']:.2e}, noise 0.1 {low['fid']:.4f}, noise 0.3 {high['fid']:.4f}")
    assert abs(same["fid"]) < 1e-6
    assert 1e-4 < low["fid"] < high["fid"]
    assert low["kid_mean"] < high["kid_mean"] and abs(same["kid_mean"]) < high["kid_mean"]
    assert same["precision"] == 1.0 and same["recall"] == 1.0
    assert high["precision"] < 1.0


def test_numbers_are_torch_fidelity_numbers(sets):
    ours = fidelity_metrics(sets["noise10"], sets["ref"], P)
    theirs = torch_fidelity.calculate_metrics(
        input1=sets["noise10"].dataset(), input2=sets["ref"].dataset(), feature_extractor="test-tiny", fid=True,
        kid=True, prc=True, kid_subset_size=50, cuda=False, verbose=False, save_cpu_ram=True)
    assert ours["fid"] == theirs["frechet_inception_distance"]
    assert ours["kid_mean"] == theirs["kernel_inception_distance_mean"]
    assert (ours["precision"], ours["recall"]) == (theirs["precision"], theirs["recall"])


def test_protocol_and_kid_subset_clamp(sets):
    row = fidelity_metrics(sets["noise10"], sets["ref"], FidelityParams(extractor="test-tiny"))
    assert row["kid_subset_size"] == 120  # 1000 requested, clamped to the set size
    for key in ("fid_backend", "fid_extractor", "fid_weights_sha256", "n_generated", "n_reference", "resolution",
                "resize_filter", "fidelity_seed", "prc_neighborhood"):
        assert key in row
    assert row["fid_backend"] == f"torch-fidelity {torch_fidelity.__version__}"
    assert (row["n_generated"], row["n_reference"], row["resolution"]) == (120, 120, "32x32")


def test_reference_features_are_cached(sets, tmp_path):
    p = FidelityParams(extractor="test-tiny", kid_subset_size=50, cache_dir=str(tmp_path))
    first = fidelity_metrics(sets["noise10"], sets["ref"], p)
    files = sorted(f.name for f in tmp_path.iterdir())
    assert files and all(f.startswith(f"ref-{first['reference_sha256_16']}-wnone-r32x32-test-tiny") for f in files)
    TinyFeatures.calls = 0
    again = fidelity_metrics(sets["noise30"], sets["ref"], p)
    assert TinyFeatures.calls == 120  # the generated set only: the reference came from the cache
    assert again["fid"] == fidelity_metrics(sets["noise30"], sets["ref"], FidelityParams(
        extractor="test-tiny", kid_subset_size=50))["fid"]
    resized = FidelityParams(extractor="test-tiny", kid_subset_size=50, cache_dir=str(tmp_path), resolution=16)
    fidelity_metrics(sets["noise30"], sets["ref"], resized)
    assert any("-r16x16-" in f.name for f in tmp_path.iterdir())  # another resolution, another entry


def test_missing_or_empty_inception_weights_is_a_clear_error(sets, tmp_path):
    missing = tmp_path / "weights-inception-2015-12-05-6726825d.pth"
    with pytest.raises(UserError, match=f"weights not found at {missing}.*fidelity.weights_path"):
        fidelity_metrics(sets["same"], sets["ref"], FidelityParams(weights_path=str(missing)))
    with pytest.raises(UserError, match="fidelity.weights_path is empty.*weights-inception-2015-12-05"):
        fidelity_metrics(sets["same"], sets["ref"], FidelityParams())
    with pytest.raises(UserError, match="unknown feature extractor"):
        fidelity_metrics(sets["same"], sets["ref"], FidelityParams(extractor="nope"))


def test_mismatched_sizes_need_a_resolution(sets, tmp_path):
    small = write(tmp_path / "small", blobs(4, 1)[:, :, ::2, ::2].copy())
    with pytest.raises(UserError, match="16x16 but reference images are 32x32.*fidelity.resolution"):
        fidelity_metrics(small, sets["ref"], P)


def test_inception_from_a_local_file(sets, tmp_path, monkeypatch):
    """The inception-v3-compat path with a local weights file downloads nothing. Randomly initialised weights
    (made here; real ones cannot be fetched) exercise the plumbing, not the standard FID values."""
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

    with monkeypatch.context() as m:
        m.setattr(FeatureExtractorInceptionV3, "load_state_dict", lambda self, sd: None)
        m.setattr(torch, "load", lambda *a, **k: {})
        net = FeatureExtractorInceptionV3("inception-v3-compat", ["2048"], feature_extractor_weights_path="x")
    weights = tmp_path / "inception.pth"
    torch.save(net.state_dict(), weights)
    few = ImageSet(sets["ref"].source, files=sets["ref"].files[:6])
    other = ImageSet(sets["noise30"].source, files=sets["noise30"].files[:6])
    row = fidelity_metrics(other, few, FidelityParams(weights_path=str(weights), batch_size=6))
    assert np.isfinite(row["fid"]) and row["fid"] > 0
    assert row["fid_feature_layer"] == "2048" and row["kid_subset_size"] == 6
    assert "299x299" in row["resize_filter"] and len(row["fid_weights_sha256"]) == 64
