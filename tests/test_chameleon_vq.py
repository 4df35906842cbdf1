"""Chameleon's VQGAN from a tiny random taming-layout checkpoint written here (ddconfig ch 32, ch_mult [1, 2],
num_res_blocks 1, z_channels 8, n_embed 16, embed_dim 8: 4 x 4 codes <-> 8 x 8 px), saved as a Lightning container
with training state + vqgan.yaml and loaded unchanged: the encoder and quantiser against transformers'
ChameleonVQVAE (same key names), the decoder against a transcription of taming's forward written from the state dict,
pixels, every key checked, and the neighbour table against the authors' rule."""

import collections

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from PIL import Image

from lantern.errors import UserError
from lantern.engine.models.vqgan import VQGAN, VQGANSpec
from lantern.engine.rules import neighbours
from lantern.engine.rules.neighbours import NeighbourParams, load_neighbours, read_authors_table, save_authors_table
from lantern.io import save_torch
from lantern.worlds.chameleon import vqgan as cv

DD = {"double_z": False, "z_channels": 8, "resolution": 8, "in_channels": 3, "out_ch": 3, "ch": 32,
      "ch_mult": [1, 2], "num_res_blocks": 1, "attn_resolutions": [], "dropout": 0.0}


class TrainerState:
    """Stands for the Lightning callback classes a real checkpoint pickles (weights-only loading refuses them)."""

    def __init__(self, best):
        self.best = best


def random_state_dict(attn_resolutions=(), seed=0, n_embed=16) -> dict:
    torch.manual_seed(seed)
    spec = VQGANSpec(embed_dim=8, n_embed=n_embed, z_channels=8, ch=32, ch_mult=(1, 2), num_res_blocks=1,
                     attn_resolutions=tuple(attn_resolutions), resolution=8)
    sd = VQGAN(spec).state_dict()
    for k, v in sd.items():  # GroupNorm's ones / zeros would hide a swapped weight and bias
        v.copy_(torch.randn_like(v) * (0.3 if v.ndim > 1 else 0.5) + (1.0 if k.endswith("norm.weight") else 0.0))
    sd["quantize.embedding.weight"].normal_(0, 1.5)
    return sd


def write_vqgan(folder, sd=None, dd=None, lightning=True):
    """vqgan.ckpt (Lightning: state_dict with loss.* keys, optimizer state, a pickled class) + vqgan.yaml."""
    sd = dict(random_state_dict() if sd is None else sd)
    sd["loss.discriminator.main.0.weight"] = torch.randn(4, 3, 4, 4)
    sd["loss.perceptual_loss.scaling_layer.shift"] = torch.randn(1, 3, 1, 1)
    obj = {"state_dict": sd, "epoch": 3, "global_step": 1000, "optimizer_states": [{"state": {}}],
           "callbacks": {TrainerState: TrainerState(torch.tensor(0.5))}, "pytorch-lightning_version": "1.0.8"}
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(obj if lightning else {"state_dict": sd}, folder / "vqgan.ckpt")
    cfg = {"model": {"target": "taming.models.vqgan.VQModel",
                     "params": {"embed_dim": 8, "n_embed": len(sd.get("quantize.embedding.weight", range(16))),
                                "ddconfig": dict(DD, **(dd or {})),
                                "lossconfig": {"target": "taming.modules.losses.DummyLoss"}}}}
    (folder / "vqgan.yaml").write_text(yaml.safe_dump(cfg))
    return folder / "vqgan.ckpt"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_vqgan(tmp_path_factory.mktemp("tok"))


def test_lightning_checkpoint_is_not_weights_only_loadable_but_loads(files):
    with pytest.raises(Exception):
        torch.load(files, weights_only=True)
    model = cv.load_vqgan(files)
    sd = random_state_dict()
    assert set(model.state_dict()) == set(sd)
    assert all(torch.equal(model.state_dict()[k], sd[k]) for k in sd)


def hf_vqvae(sd, attn_resolutions=None):
    from transformers import ChameleonVQVAE, ChameleonVQVAEConfig

    cfg = ChameleonVQVAEConfig(embed_dim=8, num_embeddings=16, latent_channels=8, resolution=8, base_channels=32,
                               channel_multiplier=[1, 2], num_res_blocks=1, attn_resolutions=attn_resolutions)
    hf = ChameleonVQVAE(cfg).eval()
    own = hf.state_dict()
    # transformers keeps taming's names for the encoder, quant_conv and the codebook: the map is the identity
    assert set(own) <= set(sd) and {k for k in sd if k.startswith("decoder.")} == set(sd) - set(own)
    hf.load_state_dict({k: sd[k] for k in own}, strict=True)
    return hf


