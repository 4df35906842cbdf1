import time

import pytest
import torch
import torch.nn.functional as F

from lantern.errors import UserError
from lantern.engine.rules.neighbours import (codebook_sha256, index_dtype, load_neighbours, main, nearest_neighbours,
                                             read_codebook)


def brute_force(cb, k, metric):
    """Full N x N distances, self excluded, ordered by (distance, index)."""
    x = F.normalize(cb, dim=1) if metric == "cosine" else cb
    d = torch.cdist(x, x, compute_mode="donot_use_mm_for_euclid_dist")
    d.fill_diagonal_(float("inf"))
    return torch.sort(d, dim=1, stable=True).indices[:, :k]


@pytest.mark.parametrize("metric", ["l2", "cosine"])
@pytest.mark.parametrize("chunk", [7, 64])
def test_matches_brute_force(metric, chunk):
    torch.manual_seed(0)
    cb = torch.randn(50, 4) * torch.rand(50, 1) * 3  # varied norms, so l2 and cosine orders differ
    table = nearest_neighbours(cb, 12, metric, chunk)
    assert table.shape == (50, 12)
    assert torch.equal(table.long(), brute_force(cb, 12, metric))
    assert not (table.long() == torch.arange(50)[:, None]).any()


def test_metrics_differ():
    torch.manual_seed(0)
    cb = torch.randn(50, 4) * torch.rand(50, 1) * 3
    assert not torch.equal(nearest_neighbours(cb, 5, "l2"), nearest_neighbours(cb, 5, "cosine"))


def test_ties_are_ordered_by_index_even_across_the_cut():
    # code 0 at the origin; codes 1..9 are nine copies of one point; codes 10, 11 sit nearer than the copies
    cb = torch.zeros(12, 2)
    cb[1:10] = torch.tensor([1.0, 0.0])
    cb[10] = torch.tensor([0.5, 0.0])
    cb[11] = torch.tensor([0.0, 0.5])
    for chunk in (1, 5, 12):
        t = nearest_neighbours(cb, 6, "l2", chunk)
        assert t[0].tolist() == [10, 11, 1, 2, 3, 4]  # 10 and 11 tie (0.5): by index; then the copies by index
        assert t[1].tolist() == [2, 3, 4, 5, 6, 7]  # a copy's nearest are the other copies (distance 0)
        assert torch.equal(t.long(), brute_force(cb, 6, "l2"))


def test_k_out_of_range():
    with pytest.raises(UserError, match="between 1 and 9"):
        nearest_neighbours(torch.randn(10, 3), 10)


def write_vq(path, cb):
    torch.save({"model": {"quantize.embedding.weight": cb, "quantize.codebook_used": torch.zeros(8)}}, path)


def test_cli_roundtrip_and_checks(tmp_path, capsys):
    torch.manual_seed(1)
    cb = torch.randn(40, 8)
    write_vq(tmp_path / "vq.pt", cb)
    out = tmp_path / "nb" / "table.pt"
    main(["--vq", str(tmp_path / "vq.pt"), "--out", str(out), "--params", '{"metric": "cosine", "k": 20}'])
    assert '"seconds"' in capsys.readouterr().out
    raw = torch.load(out, weights_only=True)
    assert raw["meta"]["metric"] == "cosine" and raw["meta"]["k"] == 20
    assert raw["meta"]["codebook_sha256"] == codebook_sha256(cb)
    assert raw["meta"]["index_dtype"] == "int16" and raw["neighbours"].dtype == torch.int16
    t = load_neighbours(out, cb, 10, metric="cosine")
    assert t.dtype == torch.int16 and t.shape == (40, 10) and t.is_contiguous()
    assert torch.equal(t.long(), brute_force(cb, 10, "cosine"))
    assert not list(out.parent.glob(".*tmp"))  # written atomically, nothing left behind

    with pytest.raises(UserError, match="another codebook"):
        load_neighbours(out, cb + 1e-3, 10)
    with pytest.raises(UserError, match="rebuild with k >= 25"):
        load_neighbours(out, cb, 25)
    with pytest.raises(UserError, match="metric cosine"):
        load_neighbours(out, cb, 10, metric="l2")
    with pytest.raises(UserError, match="does not exist"):
        load_neighbours(tmp_path / "missing.pt", cb, 10)
    torch.save({"x": 1}, tmp_path / "other.pt")
    with pytest.raises(UserError, match="not a neighbour table"):
        load_neighbours(tmp_path / "other.pt", cb, 10)


