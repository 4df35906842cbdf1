"""The toy CLIP (open_clip classes, ClipLoss): it learns the toy captions, reloads through open_clip, scores
matching captions above shuffled ones, and serves as a torch-fidelity feature extractor."""

import json

import pytest
import torch

from lantern.data import make_dataset
from lantern.errors import UserError
from lantern.metrics import train_clip
from lantern.metrics.clip import clip_scores, load_clip
from lantern.metrics.fidelity import FidelityParams, fidelity_metrics
from lantern.metrics.images import ImageSet

# a smaller tower than the default, and a short run: the test needs "well above chance", not the real model
FAST = dict(image_tower="vit", patch_size=8, vision_width=64, vision_layers=2, text_layers=1, steps=60, batch_size=64,
            n_val=200, lr=2e-3)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small matmuls: one thread is as fast, and immune to a busy second core
    torch.manual_seed(0)
    data = make_dataset(1200, seed=0)
    p = train_clip.TrainClipParams(**FAST)
    cfg = train_clip.model_config(p, 32)
    net, tok = train_clip.build(cfg, "toyclip")
    n = 1000
    train_clip.train(net, tok, data["images"][:n], data["captions"][:n], data["labels"][:n], p, progress=False)
    out = tmp_path_factory.mktemp("clip") / "toyclip.pt"
    train_clip.save(net, cfg, out)
    yield out, data, n, p
    torch.set_num_threads(threads)


def test_retrieval_on_held_out_images_is_far_above_chance(trained):
    out, data, n, p = trained
    net, tok = load_clip("", str(out))  # reloaded through open_clip from the saved file
    acc = train_clip.retrieval_top1(net, tok, data["images"][n:], data["captions"][n:], p.prompt_prefix)
    print(f"held-out image->caption top-1 in groups of 100: {acc:.2f} (chance 0.01)")
    assert acc >= 0.15


def test_clip_score_matching_above_shuffled(trained):
    out, data, n, p = trained
    net, tok = load_clip("", str(out))
    images, caps = data["images"][n:], data["captions"][n:]
    match = clip_scores(net, tok, images, caps, batch_size=64).mean().item()
    shuffled = clip_scores(net, tok, images, caps[7:] + caps[:7], batch_size=64).mean().item()
    print(f"CLIP score (100 * max(cos, 0)) matching {match:.1f}, shuffled captions {shuffled:.1f}")
    assert match > shuffled + 10


def test_reload_gives_identical_embeddings(trained):
    out, data, _, _ = trained
    a, tok = load_clip("", str(out))
    b, _ = load_clip("", str(out))
    x = data["images"][:4]
    assert torch.equal(clip_scores(a, tok, x, data["captions"][:4]), clip_scores(b, tok, x, data["captions"][:4]))
    assert json.loads(out.with_suffix(".json").read_text())["vision_cfg"]["image_size"] == 32


def test_toy_clip_as_fid_extractor(trained, tmp_path):
    out, data, n, _ = trained
    ref = ImageSet("ref", images=data["images"][:100])
    held = ImageSet("held", images=data["images"][n : n + 100])
    flat = ImageSet("flat", images=data["images"][n : n + 100].float().mean((2, 3), keepdim=True)
                    .expand(-1, -1, 32, 32).round().to(torch.uint8).contiguous())
    p = FidelityParams(extractor="toyclip", weights_path=str(out), kid_subset_size=100)
    real, blank = fidelity_metrics(held, ref, p), fidelity_metrics(flat, ref, p)
    print(f"toy-CLIP FD: held-out real {real['fid']:.4f}, shapeless {blank['fid']:.4f}")
    assert real["fid"] < blank["fid"] and real["fid_extractor"] == "toyclip"


def test_missing_clip_weights_or_config_is_a_clear_error(trained, tmp_path):
    with pytest.raises(UserError, match=r"CLIP weights not found at .*nope\.pt.*clip\.weights_path"):
        load_clip("ViT-B-32", str(tmp_path / "nope.pt"))
    with pytest.raises(UserError, match="clip.weights_path is empty"):
        load_clip("ViT-B-32", "")
    lonely = tmp_path / "lonely.pt"
    lonely.write_bytes(trained[0].read_bytes())
    with pytest.raises(UserError, match="toy CLIP config .*lonely.json is missing"):
        load_clip("", str(lonely))
    with pytest.raises(UserError, match="cannot load .* as open_clip ViT-B-32"):
        load_clip("ViT-B-32", str(trained[0]))  # toy weights into the real architecture
    with pytest.raises(UserError, match="toyclip weights not found"):
        fidelity_metrics(ImageSet("a", images=torch.zeros(2, 3, 32, 32, dtype=torch.uint8)),
                         ImageSet("b", images=torch.zeros(2, 3, 32, 32, dtype=torch.uint8)),
                         FidelityParams(extractor="toyclip", weights_path=str(tmp_path / "gone.pt")))


def test_train_clip_cli_with_vq_reconstructions(tmp_path, capsys):
    """The CLI end to end with a (random, tiny) VQ: reconstructions are made and trained on; outputs appear."""
    import dataclasses

    from lantern.checkpoint import save_checkpoint
    from lantern.train_vq import VQParams
    from lantern.vq import VQModel

    args = VQParams().vq_args()
    save_checkpoint(tmp_path / "vq.pt", VQModel(args), args=dataclasses.asdict(args))
    data = make_dataset(300, seed=1)
    torch.save(data, tmp_path / "data.pt")
    params = dict(steps=3, batch_size=64, n_val=100)  # the default (ResNet) tower
    train_clip.main(["--data", str(tmp_path / "data.pt"), "--vq", str(tmp_path / "vq.pt"),
                     "--out", str(tmp_path / "c.pt"), "--params", json.dumps(params)])
    metrics = json.loads((tmp_path / "c.metrics.json").read_text())
    assert metrics["vq"] and metrics["val_top1_recon"] is not None and metrics["n_train"] == 200
    assert (tmp_path / "c.json").is_file() and (tmp_path / "c.pt").is_file()
    with pytest.raises(UserError, match="unknown key bogus"):
        train_clip.main(["--data", str(tmp_path / "data.pt"), "--out", str(tmp_path / "d.pt"),
                         "--params", "{bogus: 1}"])