@pytest.mark.parametrize("attn", [[], [8]])  # Chameleon's (no level attention), and attention at 8 px
def test_encoder_and_quantiser_match_transformers(tmp_path, attn):
    sd = random_state_dict(attn)
    ckpt = write_vqgan(tmp_path, sd, {"attn_resolutions": attn})
    ours = cv.load_vqgan(ckpt).double()
    hf = hf_vqvae(sd, attn).double()
    x = torch.rand(3, 3, 8, 8, dtype=torch.float64) * 2 - 1
    with torch.no_grad():
        out = hf.encode(x)
        assert torch.allclose(ours.encoder(x), out.last_hidden_state, atol=1e-10)
        codes = ours.encode(x)
    assert codes.shape == (3, 4, 4)
    assert torch.equal(codes.flatten(), out.image_tokens)
    assert len(set(codes.flatten().tolist())) > 3  # the random codebook is used, not one row


def taming_decode(sd, codes, num_res_blocks=1, levels=2):
    """taming's Decoder.forward written out over the state dict: mid, then up[levels-1] ... up[0] (indexed by
    resolution, the deepest first), num_res_blocks + 1 blocks each, nearest x2 + conv after all but up[0]."""
    def gn(h, p):
        return F.group_norm(h, 32, sd[p + ".weight"], sd[p + ".bias"], eps=1e-6)

    def conv(h, p, pad):
        return F.conv2d(h, sd[p + ".weight"], sd[p + ".bias"], padding=pad)

    def resnet(h, p):
        r = conv(F.silu(gn(h, p + ".norm1")), p + ".conv1", 1)
        r = conv(F.silu(gn(r, p + ".norm2")), p + ".conv2", 1)
        return (conv(h, p + ".nin_shortcut", 0) if p + ".nin_shortcut.weight" in sd else h) + r

    def attn(h, p):
        B, C, H, W = h.shape
        n = gn(h, p + ".norm")
        q, k, v = (conv(n, f"{p}.{t}", 0).reshape(B, C, H * W) for t in "qkv")
        w = torch.softmax(torch.bmm(q.transpose(1, 2), k) * C ** -0.5, dim=2)
        return h + conv(torch.bmm(v, w.transpose(1, 2)).reshape(B, C, H, W), p + ".proj_out", 0)

    z = sd["quantize.embedding.weight"][codes].permute(0, 3, 1, 2)
    h = conv(conv(z, "post_quant_conv", 0), "decoder.conv_in", 1)
    h = resnet(attn(resnet(h, "decoder.mid.block_1"), "decoder.mid.attn_1"), "decoder.mid.block_2")
    for lvl in reversed(range(levels)):
        for j in range(num_res_blocks + 1):
            h = resnet(h, f"decoder.up.{lvl}.block.{j}")
        if lvl:
            h = conv(F.interpolate(h, scale_factor=2.0, mode="nearest"), f"decoder.up.{lvl}.upsample.conv", 1)
    return conv(F.silu(gn(h, "decoder.norm_out")), "decoder.conv_out", 1)


def test_decoder_matches_taming_forward(files):
    model = cv.load_vqgan(files).double()
    sd = {k: v.double() for k, v in random_state_dict().items()}
    codes = torch.randint(0, 16, (2, 4, 4))
    out = model.decode_code(codes)
    assert out.shape == (2, 3, 8, 8)
    assert torch.allclose(out, taming_decode(sd, codes), atol=1e-10)
    # the decoder's level order matters: the same weights run finest-first give another image
    assert {k.split(".")[2] for k in sd if k.startswith("decoder.up.")} == {"0", "1"}
    assert "decoder.up.1.upsample.conv.weight" in sd and "decoder.up.0.upsample.conv.weight" not in sd


def test_pixels_out_truncate_and_clamp():
    # (x + 1) / 2 * 255 = 127.8 -> 127 (rounding would give 128); out of range values clamp
    x = torch.tensor([127.8 / 255 * 2 - 1, 1.7, -3.0, 1.0, -1.0, 0.999]).view(1, 1, 2, 3).expand(1, 3, 2, 3)
    px = cv.to_uint8(x)
    assert px.dtype == torch.uint8 and px.shape == (1, 2, 3, 3)
    assert px[0, :, :, 0].flatten().tolist() == [127, 255, 0, 255, 0, 254]
    assert round(127.8) == 128  # the case rounding treats differently


