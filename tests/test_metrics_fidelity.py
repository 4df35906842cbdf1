"""FID / KID / precision-recall through torch-fidelity: values, reference cache, the weights-file rules, reference
statistics, the resize + centre crop, and precision/recall on VGG16."""

import hashlib

import numpy as np
import pytest
import torch
import torch_fidelity
import torchvision
from PIL import Image
from torch_fidelity import FeatureExtractorBase

from lantern.errors import UserError
from lantern.metrics import fidelity
from lantern.metrics.fidelity import FidelityParams, fidelity_metrics, register_extractor
from lantern.metrics.images import ImageSet, ResizeCentreCrop
from lantern.metrics.reference import load_reference


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
    assert files and all(f.startswith(f"ref-{first['reference_sha256'][:16]}-wnone-r32x32-test-tiny") for f in files)
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


@pytest.fixture(scope="module")
def inception_weights(tmp_path_factory):
    """inception-v3-compat weights in torch-fidelity's layout (a strict state dict), randomly initialised: real ones
    cannot be fetched here, so these exercise the plumbing, not the standard FID values."""
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

    with pytest.MonkeyPatch.context() as m:
        m.setattr(FeatureExtractorInceptionV3, "load_state_dict", lambda self, sd: None)
        m.setattr(torch, "load", lambda *a, **k: {})
        net = FeatureExtractorInceptionV3("inception-v3-compat", ["2048"], feature_extractor_weights_path="x")
    weights = tmp_path_factory.mktemp("inception") / "inception.pth"
    torch.save(net.state_dict(), weights)
    return weights


def first(images: ImageSet, n: int) -> ImageSet:
    return ImageSet(images.source, files=images.files[:n])


@pytest.mark.slow  # one 2048-d FID: its eigendecomposition alone takes 10-30 s on 2 busy cores
def test_inception_from_a_local_file(sets, inception_weights, tmp_path):
    few, other = first(sets["ref"], 6), first(sets["noise30"], 6)
    p = FidelityParams(weights_path=str(inception_weights), batch_size=6)
    row = fidelity_metrics(other, few, p)
    assert np.isfinite(row["fid"]) and row["fid"] > 0
    assert row["fid_feature_layer"] == "2048" and row["kid_subset_size"] == 6
    assert "299x299" in row["fid_input_resize"] and len(row["fid_weights_sha256"]) == 64
    np.savez(tmp_path / "short.npz", mu=np.zeros(64), sigma=np.eye(64))
    with pytest.raises(UserError, match="mu has 64 dims but inception-v3-compat 2048 features have 2048"):
        fidelity_metrics(other, load_reference(tmp_path / "short.npz"), p)


def test_fid_against_statistics_equals_fid_against_images(sets, tmp_path, monkeypatch):
    """FID against an .npz of the reference's (mu, sigma) equals FID against its images, and the row says KID and
    precision/recall were skipped. The tiny extractor stands in for Inception (a 2048-d FID costs a minute here)."""
    from torch_fidelity.metric_fid import fid_input_id_to_statistics
    from torch_fidelity.utils import create_feature_extractor

    monkeypatch.setattr(fidelity, "STATISTICS_EXTRACTOR", "test-tiny")
    net = create_feature_extractor("test-tiny", ["tiny"], cuda=False, verbose=False)
    stats = fid_input_id_to_statistics(2, net, "tiny", input2=sets["ref"].dataset(), cuda=False, cache=False,
                                       save_cpu_ram=True, verbose=False)
    npz = tmp_path / "VIRTUAL_ref.npz"  # the ADM layout: statistics beside (unread) reference images
    np.savez(npz, mu=stats["mu"].astype(np.float64), sigma=stats["sigma"], arr_0=np.zeros((2, 4, 4, 3), np.uint8))
    vs_images = fidelity_metrics(sets["noise10"], sets["ref"], P)
    p = FidelityParams(extractor="test-tiny", vgg16_weights=str(tmp_path / "unused.pth"))
    vs_stats = fidelity_metrics(sets["noise10"], load_reference(npz), p)
    print(f"FID vs images {vs_images['fid']:.8f}, vs their statistics {vs_stats['fid']:.8f}")
    assert vs_stats["fid"] == pytest.approx(vs_images["fid"], rel=1e-5) and vs_stats["fid"] > 1e-4
    assert vs_stats["reference_kind"] == "FID statistics (mu, sigma)" and vs_stats["n_reference"] is None
    assert vs_stats["reference_sha256"] == hashlib.sha256(npz.read_bytes()).hexdigest()
    assert all(vs_stats[k] is None for k in ("kid_mean", "precision", "recall", "prc_extractor"))
    assert vs_stats["fidelity_skipped"].startswith("kid, precision, recall") and vs_images["fidelity_skipped"] == "none"
    assert vs_stats["fid_reference_features"].startswith("precomputed 27-d mu/sigma")


