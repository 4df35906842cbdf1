import dataclasses

import pytest
import torch
import torch.nn.functional as F

from lantern.engine.models.checkpoint import save_checkpoint
from lantern.errors import UserError
from lantern.worlds.toy.train_vq import VQParams, restart_dead_codes
from lantern.engine.models.vq import VQ_CONFIGS, VQModel
from lantern.worlds.llamagen.upstream import load_vq

# ---- the VQ-16 state dict as listed in shared/reference/llamagen-format.md, spelled out by hand ----------------


def conv(p, cout, cin, k):
    return {f"{p}.weight": (cout, cin, k, k), f"{p}.bias": (cout,)}


def norm(p, c):
    return {f"{p}.weight": (c,), f"{p}.bias": (c,)}


def res(p, cin, cout):
    d = {**norm(f"{p}.norm1", cin), **conv(f"{p}.conv1", cout, cin, 3), **norm(f"{p}.norm2", cout),
         **conv(f"{p}.conv2", cout, cout, 3)}
    if cin != cout:
        d.update(conv(f"{p}.nin_shortcut", cout, cin, 1))
    return d


def attn(p, c):
    return {**norm(f"{p}.norm", c), **{k: v for n in ("q", "k", "v", "proj_out") for k, v in conv(f"{p}.{n}", c, c, 1).items()}}


def vq16_expected() -> dict:
    e = {}
    e.update(conv("encoder.conv_in", 128, 3, 3))
    # ch 128, ch_mult (1, 1, 2, 2, 4): level widths 128, 128, 256, 256, 512; 2 res blocks per level
    enc = [(128, 128), (128, 128), (128, 256), (256, 256), (256, 512)]
    for lvl, (cin, cout) in enumerate(enc):
        e.update(res(f"encoder.conv_blocks.{lvl}.res.0", cin, cout))
        e.update(res(f"encoder.conv_blocks.{lvl}.res.1", cout, cout))
        if lvl < 4:
            e.update(conv(f"encoder.conv_blocks.{lvl}.downsample.conv", cout, cout, 3))
    e.update(attn("encoder.conv_blocks.4.attn.0", 512))
    e.update(attn("encoder.conv_blocks.4.attn.1", 512))
    for side in ("encoder", "decoder"):
        e.update(res(f"{side}.mid.0", 512, 512))
        e.update(attn(f"{side}.mid.1", 512))
        e.update(res(f"{side}.mid.2", 512, 512))
    e.update(norm("encoder.norm_out", 512))
    e.update(conv("encoder.conv_out", 256, 512, 3))
    e.update(conv("decoder.conv_in", 512, 256, 3))
    # decoder block 0 is the deepest; 3 res blocks per level, attention in block 0
    dec = [(512, 512), (512, 256), (256, 256), (256, 128), (128, 128)]
    for lvl, (cin, cout) in enumerate(dec):
        e.update(res(f"decoder.conv_blocks.{lvl}.res.0", cin, cout))
        e.update(res(f"decoder.conv_blocks.{lvl}.res.1", cout, cout))
        e.update(res(f"decoder.conv_blocks.{lvl}.res.2", cout, cout))
        if lvl < 4:
            e.update(conv(f"decoder.conv_blocks.{lvl}.upsample.conv", cout, cout, 3))
    for j in range(3):
        e.update(attn(f"decoder.conv_blocks.0.attn.{j}", 512))
    e.update(norm("decoder.norm_out", 128))
    e.update(conv("decoder.conv_out", 3, 128, 3))
    e.update(conv("quant_conv", 8, 256, 1))
    e.update(conv("post_quant_conv", 256, 8, 1))
    e["quantize.embedding.weight"] = (16384, 8)
    e["quantize.codebook_used"] = (65536,)
    return e