def test_decode_and_encode_round_trip_shapes(files):
    model = cv.load_vqgan(files)
    codes = torch.randint(0, 16, (2, 16))  # flat square grids, as generation produces them
    images = cv.decode_codes(model, codes)
    assert images.shape == (2, 8, 8, 3) and images.dtype == torch.uint8
    pil = [Image.fromarray(im.numpy()) for im in images]
    back = cv.encode_images(model, pil)
    assert back.shape == (2, 4, 4) and back.dtype == torch.int64
    assert torch.equal(back, model.encode(torch.stack([cv.pixels_in(p) for p in pil])))
    with pytest.raises(ValueError, match="0..15"):
        cv.decode_codes(model, torch.full((1, 4, 4), 16))
    with pytest.raises(ValueError, match="stride"):
        cv.encode_images(model, [Image.new("RGB", (9, 8))])  # stride 2 here


def test_pixels_in_composite_on_white():
    rgba = np.zeros((2, 2, 4), np.uint8)
    rgba[0, 0] = (0, 0, 0, 0)        # fully transparent black: white
    rgba[0, 1] = (10, 20, 30, 255)   # opaque: itself
    rgba[1, 0] = (0, 0, 0, 128)      # half: (1 - 128/255) * 255, truncated
    rgba[1, 1] = (200, 100, 0, 255)
    x = cv.pixels_in(Image.fromarray(rgba, "RGBA"))
    assert x.shape == (3, 2, 2) and x.dtype == torch.float32
    assert torch.equal(x[:, 0, 0], torch.ones(3))
    assert torch.allclose(x[:, 0, 1], torch.tensor([10, 20, 30]) / 255 * 2 - 1)
    half = int((1 - 128 / 255) * 255)
    assert torch.allclose(x[:, 1, 0], torch.full((3,), half / 255 * 2 - 1))
    rgb = cv.pixels_in(Image.fromarray(rgba[..., :3].copy(), "RGB"))  # RGB: no compositing
    assert torch.allclose(rgb[:, 0, 0], -torch.ones(3))


@pytest.mark.parametrize("edit, match", [
    (lambda sd: sd.pop("decoder.conv_out.weight"), "lacks decoder.conv_out.weight"),
    (lambda sd: sd.pop("quantize.embedding.weight"), "lacks quantize.embedding.weight"),
    (lambda sd: sd.__setitem__("quant_conv.weight", torch.randn(8, 8, 3, 3)), r"quant_conv.weight is \(8, 8, 3, 3\)"),
    (lambda sd: sd.__setitem__("encoder.down.0.attn.0.q.weight", torch.randn(32, 32, 1, 1)),
     "has encoder.down.0.attn.0.q.weight"),
])
def test_every_bad_key_is_one_line_naming_file_and_key(tmp_path, edit, match):
    sd = random_state_dict()
    edit(sd)
    ckpt = write_vqgan(tmp_path, sd)
    with pytest.raises(UserError, match=match) as e:
        cv.load_vqgan(ckpt)
    assert str(ckpt) in str(e.value) and "\n" not in str(e.value)


def test_missing_files_and_bad_yaml(tmp_path, files):
    with pytest.raises(UserError, match="does not exist"):
        cv.load_vqgan(tmp_path / "none" / "vqgan.ckpt", files.with_name("vqgan.yaml"))
    with pytest.raises(UserError, match="vqgan.yaml does not exist"):
        cv.load_vqgan(files, tmp_path / "vqgan.yaml")
    bad = write_vqgan(tmp_path / "b", dd={"ch_mult": [1, 4]})
    with pytest.raises(UserError, match=r"encoder.* is \(.*\) but .*vqgan.yaml implies"):
        cv.load_vqgan(bad)
    for dd, match in [({"num_res_blocks": 0}, "num_res_blocks"), ({"ch": 20}, "multiple of 32"),
                      ({"double_z": True}, "double_z")]:
        write_vqgan(tmp_path / "c", dd=dd)
        with pytest.raises(UserError, match=match):
            cv.load_vqgan(tmp_path / "c" / "vqgan.ckpt")
    (tmp_path / "c" / "vqgan.ckpt").write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match="unreadable"):
        cv.read_vqgan(tmp_path / "c" / "vqgan.ckpt", files.with_name("vqgan.yaml"))