def test_statistics_reference_errors(sets, tmp_path):
    np.savez(tmp_path / "images.npz", arr_0=np.zeros((2, 4, 4, 3), np.uint8))
    with pytest.raises(UserError, match="has no mu and sigma arrays \\(it holds arr_0\\)"):
        load_reference(tmp_path / "images.npz")
    np.savez(tmp_path / "skew.npz", mu=np.zeros(4), sigma=np.zeros((4, 3)))
    with pytest.raises(UserError, match="mu must be \\[D\\] and sigma \\[D, D\\]"):
        load_reference(tmp_path / "skew.npz")
    (tmp_path / "text.npz").write_text("mu sigma")
    with pytest.raises(UserError, match="is not an .npz archive"):
        load_reference(tmp_path / "text.npz")
    np.savez(tmp_path / "ok.npz", mu=np.zeros(27), sigma=np.eye(27))
    with pytest.raises(UserError, match="come from the TF Inception: set fidelity.extractor: inception-v3-compat"):
        fidelity_metrics(sets["ref"], load_reference(tmp_path / "ok.npz"), P)


def test_resize_short_side_then_centre_crop():
    half = np.zeros((20, 60, 3), np.uint8)
    half[:, :30] = (255, 0, 0)
    half[:, 30:] = (0, 0, 255)
    out = np.asarray(ResizeCentreCrop(10, "lanczos")(Image.fromarray(half)))
    assert out.shape == (10, 10, 3)  # 60x20 -> 30x10 -> the middle 10 columns, which straddle the colour edge
    assert (out[:, :2] == (255, 0, 0)).all() and (out[:, 8:] == (0, 0, 255)).all()  # lanczos rings near it
    noise = Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 48, 3), dtype=np.uint8))
    assert np.array_equal(np.asarray(ResizeCentreCrop(48, "lanczos")(noise)), np.asarray(noise))  # already there
    by = {f: np.asarray(ResizeCentreCrop(20, f)(noise)) for f in ("lanczos", "bicubic", "bilinear")}
    assert not np.array_equal(by["lanczos"], by["bicubic"]) and not np.array_equal(by["bicubic"], by["bilinear"])
    with pytest.raises(UserError, match="fidelity.resize_filter = 'box' must be one of lanczos, bicubic, bilinear"):
        FidelityParams(resize_filter="box")


def test_files_and_tensors_get_the_same_resize(sets, tmp_path):
    stored = torch.from_numpy(blobs(5, 0))
    for resolution, resize_filter in ((0, "lanczos"), (20, "lanczos"), (20, "bilinear")):
        files = first(sets["ref"], 5).dataset(resolution, resize_filter)
        tensors = ImageSet("t", images=stored).dataset(resolution, resize_filter)
        assert all(torch.equal(files[i], tensors[i]) for i in range(5))
    assert files[0].shape == (3, 20, 20) and files[0].dtype == torch.uint8


def test_resolution_and_filter_are_recorded_and_key_the_cache(sets, tmp_path):
    p = FidelityParams(extractor="test-tiny", kid_subset_size=50, cache_dir=str(tmp_path), resolution=24,
                       resize_filter="bicubic")
    row = fidelity_metrics(sets["noise10"], sets["ref"], p)
    assert (row["resolution"], row["resize_filter"], row["crop"]) == ("24x24", "PIL bicubic", "centre 24x24")
    assert row["reference_kind"] == "image folder" and row["n_reference"] == 120
    as_stored = fidelity_metrics(sets["noise10"], sets["ref"], P)
    assert (as_stored["resize_filter"], as_stored["crop"]) == ("none", "none") and as_stored["fid"] != row["fid"]
    lanczos = FidelityParams(extractor="test-tiny", kid_subset_size=50, cache_dir=str(tmp_path), resolution=24)
    assert fidelity_metrics(sets["noise10"], sets["ref"], lanczos)["fid"] != row["fid"]
    names = {f.name.split("-test-tiny")[0] for f in tmp_path.iterdir()}
    assert {n.rsplit("-", 2)[-2:][0] + "-" + n.rsplit("-", 1)[-1] for n in names} == {"r24x24-bicubic",
                                                                                       "r24x24-lanczos"}