@pytest.mark.parametrize("params, needle", [
    ('{"metric": "dot"}', "metric"),
    ('{"k": 0}', "positive"),
    ('{"kk": 3}', "unknown"),
    ('{"k": 40}', "exceeds the 39"),
])
def test_cli_bad_params(tmp_path, params, needle):
    write_vq(tmp_path / "vq.pt", torch.randn(40, 8))
    with pytest.raises(UserError, match=needle):
        main(["--vq", str(tmp_path / "vq.pt"), "--out", str(tmp_path / "t.pt"), "--params", params])
    assert not (tmp_path / "t.pt").exists()


def test_cli_rejects_a_checkpoint_without_codebook(tmp_path):
    torch.save({"model": {"tok_embeddings.weight": torch.randn(4, 4)}}, tmp_path / "gpt.pt")
    with pytest.raises(UserError, match="quantize.embedding.weight"):
        main(["--vq", str(tmp_path / "gpt.pt"), "--out", str(tmp_path / "t.pt")])


def test_index_dtype_fits_the_codebook():
    assert index_dtype(16384) == torch.int16 and index_dtype(2**15) == torch.int16
    assert index_dtype(2**15 + 1) == torch.int32
    assert torch.iinfo(torch.int16).max == 2**15 - 1  # the largest index of a 2**15-code book


def test_read_codebook_from_upstream_and_legacy_files(tmp_path):
    """Upstream ships {"model": sd} with the whole VQ (encoder, decoder, ...); an old-format file cannot be mmapped."""
    cb = torch.randn(64, 8)
    sd = {"encoder.conv_in.weight": torch.randn(128, 3, 3, 3), "quantize.embedding.weight": cb,
          "decoder.conv_out.weight": torch.randn(3, 128, 3, 3)}
    torch.save({"model": sd}, tmp_path / "upstream.pt")
    torch.save(sd, tmp_path / "raw.pt", _use_new_zipfile_serialization=False)
    for name in ("upstream.pt", "raw.pt"):
        got = read_codebook(tmp_path / name)
        assert got.dtype == torch.float32 and torch.equal(got, cb)
    torch.save({"model": {"quantize.embedding.weight": cb.half()}}, tmp_path / "half.pt")
    assert torch.equal(read_codebook(tmp_path / "half.pt"), cb.half().float())
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    for name, needle in [("junk.pt", "unreadable"), ("missing.pt", "does not exist")]:
        with pytest.raises(UserError, match=needle):
            read_codebook(tmp_path / name)
    torch.save(torch.zeros(3), tmp_path / "tensor.pt")
    with pytest.raises(UserError, match="not a mapping of tensors"):
        read_codebook(tmp_path / "tensor.pt")


@pytest.mark.slow
def test_llamagen_scale_runs_in_well_under_a_minute():
    torch.manual_seed(2)
    cb = torch.randn(16384, 8)
    t0 = time.process_time()  # CPU time, so other jobs on the machine do not count
    table = nearest_neighbours(cb, 1000, "l2")
    assert time.process_time() - t0 < 60
    assert table.shape == (16384, 1000) and table.dtype == torch.int16
    rows = torch.tensor([0, 777, 16383])
    d = torch.cdist(cb[rows], cb, compute_mode="donot_use_mm_for_euclid_dist")
    d[torch.arange(3), rows] = float("inf")
    assert torch.equal(table[rows].long(), torch.sort(d, dim=1, stable=True).indices[:, :1000])