def test_vq16_state_dict_matches_upstream_on_meta():
    with torch.device("meta"):
        model = VQModel(VQ_CONFIGS["VQ-16"])
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    expected = vq16_expected()
    assert set(got) - set(expected) == set() and set(expected) - set(got) == set()
    assert got == expected
    assert all(v.device.type == "meta" for v in model.state_dict().values())
    # about 288 MB in fp32, as the published file
    assert 280e6 < 4 * sum(torch.Size(s).numel() for s in got.values()) < 295e6
    assert model.args.downsample == 16


@pytest.fixture(scope="module")
def toy():
    torch.manual_seed(0)
    return VQModel(VQParams().vq_args()).eval()


def test_toy_encode_decode_shapes(toy):
    x = torch.rand(3, 3, 32, 32) * 2 - 1
    idx = toy.encode(x)
    assert idx.shape == (3, 64) and idx.dtype == torch.long
    assert 0 <= idx.min() and idx.max() < 512
    with torch.no_grad():
        out = toy.decode_code(idx)
        out2 = toy.decode_code(idx, shape=(3, 8, 8, 8))
    assert out.shape == (3, 3, 32, 32)
    torch.testing.assert_close(out, out2)
    with pytest.raises(ValueError, match="square"):
        toy.quantize.get_codebook_entry(idx[:, :60])


def test_matching_is_on_l2_normalised_vectors(toy):
    with torch.no_grad():
        z = toy.quant_conv(toy.encoder(torch.rand(2, 3, 32, 32) * 2 - 1)).permute(0, 2, 3, 1).reshape(-1, 8)
    cos = F.normalize(z, dim=-1) @ F.normalize(toy.quantize.embedding.weight, dim=-1).t()
    idx = toy.encode(torch.zeros(0, 3, 32, 32))  # empty batch still works
    assert idx.shape == (0, 64)
    torch.testing.assert_close(toy.quantize.nearest(F.normalize(z, dim=-1)), cos.argmax(-1))
    # decoding uses the normalised rows
    row = toy.quantize.get_codebook_entry(torch.tensor([[5]]), shape=(1, 8, 1, 1)).flatten()
    torch.testing.assert_close(row.norm(), torch.tensor(1.0))


def test_codebook_used_buffer_records_training_codes():
    torch.manual_seed(0)
    m = VQModel(VQParams().vq_args())
    m.train()
    x = torch.rand(2, 3, 32, 32) * 2 - 1
    _, _, _, idx = m(x)
    assert torch.equal(m.quantize.codebook_used[-128:].long(), idx.flatten())
    m.eval()
    before = m.quantize.codebook_used.clone()
    m(x)
    assert torch.equal(before, m.quantize.codebook_used)  # only training passes are recorded


def test_dead_code_restart_revives_unused_codes():
    torch.manual_seed(0)
    m = VQModel(VQParams(codebook_size=64).vq_args())
    with torch.no_grad():
        m.quantize.embedding.weight[:] = torch.randn(1, 8)  # collapsed codebook: one code wins everything
    x = torch.rand(16, 3, 32, 32) * 2 - 1
    assert len(m.encode(x).unique()) == 1
    counts = torch.bincount(m.encode(x).flatten(), minlength=64).float()
    opt = torch.optim.AdamW(m.parameters())
    with torch.no_grad():
        moved = restart_dead_codes(m, counts, m.encode_latent(x), opt, torch.Generator().manual_seed(0))
    assert moved == 63
    assert len(m.encode(x).unique()) > 32


def test_load_vq_round_trip_and_bad_files(tmp_path, toy):
    path = tmp_path / "vq.pt"
    save_checkpoint(path, toy, args=dataclasses.asdict(toy.args))
    loaded = load_vq(path)
    x = torch.rand(2, 3, 32, 32) * 2 - 1
    assert torch.equal(loaded.encode(x), toy.encode(x))
    bad = tmp_path / "bad.pt"
    bad.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(UserError, match="unreadable"):
        load_vq(bad)
    with pytest.raises(UserError, match="does not exist"):
        load_vq(tmp_path / "missing.pt")