def authors_rule(cb: torch.Tensor) -> torch.Tensor:
    """LANTERN's generate_codebook.py, transcribed: cdist p 2 on raw rows, diagonal inf, N - 1 smallest ascending."""
    d = torch.cdist(cb, cb, p=2)
    d.fill_diagonal_(float("inf"))
    return torch.topk(d, cb.shape[0] - 1, dim=1, largest=False, sorted=True).indices


def test_neighbour_table_follows_the_authors_rule(files, tmp_path, capsys):
    cb = cv.read_codebook(files)
    d = torch.cdist(cb.double(), cb.double())
    gaps = (d.sort(dim=1).values[:, 1:].diff(dim=1)).abs()
    assert gaps[:, 1:].min() > 1e-4  # tie-free, so any correct order is the one order
    table = cv.build_neighbour_table(files, NeighbourParams(k=15))
    assert torch.equal(table["neighbours"].long(), authors_rule(cb))
    assert table["meta"]["metric"] == "l2" and table["neighbours"].dtype == torch.int16
    # the same table through `lantern neighbours --vq vqgan.ckpt`, read by the rules' loader
    out = tmp_path / "l2_K15.pt"
    neighbours.main(["--vq", str(files), "--out", str(out), "--params", '{"k": 15}'])
    assert torch.equal(load_neighbours(out, neighbours.read_codebook(files), 10).long(), authors_rule(cb)[:, :10])
    # the authors' uint16 file, both ways
    npy = tmp_path / "top_15_indices.npy"
    save_authors_table(table["neighbours"], npy)
    assert np.load(npy).dtype == np.uint16
    back = read_authors_table(npy, cb)
    assert torch.equal(back["neighbours"], table["neighbours"]) and back["meta"]["codebook_sha256"] == \
        table["meta"]["codebook_sha256"]
    save_torch(back, tmp_path / "authors.pt")
    assert torch.equal(load_neighbours(tmp_path / "authors.pt", cb, 15), table["neighbours"])
    with pytest.raises(UserError, match="another codebook"):
        load_neighbours(tmp_path / "authors.pt", cb + 1, 15)
    # the CLI both ways: --authors-out writes their file, --from-authors reads it into ours
    neighbours.main(["--vq", str(files), "--out", str(out), "--params", '{"k": 15}', "--authors-out",
                     str(tmp_path / "cli.npy")])
    assert np.array_equal(np.load(tmp_path / "cli.npy"), table["neighbours"].numpy().astype(np.uint16))
    neighbours.main(["--vq", str(files), "--out", str(tmp_path / "from.pt"), "--from-authors", str(npy)])
    assert torch.equal(load_neighbours(tmp_path / "from.pt", cb, 15), table["neighbours"])
    np.save(npy, np.tile(np.arange(15, dtype=np.uint16), (16, 1)))  # row 0 names code 0
    with pytest.raises(UserError, match="its own neighbour"):
        read_authors_table(npy, cb)


def test_inert_objects_stand_in_for_foreign_classes(tmp_path):
    # nothing but tensors and plain containers is rebuilt from a Lightning file; other classes come back inert
    path = tmp_path / "x.ckpt"
    torch.save({"state_dict": collections.OrderedDict(w=torch.ones(2)), "cb": {TrainerState: TrainerState(1)}}, path)
    from lantern.engine.models.vqgan import read_lightning_state_dict

    assert list(read_lightning_state_dict(path)) == ["w"]


def test_chameleon_shapes_hold_transformers_encoder_keys():
    """At Chameleon's own ddconfig (transformers' defaults: 5 levels, 2 blocks, 8192 x 256 codes), every key and
    shape of transformers' VQ encoder is ours; the rest of ours is the decoder, which transformers lacks."""
    from transformers import ChameleonVQVAE, ChameleonVQVAEConfig

    spec = VQGANSpec(embed_dim=256, n_embed=8192, z_channels=256, ch=128, ch_mult=(1, 1, 2, 2, 4), num_res_blocks=2,
                     resolution=512)
    with torch.device("meta"):
        ours, hf = VQGAN(spec).state_dict(), ChameleonVQVAE(ChameleonVQVAEConfig()).state_dict()
    assert {k: tuple(v.shape) for k, v in hf.items()} == {k: tuple(ours[k].shape) for k in hf}
    assert {k.split(".")[0] for k in set(ours) - set(hf)} == {"decoder"}
    assert ours["decoder.up.4.block.0.conv1.weight"].shape == (512, 512, 3, 3)  # up.4: the deepest, widest level
    assert ours["decoder.up.0.block.2.conv2.weight"].shape == (128, 128, 3, 3)
