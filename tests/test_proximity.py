"""`lantern proximity` (LANTERN Fig. 3): the CLI's table and strip on a tiny saved world, zero shift for the null
variants, random codes moving the decodes more than near neighbours on a codebook with structure, the seeded
positions, one-line errors, the figure, and the rule in the workflow's plan."""
import math
import re
import subprocess
import sys

import pandas as pd
import pytest
import torch
import yaml
from PIL import Image

from conftest import REPO
from tiny import save_world, tiny_target
from lantern.engine.models.checkpoint import read_checkpoint
from lantern.engine.rules.neighbours import NeighbourParams, build_table, read_codebook
from lantern.io import save_torch
from lantern.metrics import train_clip
from lantern.metrics.proximity import RANDOM, interchangeable_rank, replace
from lantern.pipeline.cli import main as lantern

RANKS = [0, 1, 3, RANDOM]
FRACTIONS = [0.0, 0.5, 1.0]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """save_world's 16-code VQ with its codebook laid on a half circle (code i at angle pi * i / 16), so code
    distance grows with index distance and the decoder, continuous in the code vector, maps near codes to near
    images; its neighbour table (k = 5), 64 random 4 x 4 token grids, and an untrained tiny toy CLIP."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = save_world(tmp_path_factory.mktemp("proximity"), tiny_target())
    obj = read_checkpoint(root / "vq.pt")
    angle = torch.arange(16) * math.pi / 16
    obj["model"]["quantize.embedding.weight"] = torch.stack([angle.cos(), angle.sin(), 0 * angle, 0 * angle], 1)
    torch.save(obj, root / "vq.pt")
    save_torch(build_table(read_codebook(root / "vq.pt"), NeighbourParams(k=5)), root / "nb.pt")
    tokens = torch.randint(16, (64, 16), generator=torch.Generator().manual_seed(0))
    save_torch({"tokens": tokens, "labels": torch.zeros(64, dtype=torch.long), "codebook_size": 16}, root / "tok.pt")
    p = train_clip.TrainClipParams(image_tower="vit", patch_size=4, vision_width=32, vision_layers=1, text_width=32,
                                   text_layers=1, embed_dim=16)
    torch.manual_seed(0)
    cfg = train_clip.model_config(p, 16)
    net, _ = train_clip.build(cfg, "proximity-test-clip")
    train_clip.save(net, cfg, root / "proximity-test-clip.pt")
    yield root
    torch.set_num_threads(threads)


def args(root, out, **over):
    a = {"--vq": root / "vq.pt", "--neighbours": root / "nb.pt", "--tokens": root / "tok.pt",
         "--fidelity": f'{{"extractor": "toyclip", "weights_path": "{root / "proximity-test-clip.pt"}"}}',
         "--params": f'{{"ranks": {RANKS!r}, "fractions": {FRACTIONS}, "strip_images": 4}}'.replace("'", '"'),
         "--world": "tiny", "--out": out / "p.csv", "--strip": out / "p.png", **over}
    return ["proximity"] + [str(x) for kv in a.items() for x in kv]


@pytest.fixture(scope="module")
def table(world, tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    assert lantern(args(world, out)) == 0
    return pd.read_csv(out / "p.csv", dtype={"m": str}), out


def row(df, fraction, m):
    return df[(df["fraction"] == fraction) & (df["m"] == str(m))].iloc[0]


def test_cli_writes_the_table_and_the_strip(table):
    df, out = table
    assert len(df) == len(FRACTIONS) * len(RANKS) and (df["world"] == "tiny").all() and (df["n_images"] == 64).all()
    assert list(df["m"].unique()) == [str(m) for m in RANKS]
    assert df["fd_noise_halves"].nunique() == 1 and df["fd_noise_halves"].iloc[0] > 0
    assert (df["neighbour_metric"] == "l2").all() and (df["extractor"] == "toyclip").all()
    m = interchangeable_rank(df)  # the table carries the rank that decides the k grid, read at fraction 0.25
    assert df["interchangeable_m"].isna().all() if m is None else (df["interchangeable_m"] == m).all()
    # every numeric rank changes exactly round(f * 16) tokens per grid: neighbours never include the code itself
    for m in (1, 3, RANDOM):
        assert row(df, 0.5, m)["tokens_changed"] == pytest.approx(0.5)
    strip = Image.open(out / "p.png")
    side = 8 * (96 // 8)  # 8-pixel decodes, enlarged to 96
    assert strip.size == (4 * (side + 2) + 2, (1 + len(RANKS)) * (side + 2) + 2)


def test_classifier_adds_class_agreement(world, table, tmp_path):
    """--classifier: each row also says how often the swapped decodes keep the original decode's predicted class:
    all of them for the null variants; fewer for random codes than for the nearest ones, on the codebook laid
    out so that near codes decode to near images. Without it the columns are absent."""
    from lantern.metrics.classifier import ToyClassifier, save_classifier

    df, _ = table
    assert "class_agreement" not in df.columns
    torch.manual_seed(0)
    net = ToyClassifier(num_classes=4, width=4, image_size=8)
    with torch.no_grad():  # an untrained net says one class for every image: spread its logits over the features
        net.head.bias.zero_()
        net.head.weight.mul_(100)
    save_classifier(net, tmp_path / "cls.pt")
    assert lantern(args(world, tmp_path, **{"--classifier": tmp_path / "cls.pt"})) == 0
    got = pd.read_csv(tmp_path / "p.csv", dtype={"m": str})
    null = got[(got["fraction"] == 0) | (got["m"] == "0")]
    assert (null["class_agreement"] == 1).all() and (null["class_agreement_se"] == 0).all()
    assert got["class_agreement"].between(0, 1).all()
    assert row(got, 1.0, RANDOM)["class_agreement"] < row(got, 1.0, 1)["class_agreement"]
    assert got.drop(columns=["class_agreement", "class_agreement_se"]).equals(df)  # nothing else changes


def test_null_variants_give_zero_shift(table):
    df, _ = table
    null = df[(df["fraction"] == 0) | (df["m"] == "0")]
    assert len(null) == len(FRACTIONS) + len(RANKS) - 1
    assert (null["tokens_changed"] == 0).all() and (null["mae"] == 0).all() and (null["psnr"] == math.inf).all()
    assert null["fd"].abs().max() < 1e-9 and (null["feature_cosine"] - 1).abs().max() < 1e-9
    live = df[(df["fraction"] > 0) & (df["m"] != "0")]
    assert (live["mae"] > 0).all() and (live["fd"] > 1e-6).all()  # the zeros above are not a broken metric


def test_random_codes_shift_more_than_near_neighbours(table):
    df, _ = table
    for f in (0.5, 1.0):
        near, far, rand = row(df, f, 1), row(df, f, 3), row(df, f, RANDOM)
        assert near["code_distance"] < far["code_distance"] < rand["code_distance"]
        assert near["mae"] < far["mae"] < rand["mae"] and near["psnr"] > rand["psnr"]
        assert near["fd"] < rand["fd"] and near["feature_cosine"] > rand["feature_cosine"]


def test_positions_are_shared_by_every_rank_and_nested_across_fractions():
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(16, (5, 16), generator=g)
    rank = torch.rand(5, 16, generator=g).argsort(1).argsort(1)
    table = (torch.arange(16)[:, None] + torch.arange(1, 4)) % 16  # code x -> x+1, x+2, x+3
    r = torch.randint(15, (5, 16), generator=g)
    random_codes = r + (r >= tokens)
    masks = {}
    for f in (0.25, 0.5):
        for m in (1, 3, RANDOM):
            masks[f, m] = replace(tokens, rank, f, m, table, random_codes) != tokens
        assert (masks[f, 1] == masks[f, 3]).all() and (masks[f, 1] == masks[f, RANDOM]).all()
        assert (masks[f, 1].sum(1) == round(16 * f)).all()
    assert (masks[0.25, 1] <= masks[0.5, 1]).all()
    assert (replace(tokens, rank, 1.0, 3, table, random_codes) == (tokens + 3) % 16).all()


def bad_cases(root, tmp):
    other = tmp / "other_vq.pt"
    obj = read_checkpoint(root / "vq.pt")
    obj["model"]["quantize.embedding.weight"] = obj["model"]["quantize.embedding.weight"].flip(0)
    torch.save(obj, other)
    save_torch({"tokens": torch.full((8, 16), 20), "labels": torch.zeros(8), "codebook_size": 32}, tmp / "big.pt")
    save_torch({"tokens": torch.zeros(8, 12, dtype=torch.long), "labels": torch.zeros(8), "codebook_size": 16},
               tmp / "flat.pt")
    return [
        ({"--params": '{"ranks": [1, 9]}'}, r"rank m=9 exceeds the 5 neighbours per code of .*nb\.pt"),
        ({"--params": '{"ranks": [1, "rand"]}'}, r"proximity\.ranks = .* must be a list of distinct integers"),
        ({"--params": '{"fractions": [0.5, 2]}'}, r"proximity\.fractions = .* numbers in \[0, 1\]"),
        ({"--tokens": tmp / "missing.pt"}, r"--tokens .*missing\.pt does not exist"),
        ({"--tokens": tmp / "big.pt"}, r"--tokens hold codes 20\.\.20 but .* has 16 codes"),
        ({"--tokens": tmp / "flat.pt"}, r"12 tokens, not a square grid"),
        ({"--vq": other}, r"neighbour table .*nb\.pt was built for another codebook"),
        ({"--fidelity": '{"extractor": "toyclip", "weights_path": "nowhere.pt"}'}, r"toyclip weights not found at nowhere\.pt"),
        ({"--out": tmp / "p.txt"}, r"--out must end in \.csv"),
        ({"--classifier": tmp / "none.pt"}, r"classifier checkpoint .*none\.pt"),
    ]


def test_bad_inputs_are_one_line(world, tmp_path, capsys):
    for over, pattern in bad_cases(world, tmp_path):
        capsys.readouterr()
        assert lantern(args(world, tmp_path, **over)) == 2, over
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and re.search(pattern, err), (over, err)
        assert not (tmp_path / "p.csv").exists()


def test_figure_draws_curves_and_strip(table, tmp_path):
    _, out = table
    png = tmp_path / "proximity.png"
    assert lantern(["figure", "proximity", "--proximity", str(out / "p.csv"), "--strip", f"tiny={out / 'p.png'}",
                    "--out", str(png)]) == 0
    assert Image.open(png).size[0] > 1000
    assert lantern(["figure", "proximity", "--proximity", str(out / "p.csv"), "--strip", f"other={out / 'p.png'}",
                    "--out", str(png)]) == 2


def plan(tmp_path, overlay: dict) -> str:
    (tmp_path / "over.yaml").write_text(yaml.safe_dump(overlay))
    r = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--quiet", "rules", "--workflow-profile", "none",
                        "--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path), "--cores", "1",
                        "--configfile", str(REPO / "config" / "config.yaml"), str(tmp_path / "over.yaml")],
                       cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return r.stdout


def test_the_default_run_plans_proximity_for_both_toy_worlds(tmp_path):
    out = plan(tmp_path, {"seed": 0})
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", out, re.M))  # the job stats table: rule, count
    assert jobs.get("proximity") == "2" and jobs.get("figure_proximity") == "1", out
    assert jobs.get("proximity_neighbours") == "1", out  # the clean world's VQ needs its own table
    off = plan(tmp_path, {"proximity": {"enabled": False}})
    assert "proximity" not in off, off


def test_a_llamagen_run_plans_proximity_on_the_vanilla_samples(tmp_path):
    """The llamagen world scores the vanilla point's own tokens (stats.csv of every shard, sampling mode) with the
    run's Inception extractor, on the sweep's neighbour table."""
    from llamagen_world import build_world
    from test_llamagen_world import C2I_RECIPE, overlay

    over = overlay(build_world(tmp_path / "world"), "c2i")
    over["sweep"]["methods"] = [{"name": "vanilla"}, {"name": "lantern", "drafting": "dynamic", "delta": 0.2, "k": 50}]
    (tmp_path / "over.yaml").write_text(yaml.safe_dump(over))
    r = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-p", "--workflow-profile", "none", "--snakefile",
                        str(REPO / "Snakefile"), "--directory", str(tmp_path), "--cores", "1", "--configfile",
                        str(C2I_RECIPE), str(tmp_path / "over.yaml")], cwd=REPO, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    command = next(line for line in r.stdout.splitlines() if "lantern proximity" in line)
    for part in ("--tokens results/gen/sampling/vanilla/shard0/stats.csv results/gen/sampling/vanilla/shard1/stats.csv",
                 "--neighbours results/neighbours/l2_K50.pt", '"extractor": "inception-v3-compat"',
                 "--world llamagen", "--out results/proximity/llamagen.csv"):
        assert part in command, (part, command)
    assert "lantern figure proximity" in r.stdout


def test_interchangeable_rank_is_the_last_rank_before_the_noise_band_is_left():
    def table(fds, noise=1.0, fraction=0.25):
        rows = [{"fraction": fraction, "m": str(m), "fd": fd, "fd_noise_halves": noise} for m, fd in fds.items()]
        return pd.DataFrame(rows + [{"fraction": 0.5, "m": "1", "fd": 9.0, "fd_noise_halves": noise}])

    assert interchangeable_rank(table({0: 0.0, 1: 0.2, 5: 0.6, 20: 0.9, 50: 1.4, RANDOM: 5.0})) == 20
    # a rank past the first miss never counts, even when its own shift happens to fall back under the band
    assert interchangeable_rank(table({1: 0.2, 5: 1.2, 20: 0.9})) == 1
    assert interchangeable_rank(table({1: 1.5, 5: 2.0})) is None
    assert interchangeable_rank(table({1: 0.1}), fraction=0.1) is None  # the fraction was not measured


def test_a_chameleon_vqgan_is_scored_on_the_vanilla_samples_as_its_world_draws_them(world, tmp_path, monkeypatch):
    """--vqgan-yaml: Chameleon's VQGAN through its reader, on `lantern sample --family` tokens and the table
    `lantern chameleon-neighbours` builds; its decodes are the shard's PNGs (uint8 by truncation, the world's
    pixels_of), the null variants shift nothing, and a rank swaps exactly its fraction of the codes."""
    import numpy as np

    from lantern.metrics.proximity import decode
    from lantern.pipeline import sample
    from lantern.worlds.chameleon.world import load_vqgan
    from lantern.worlds.llamagen.prompts import write_prompts
    from tiny_chameleon import write_world

    monkeypatch.chdir(tmp_path)
    files = {k: str(v) for k, v in write_world(tmp_path / "w", positions=128).items()}
    yaml_path = str(tmp_path / "w" / "tokenizer" / "vqgan.yaml")
    write_prompts([(str(i), c) for i, c in enumerate(["a red cat", "a cat", "a mat", "the red cat"])], "prompts.csv")
    sample.main(["--family", "anole", "--target", files["target"], "--vq", files["vqgan_ckpt"], "--tokenizer",
                 files["tokenizer"], "--pixels", "64", "--prompt-tokens", "32", "--prompts", "prompts.csv", "--end", "4",
                 "--device", "cpu", "--threads", "1", "--quiet", "--no-warmup", "--out", "shard0"])
    assert lantern(["chameleon-neighbours", "--vq", files["vqgan_ckpt"], "--vqgan-yaml", yaml_path, "--out", "nb.pt",
                    "--params", '{"metric": "l2", "k": 5}']) == 0
    argv = args(world, tmp_path, **{"--vq": files["vqgan_ckpt"], "--neighbours": "nb.pt", "--tokens": "shard0/stats.csv",
                                    "--world": "anole"})
    assert lantern([*argv, "--vqgan-yaml", yaml_path]) == 0
    df = pd.read_csv("p.csv", dtype={"m": str})
    assert len(df) == len(FRACTIONS) * len(RANKS) and (df["world"] == "anole").all() and (df["n_images"] == 4).all()
    null = df[(df["fraction"] == 0) | (df["m"] == "0")]
    assert (null["mae"] == 0).all() and (null["fd"].abs() < 1e-6).all()
    for m in (1, 3, RANDOM):
        assert row(df, 0.5, m)["tokens_changed"] == pytest.approx(0.5) and row(df, 0.5, m)["mae"] > 0
    tokens = torch.tensor([[int(t) for t in s.split()] for s in pd.read_csv("shard0/stats.csv")["tokens"]])
    pixels = decode(load_vqgan(files["vqgan_ckpt"], yaml_path, torch.device("cpu")), tokens, 3, "cpu")
    pngs = np.stack([np.asarray(Image.open(f"shard0/images/{i:06d}.png")) for i in range(4)])
    assert np.array_equal(pixels.permute(0, 2, 3, 1).numpy(), pngs)
