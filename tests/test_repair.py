"""Durable writes (issue #61): atomic_path syncs the file and its folder around the rename, and a resumed shard keeps
only the images that verify (readable, with the digest recorded when they were written); one that a crash emptied is
redrawn. The check before a run's first job is held by tests/test_faults.py."""
import hashlib
import json
import os
from pathlib import Path

import pytest

from lantern import io as lio
from lantern.pipeline import sample
from lantern.pipeline.verify import executes_jobs

REPO = Path(__file__).resolve().parents[1]
TOY = REPO / "models" / "toy" / "default"


def test_atomic_path_syncs_the_file_then_its_folder_before_and_after_the_rename(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("rename", str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    target = tmp_path / "out.json"
    lio.write_json(target, {"a": 1})
    kinds = [(kind, "file" if path.endswith(".tmp") else "folder" if path == str(tmp_path) else path)
             for kind, path in events]
    assert kinds == [("fsync", "file"), ("fsync", "folder"), ("rename", str(target)), ("fsync", "folder")]
    assert json.loads(target.read_text()) == {"a": 1}


class Crash(Exception):
    pass


def sample_args(out: Path) -> list[str]:
    return ["--target", str(TOY / "target.pt"), "--vq", str(TOY / "vq.pt"), "--end", "4", "--out", str(out),
            "--device", "cpu", "--threads", "1", "--quiet", "--no-warmup", "--compile", "false"]


def test_a_resumed_shard_redraws_a_kept_image_that_a_crash_emptied(tmp_path, monkeypatch, capsys):
    """Before: kill -9 after 2 images, a kept PNG emptied (its name renamed in, its bytes never written): the rerun
    kept it ("2 finished images kept") and the manifest recorded the empty file's digest, so the shard passed its own
    check. Now the rerun redraws it, and the shard is the uninterrupted run's, byte for byte."""
    whole = tmp_path / "whole"
    sample.main(sample_args(whole))

    out = tmp_path / "shard0"
    calls = []
    real_update = sample.Progress.update

    def update(self, *a, **k):  # the job dies after its second image, as under kill -9
        real_update(self, *a, **k)
        calls.append(1)
        if len(calls) == 2:
            raise Crash()

    monkeypatch.setattr(sample.Progress, "update", update)
    with pytest.raises(Crash):
        sample.main(sample_args(out))
    monkeypatch.undo()
    partial = Path(f"{out}.partial")
    emptied = partial / "images" / "000001.png"
    assert sorted(p.name for p in (partial / "rows").iterdir()) == ["000000.json", "000001.json"]
    st = emptied.stat()
    os.truncate(emptied, 0)
    os.utime(emptied, ns=(st.st_atime_ns, st.st_mtime_ns))
    capsys.readouterr()

    sample.main(sample_args(out))
    printed = capsys.readouterr().out
    assert f"{partial}: not keeping image 000001: 000001.png is not a readable image (0 bytes); it is redrawn" \
        in printed
    assert f"resuming {partial}: 1 finished images kept" in printed
    for name in [f"{i:06d}.png" for i in range(4)]:
        assert (out / "images" / name).read_bytes() == (whole / "images" / name).read_bytes(), name
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["images"] == json.loads((whole / "manifest.json").read_text())["images"]
    assert manifest["images"]["sha256"]["000001.png"] == hashlib.sha256(emptied.parent.parent.parent.joinpath(
        "shard0", "images", "000001.png").read_bytes()).hexdigest()


def test_a_kept_image_with_bytes_other_than_written_is_redrawn(tmp_path):
    """A readable PNG that is not the one written (another image's bytes) is not kept either."""
    partial = tmp_path / "s.partial"
    (partial / "images").mkdir(parents=True)
    (partial / "rows").mkdir()
    for i in range(2):
        digest = sample.save_png(sample.np.full((4, 4, 3), 40 * i, dtype=sample.np.uint8),
                                 partial / "images" / f"{i:06d}.png")
        lio.write_json(partial / "rows" / f"{i:06d}.json", {"image_index": i, sample.DIGEST: digest})
    assert sample.kept_image_fault(partial / "rows" / "000000.json", partial / "images") is None
    (partial / "images" / "000000.png").write_bytes((partial / "images" / "000001.png").read_bytes())
    assert sample.kept_image_fault(partial / "rows" / "000000.json", partial / "images") == \
        "000000.png does not hold the bytes written for it"
    (partial / "rows" / "000001.json").write_text("")  # a row a crash left empty
    assert sample.kept_image_fault(partial / "rows" / "000001.json", partial / "images") == \
        "its row 000001.json is not whole"


@pytest.mark.parametrize("argv, runs", [
    (["snakemake", "--cores", "2"], True),
    (["/venv/lib/snakemake/__main__.py", "--cores", "1", "results/tables/summary.md"], True),
    (["snakemake", "--cores", "1", "--report-after-run"], True),
    (["snakemake", "-n"], False),
    (["snakemake", "--cores", "1", "-np"], False),
    (["snakemake", "--unlock"], False),
    (["snakemake", "--lint"], False),
    (["snakemake", "--cores", "1", "--report", "results/report.html"], False),
    (["snakemake", "--dag", "mermaid-js"], False),
    (["snakemake", "--cores", "1", "--touch"], False),
    (["pytest", "tests"], False),  # Snakemake driven from Python: no command line to read
])
def test_only_a_command_that_runs_jobs_checks_results(argv, runs):
    assert executes_jobs(argv) is runs


def test_tables_name_a_short_stats_table_and_its_redraw(tmp_path, capsys):
    """Before: a stats.csv that lost a row was blamed on the metrics file, whose advice led to a second error. Now
    the tables name the stats table, and the redraw of its shard."""
    from lantern.pipeline.cli import main as cli
    from test_bad_inputs import assert_one_line
    from test_tables import make_sweep

    shards, metrics = make_sweep(tmp_path)
    stats = shards[0] / "stats.csv"
    stats.write_text("".join(stats.read_text().splitlines(keepends=True)[:-1]))
    rc = cli(["tables", "--shards", *map(str, shards), "--metrics", *map(str, metrics), "--out", str(tmp_path / "t")])
    captured = capsys.readouterr()
    assert_one_line(rc, captured.out, captured.err, rf"{stats} is short: it holds \d+ rows, but the shard's manifest "
                    rf"records \d+ images; redraw it .* `--forcerun={shards[0]}`")


@pytest.fixture(scope="module")
def chameleon_files(tmp_path_factory):
    from tiny_chameleon import write_world

    return {k: str(v) for k, v in write_world(tmp_path_factory.mktemp("chameleon"), positions=128).items()}


@pytest.mark.parametrize("family", ["anole", "lumina-mgpt"])
def test_damaged_pngs_of_a_sound_chameleon_shard_are_restored_through_its_vqgan(family, chameleon_files, tmp_path,
                                                                                 monkeypatch):
    """A Chameleon shard's PNG is its tokens through the VQGAN its manifest records (uint8 by truncation, as
    `lantern sample --family` wrote it): deleted or corrupted, it comes back byte-identical and nothing is redrawn.
    A sound shard loads no VQGAN; one whose recorded VQGAN is gone is set aside for its redraw instead."""
    import shutil

    from lantern.pipeline.verify import png_restorer, verify_results
    from lantern.worlds.chameleon import world as chameleon_world
    from lantern.worlds.llamagen.prompts import write_prompts

    monkeypatch.chdir(tmp_path)
    write_prompts([("0", "a red cat"), ("1", "a cat on the mat , a red mat")], tmp_path / "prompts.csv")
    files = chameleon_files
    shard = Path("results/gen/sampling/vanilla/shard0")
    sample.main(["--family", family, "--target", files["target"], "--vq", files["vqgan_ckpt"], "--tokenizer",
                 files["tokenizer"], "--pixels", "64", "--prompt-tokens", "32", "--prompts", "prompts.csv",
                 "--end", "2", "--device", "cpu", "--threads", "1", "--quiet", "--no-warmup", "--out", str(shard)])
    whole = shutil.copytree(shard, tmp_path / "whole")
    sweep = {"results/metrics/sampling/vanilla.json": [str(shard)]}

    loads = []
    real = chameleon_world.vqgan_pixels
    monkeypatch.setattr(chameleon_world, "vqgan_pixels", lambda *a, **k: loads.append(a) or real(*a, **k))
    found = verify_results("results", sweep, "results/tables", digests=True, restore=png_restorer("", 1))
    assert found.lines == [] and found.shards == 1 and loads == []  # nothing damaged: no VQGAN read

    (shard / "images" / "000000.png").unlink()
    data = (shard / "images" / "000001.png").read_bytes()
    (shard / "images" / "000001.png").write_bytes(data[:20] + bytes(len(data) - 20))  # its size, not its bytes
    found = verify_results("results", sweep, "results/tables", restore=png_restorer("", 1))
    assert len(found.lines) == 1 and found.lines[0].endswith("; restored 2 image(s) from the tokens in its "
                                                             "stats.csv, each holding its recorded sha256 again: "
                                                             "nothing to redraw"), found.lines
    assert loads == [(family, files["vqgan_ckpt"], None, 64)]  # the world its manifest records, read once
    for name in ("000000.png", "000001.png", "stats.csv", "manifest.json"):
        assert (shard / "images" / name if name.endswith(".png") else shard / name).read_bytes() == \
            (whole / "images" / name if name.endswith(".png") else whole / name).read_bytes(), name
    assert not Path("results/damaged").exists()
    assert verify_results("results", sweep, "results/tables", digests=True, restore=png_restorer("", 1)).lines == []

    manifest = json.loads((shard / "manifest.json").read_text())
    (shard / "manifest.json").write_text(json.dumps(dict(manifest, vq="gone/vqgan.ckpt")))
    (shard / "images" / "000000.png").unlink()
    lines = verify_results("results", sweep, "results/tables", restore=png_restorer("", 1)).lines
    assert len(lines) == 1 and "; set aside as results/damaged/" in lines[0] and "this run redraws it" in lines[0]
    assert not shard.exists()