def test_reference_folder_is_searched_recursively(tmp_path):
    images = blobs(4, 2)
    for i, im in enumerate(images):
        (tmp_path / "ref" / f"n0{i % 2}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(im.transpose(1, 2, 0)).save(tmp_path / "ref" / f"n0{i % 2}" / f"val_{i}.JPEG", quality=95)
    ref = load_reference(tmp_path / "ref")
    assert len(ref) == 4 and ref.kind == "image folder"
    assert sorted(ref.names) == sorted(f"n0{i % 2}/val_{i}.JPEG" for i in range(4))
    with pytest.raises(UserError, match="holds no images"):
        ImageSet.from_folders([tmp_path / "ref"], "generated images")  # generated shards are not searched deep


class TinyVGG(torch.nn.Module):
    """torchvision's VGG layout (features, classifier[0..6]) at a tiny size: torch-fidelity's vgg16 extractor builds
    torchvision.models.vgg16(), loads the state dict strictly and drops classifier[4:], keeping fc2."""

    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 7, stride=8), torch.nn.ReLU(),
                                            torch.nn.AdaptiveAvgPool2d(2))
        self.classifier = torch.nn.Sequential(torch.nn.Linear(32, 24), torch.nn.ReLU(), torch.nn.Dropout(),
                                              torch.nn.Linear(24, 24), torch.nn.ReLU(), torch.nn.Dropout(),
                                              torch.nn.Linear(24, 10))

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


@pytest.fixture
def tiny_vgg16(tmp_path, monkeypatch):
    torch.manual_seed(0)
    weights = tmp_path / "vgg16-tiny.pth"
    torch.save(TinyVGG().state_dict(), weights)
    monkeypatch.setattr(torchvision.models, "vgg16", TinyVGG)
    return weights


def test_precision_recall_with_vgg16_weights(sets, tiny_vgg16):
    p = FidelityParams(extractor="test-tiny", kid_subset_size=50, vgg16_weights=str(tiny_vgg16))
    row = fidelity_metrics(sets["noise30"], sets["ref"], p)
    theirs = torch_fidelity.calculate_metrics(
        input1=sets["noise30"].dataset(), input2=sets["ref"].dataset(), feature_extractor="vgg16", prc=True,
        feature_extractor_weights_path=str(tiny_vgg16), cuda=False, verbose=False, save_cpu_ram=True)
    tiny_only = fidelity_metrics(sets["noise30"], sets["ref"], P)
    print(f"precision/recall: VGG16 (tiny, random) {row['precision']:.3f}/{row['recall']:.3f}, "
          f"test-tiny {tiny_only['precision']:.3f}/{tiny_only['recall']:.3f}")
    assert (row["precision"], row["recall"]) == (theirs["precision"], theirs["recall"])
    assert row["fid"] == tiny_only["fid"] and row["kid_mean"] == tiny_only["kid_mean"]
    assert (row["prc_extractor"], row["prc_feature_layer"]) == ("vgg16", "fc2_relu")
    assert row["prc_weights_sha256"] == hashlib.sha256(tiny_vgg16.read_bytes()).hexdigest()
    assert "224x224" in row["prc_input_resize"] and tiny_only["prc_extractor"] == "test-tiny"
    tiny_vgg16.write_bytes(b"not a state dict")
    with pytest.raises(UserError, match="cannot load vgg16 weights from .*fidelity.vgg16_weights"):
        fidelity_metrics(sets["noise30"], sets["ref"], p)
    with pytest.raises(UserError, match="vgg16 weights not found at .*fidelity.vgg16_weights"):
        fidelity_metrics(sets["noise30"], sets["ref"], FidelityParams(extractor="test-tiny", vgg16_weights="/no.pth"))
