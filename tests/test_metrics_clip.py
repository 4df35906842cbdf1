"""The toy CLIP (open_clip classes, ClipLoss): it learns the toy captions, reloads through open_clip, scores
matching captions above shuffled ones, and serves as a torch-fidelity feature extractor. Published CLIPs: local files
in every layout open_clip reads (a tiny custom architecture stands in for ViT-B-32-quickgelu)."""

import json

import open_clip
import pytest
import torch

from lantern.worlds.toy.data import make_dataset
from lantern.errors import UserError
from lantern.metrics import train_clip
from lantern.metrics.clip import ClipScoreParams, clip_cosines, clip_score, load_clip, weights_format
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
    match = clip_score(clip_cosines(net, tok, images, caps, batch_size=64)).mean().item()
    shuffled = clip_score(clip_cosines(net, tok, images, caps[7:] + caps[:7], batch_size=64)).mean().item()
    print(f"CLIP score (100 * max(cos, 0)) matching {match:.1f}, shuffled captions {shuffled:.1f}")
    assert match > shuffled + 10


def test_reload_gives_identical_embeddings(trained):
    out, data, _, _ = trained
    a, tok = load_clip("", str(out))
    b, _ = load_clip("", str(out))
    x = data["images"][:4]
    assert torch.equal(clip_cosines(a, tok, x, data["captions"][:4]), clip_cosines(b, tok, x, data["captions"][:4]))
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

    from lantern.engine.models.checkpoint import save_checkpoint
    from lantern.worlds.toy.train_vq import VQParams
    from lantern.engine.models.vq import VQModel

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


def tiny_config(folder, name, quick_gelu):
    """A ViT CLIP small enough for CI, registered with open_clip under `name` (the file's stem)."""
    cfg = {"embed_dim": 16, "quick_gelu": quick_gelu,
           "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 16, "head_width": 16},
           "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1}}
    path = folder / f"{name}.json"
    path.write_text(json.dumps(cfg))
    open_clip.add_model_config(path)


class OpenAIArchive(torch.nn.Module):
    """The top-level names of OpenAI's released CLIP TorchScript files (those open_clip's CLIP uses too), plus the
    scalar tensors open_clip drops when it reads one; open_clip's own causal-mask buffer is left out, as theirs has
    none."""

    def __init__(self, net):
        super().__init__()
        for name in ("visual", "transformer", "token_embedding", "ln_final"):
            setattr(self, name, getattr(net, name))
        for name in ("positional_embedding", "text_projection", "logit_scale"):
            setattr(self, name, getattr(net, name))
        for name, value in (("input_resolution", 32), ("context_length", 77), ("vocab_size", 49408)):
            self.register_buffer(name, torch.tensor(value))

    def forward(self, image):
        return self.visual(image)


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tinyclip")
    tiny_config(folder, "lantern-test-tiny-quickgelu", True)
    tiny_config(folder, "lantern-test-tiny", False)
    torch.manual_seed(0)
    net = open_clip.create_model("lantern-test-tiny-quickgelu").eval()
    return folder, net


def layouts(folder, net):
    """The same weights in every local-file layout open_clip 3.3's create_model(pretrained=<file>) reads."""
    from safetensors.torch import save_file

    sd = net.state_dict()
    torch.save(sd, folder / "state_dict.pt")
    torch.save({"epoch": 3, "state_dict": {f"module.{k}": v for k, v in sd.items()}}, folder / "training.pt")
    save_file({k: v.contiguous() for k, v in sd.items()}, folder / "weights.safetensors")
    torch.jit.save(torch.jit.script(OpenAIArchive(net)), folder / "openai.pt")
    return {"state_dict.pt": "state dict", "training.pt": "state dict", "weights.safetensors": "safetensors",
            "openai.pt": "TorchScript archive"}


def test_local_clip_files_in_every_layout_load_identically(tiny_clip):
    folder, net = tiny_clip
    images = torch.randint(0, 256, (3, 3, 32, 32), dtype=torch.uint8)
    captions = ["a red circle", "a blue star", "an orange ring"]
    tok = open_clip.get_tokenizer("lantern-test-tiny-quickgelu")
    want = clip_cosines(net, tok, images, captions)
    for file, layout in layouts(folder, net).items():
        assert weights_format(folder / file) == layout, file
        loaded, tokenizer = load_clip("lantern-test-tiny-quickgelu", str(folder / file))
        assert torch.equal(clip_cosines(loaded, tokenizer, images, captions), want), file
    with pytest.raises(UserError, match="TorchScript CLIP .* uses GELU: set clip.model to its -quickgelu variant"):
        load_clip("lantern-test-tiny", str(folder / "openai.pt"))
    with pytest.raises(UserError, match="cannot load .*state_dict.pt as open_clip lantern-test-tiny-quickgelu"):
        torch.save({"visual.proj": torch.zeros(2)}, folder / "state_dict.pt")
        load_clip("lantern-test-tiny-quickgelu", str(folder / "state_dict.pt"))


def test_clip_score_and_raw_cosine():
    cos = torch.tensor([0.31, -0.05, 0.0])
    assert torch.allclose(clip_score(cos), torch.tensor([31.0, 0.0, 0.0]))
    # OpenAI's ViT-B/32 release is the QuickGELU architecture: the default must name it, and open_clip must know it
    assert ClipScoreParams().model == "ViT-B-32-quickgelu" in open_clip.list_models()
    assert open_clip.get_model_config("ViT-B-32-quickgelu")["quick_gelu"] is True
