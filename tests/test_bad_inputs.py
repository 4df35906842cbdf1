"""Every user mistake stops before any work with one line naming the key or file and the fix: a table of bad
configs fed through `lantern check-config` and `snakemake -n`, and a table of bad files and arguments fed through
the CLI subcommand that reads them. Each case asserts the exit code, one line on stderr, no traceback, no output."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from lantern.engine.neighbours import NeighbourParams, build_table
from lantern.pipeline.cli import main as cli

REPO = Path(__file__).resolve().parents[1]
TOY = REPO / "models" / "toy" / "default"
HANG_GUARD_S = 3600  # only catches a hang; a slow or busy machine never reaches it


def lantern_entry(**kw):
    return {"sweep": {"methods": [{"name": "lantern", "drafting": "chain", "gamma": 4, "delta": 0.1, "k": 5, **kw}]}}


def method(**m):
    return {"sweep": {"methods": [m]}}


# (case id, override config, regex the one error line must match)
CONFIGS = [
    ("delta-above-1", lantern_entry(delta=1.5), r"sweep\.methods\[0\]\.delta = 1\.5 exceeds 1"),
    ("delta-nan", lantern_entry(delta=float("nan")), r"delta = nan must be a finite number"),
    ("delta-negative", lantern_entry(delta=-0.1), r"delta = -0\.1 must be >= 0"),
    ("gamma-float", lantern_entry(gamma=4.0), r"gamma = 4\.0 must be an integer; write 4"),
    ("k-float", lantern_entry(k=10.0), r"k = 10\.0 must be an integer"),
    ("k-inf", lantern_entry(k=float("inf")), r"k = inf must be a finite number"),
    ("k-above-max-k", lantern_entry(k=1000), r"k = 1000 is larger than neighbours\.max_k"),
    ("lam-one", method(name="lanternpp", lam=1, k=5), r"lam = 1 must be > 1"),
    ("lam-on-lantern", lantern_entry(lam=2), r"\.lam does not apply to lantern"),
    ("delta-on-lanternpp", method(name="lanternpp", lam=2, k=5, delta=0.1), r"\.delta does not apply to lanternpp"),
    ("delta-on-exact", method(name="exact", delta=0.1), r"\.delta does not apply to exact"),
    ("k-on-exact", method(name="exact", k=5), r"\.k does not apply to exact"),
    ("gamma-on-dynamic", method(name="exact", drafting="dynamic", gamma=4), r"\.gamma does not apply to exact with dynamic"),
    ("total-tokens-on-chain", method(name="exact", total_tokens=30), r"\.total_tokens does not apply to exact with chain"),
    ("tree-on-chain", method(name="exact", tree="chain"), r"\.tree does not apply to exact with chain"),
    ("drafting-on-vanilla", method(name="vanilla", drafting="chain"), r"\.drafting does not apply to vanilla"),
    ("unknown-method", method(name="medusa"), r"\.name = 'medusa' is not a method"),
    ("unknown-drafting", method(name="exact", drafting="zigzag"), r"\.drafting = 'zigzag' is not allowed"),
    ("tree-rank-gap", method(name="exact", drafting="static", tree=[[0], [2]]), r"\.tree: .*skips rank 1"),
    ("tree-rank-10", method(name="exact", drafting="static", tree=[[r] for r in range(11)]), r"ranks must be < 10"),
    ("tree-unknown-name", method(name="exact", drafting="static", tree="bushy"), r"\.tree = 'bushy' is not a static tree"),
    ("same-point-twice", {"sweep": {"methods": [{"name": "exact"}, {"name": "exact", "gamma": 4}]}},
     r"sweep\.methods\[1\] repeats the point exact-chain-g4"),
    ("residual-unknown", lantern_entry(residual="loose"), r"\.residual = 'loose' is not allowed"),
    ("lantern-without-k", {"sweep": {"methods": [{"name": "lantern", "delta": 0.1}]}}, r"needs k"),
    ("dynamic-depth-0", method(name="exact", drafting="dynamic", depth=0), r"\.depth = 0 must be >= 1"),
    ("method-not-a-mapping", {"sweep": {"methods": ["lantern"]}}, r"sweep\.methods\[0\] = 'lantern' has the wrong type"),
    ("methods-empty", {"sweep": {"methods": []}}, r"sweep\.methods is empty"),
    ("modes-empty", {"sweep": {"modes": []}}, r"sweep\.modes is empty"),
    ("mode-unknown", {"sweep": {"modes": ["beam"]}}, r"sweep\.modes\[0\] = 'beam' is not allowed"),
    ("shards-above-images", {"sweep": {"n_images": 2, "shards": 3}}, r"sweep\.shards = 3 is more than sweep\.n_images"),
    ("n-images-negative", {"sweep": {"n_images": -5}}, r"sweep\.n_images"),
    ("n-images-string", {"sweep": {"n_images": "many"}}, r"sweep\.n_images = 'many' has the wrong type"),
    ("unknown-top-key", {"sweeps": {}}, r"unknown key sweeps"),
    ("unknown-nested-key", {"sweep": {"n_image": 3}}, r"unknown key sweep\.n_image"),
    ("max-k-beyond-codebook", {"neighbours": {"max_k": 600}}, r"neighbours\.max_k = 600 exceeds the codebook"),
    ("device-unknown", {"device": "gpu"}, r"device"),
    ("seed-string", {"seed": "x"}, r"seed = 'x' has the wrong type"),
    ("inception-without-weights", {"metrics": {"fid_extractor": "inception-v3-compat"}},
     r"metrics\.inception_weights is empty"),
    ("llamagen-missing-gpt", {"world": "llamagen", "llamagen": {"gpt_ckpt": "/nope/c2i_L_256.pt"}},
     r"llamagen\.gpt_ckpt = /nope/c2i_L_256\.pt does not exist"),
    ("llamagen-image-size", {"world": "llamagen", "llamagen": {"image_size": 250}},
     r"llamagen\.image_size = 250 is not allowed; use one of"),
]


def text_file(path: Path) -> str:
    path.write_text("this is not a checkpoint\n")
    return str(path)


def file_configs(tmp: Path) -> list:
    """Cases that need files on disk: a text file named .pt as the VQ checkpoint the config reads, and a t2i
    run without prompts."""
    fake = text_file(tmp / "text.pt")
    return [
        ("llamagen-text-vq", {"world": "llamagen", "llamagen": {"gpt_ckpt": fake, "vq_ckpt": fake, "drafter_ckpt": fake},
                              "metrics": {"reference": str(tmp), "resolution": 256, "class_names": "imagenet"}},
         r"llamagen\.vq_ckpt: checkpoint .*text\.pt is unreadable: not a torch file"),
        ("llamagen-t2i-without-prompts", {"world": "llamagen", "llamagen": {"model_type": "t2i", "gpt_ckpt": fake,
                                                                             "vq_ckpt": str(TOY / "vq.pt")}},
         r"a t2i run needs prompts"),
    ]


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD_S)


def error_lines(stderr: str) -> list[str]:
    # Snakemake adds its own info line about the extra config file; everything else is ours
    return [line for line in stderr.splitlines() if line.strip() and "is extended by additional config" not in line]


def assert_one_line(rc: int, stdout: str, stderr: str, pattern: str) -> None:
    assert rc != 0, stdout + stderr
    assert "Traceback" not in stdout + stderr, stderr
    lines = error_lines(stderr)
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: "), lines[0]
    assert re.search(pattern, lines[0]), (pattern, lines[0])


def write_override(tmp: Path, override: dict) -> tuple[Path, Path]:
    out = tmp / "out dir"  # a space: paths are quoted everywhere
    path = tmp / "override.yaml"
    path.write_text(yaml.safe_dump({"outdir": str(out), **override}))
    return path, out


def config_cases():
    return [pytest.param(o, p, id=i) for i, o, p in CONFIGS] + [pytest.param(None, i, id=i) for i in
                                                                   ("llamagen-text-vq", "llamagen-t2i-without-prompts")]


@pytest.mark.parametrize("override, pattern", config_cases())
def test_bad_config_stops_check_config_and_snakemake_in_one_line(override, pattern, tmp_path, capsys):
    if override is None:  # a case that needs files: look it up by id
        override, pattern = next((o, p) for i, o, p in file_configs(tmp_path) if i == pattern)
    path, out = write_override(tmp_path, override)
    rc = cli(["check-config", str(REPO / "config" / "config.yaml"), str(path)])
    captured = capsys.readouterr()
    assert_one_line(rc, captured.out, captured.err, pattern)
    r = run([sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--configfile", str(path)])
    assert_one_line(r.returncode, "", r.stderr, pattern)
    assert not out.exists()


def test_check_config_file_errors_are_one_line(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("sweep:\n  n_images: 3\n  modes: [sampling\n")
    listed = tmp_path / "listed.yaml"
    listed.write_text("- seed: 1\n")
    config = str(REPO / "config" / "config.yaml")
    for args, pattern in [
        ([config, str(broken)], r"config file .*broken\.yaml line \d+ is not valid YAML"),
        ([config, str(listed)], r"config file .*listed\.yaml holds a list; a config is a mapping"),
        ([config, str(tmp_path / "missing.yaml")], r"config file .*missing\.yaml does not exist"),
        ([config, "--config", "3x=1"], r"--config 3x=1: Invalid config definition"),
        ([config, "--config", 'sweep={"n_images": 10}'], r"sweep\.n_images = '10' has the wrong type"),
        ([], r"usage: lantern check-config"),
    ]:
        r = run([sys.executable, "-m", "lantern", "check-config", *args])
        assert r.returncode == 2
        assert_one_line(r.returncode, r.stdout, r.stderr, pattern)
    # Snakemake parses the same --config the same way: both refuse the string
    r = run([sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--config", 'sweep={"n_images": 10}'])
    assert_one_line(r.returncode, "", r.stderr, r"sweep\.n_images = '10' has the wrong type")


# -- bad files and arguments, through the subcommand that reads them -----------------------------------------------
@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("files")
    text_file(root / "text.pt")
    (root / "empty.pt").write_bytes(b"")
    (root / "random.pt").write_bytes(bytes(range(256)) * 8)
    torch.save([1, 2, 3], root / "list.pt")
    torch.save(build_table(torch.randn(32, 4), NeighbourParams(k=8)), root / "other_nb.pt")
    (root / "latin1.csv").write_bytes(b"id,caption\n1,caf\xe9 au lait\n")
    (root / "empty_dir").mkdir()
    return root


def sample(out: Path, **kw) -> list[str]:
    args = {"--target": str(TOY / "target.pt"), "--vq": str(TOY / "vq.pt"), "--drafter": str(TOY / "drafter.pt"),
            "--end": "2", "--out": str(out), "--device": "cpu", **kw}
    return ["sample", *[x for k, v in args.items() for x in (k, v)]]


LANTERN = json.dumps({"name": "lantern", "delta": 0.1, "k": 5})
FILE_CASES = [
    ("target-text-file", lambda f, o: sample(o, **{"--target": str(f / "text.pt")}),
     r"checkpoint .*text\.pt is unreadable: not a torch file"),
    ("target-empty-file", lambda f, o: sample(o, **{"--target": str(f / "empty.pt")}), r"empty\.pt is unreadable"),
    ("target-random-bytes", lambda f, o: sample(o, **{"--target": str(f / "random.pt")}), r"random\.pt is unreadable"),
    ("target-holds-a-list", lambda f, o: sample(o, **{"--target": str(f / "list.pt")}),
     r"list\.pt holds a list, not a mapping of tensors"),
    ("vq-given-as-target", lambda f, o: sample(o, **{"--target": str(TOY / "vq.pt")}), r"vq\.pt"),
    ("target-given-as-vq", lambda f, o: sample(o, **{"--vq": str(TOY / "target.pt")}), r"VQ checkpoint .*target\.pt"),
    ("target-missing", lambda f, o: sample(o, **{"--target": str(f / "nope.pt")}), r"nope\.pt does not exist"),
    ("drafter-text-file", lambda f, o: sample(o, **{"--method": '{"name": "exact"}', "--drafter": str(f / "text.pt")}),
     r"text\.pt is unreadable"),
    ("neighbours-random-bytes", lambda f, o: sample(o, **{"--method": LANTERN, "--neighbours": str(f / "random.pt")}),
     r"neighbour table .*random\.pt is unreadable"),
    ("neighbours-other-codebook", lambda f, o: sample(o, **{"--method": LANTERN, "--neighbours": str(f / "other_nb.pt")}),
     r"other_nb\.pt"),
    ("labels-word", lambda f, o: sample(o, **{"--labels": "cats"}), r"--labels 'cats' must be 'cycle' or a class id"),
    ("labels-out-of-range", lambda f, o: sample(o, **{"--labels": "99"}), r"--labels '99' must be"),
    ("method-bad-yaml", lambda f, o: sample(o, **{"--method": "{bad"}), r"--method '\{bad' is neither .* valid JSON/YAML"),
    ("method-a-list", lambda f, o: sample(o, **{"--method": "[1]"}), r"--method must be a mapping"),
    ("method-grid", lambda f, o: sample(o, **{"--method": json.dumps({"name": "lantern", "delta": [0.1, 0.2], "k": 5})}),
     r"--method\.delta = \[0\.1, 0\.2\] must be one value here"),
    ("method-unknown-key", lambda f, o: sample(o, **{"--method": json.dumps({"name": "exact", "colour": 1})}),
     r"--method\.colour is not a parameter of exact"),
    ("method-gamma-float", lambda f, o: sample(o, **{"--method": json.dumps({"name": "exact", "gamma": 2.0})}),
     r"--method\.gamma = 2\.0 must be an integer"),
    ("sampling-unknown-key", lambda f, o: sample(o, **{"--sampling": '{"cfg": 2}'}), r"--sampling has an unknown key"),
    ("sampling-bad-temperature", lambda f, o: sample(o, **{"--sampling": '{"temperature": 0}'}), r"temperature=0"),
    ("start-after-end", lambda f, o: sample(o, **{"--start": "5"}), r"need 0 <= --start < --end"),
    ("sample-unknown-flag", lambda f, o: sample(o, **{"--colour": "red"}), r"lantern sample: unrecognized arguments"),
    ("neighbours-text-vq", lambda f, o: ["neighbours", "--vq", str(f / "text.pt"), "--out", str(o)],
     r"text\.pt is unreadable"),
    ("neighbours-k-too-large", lambda f, o: ["neighbours", "--vq", str(TOY / "vq.pt"), "--out", str(o),
                                             "--params", '{"k": 9999}'], r"k=9999 exceeds"),
    ("tables-not-a-shard", lambda f, o: ["tables", "--shards", str(f / "empty_dir"), "--out", str(o)],
     r"has no stats\.csv"),
    ("figure-unknown", lambda f, o: ["figure", "nosuch", "--out", str(o) + ".png"], r"invalid choice: 'nosuch'"),
    ("prompts-not-utf8", lambda f, o: ["prompts", "--file", str(f / "latin1.csv"), "--out", str(o)],
     r"latin1\.csv is not UTF-8"),
    ("evaluate-no-images", lambda f, o: ["evaluate", "--images", str(f / "empty_dir"), "--reference",
                                         str(f / "empty_dir"), "--out", f"{o}.json"], r"holds no images"),
    ("convert-missing-args", lambda f, o: ["convert"], r"lantern convert: the following arguments are required"),
    ("methods-with-arguments", lambda f, o: ["methods", "x"], r"usage: lantern methods"),
    ("unknown-command", lambda f, o: ["sampel"], r"unknown command 'sampel'"),
]


@pytest.mark.parametrize("make_args, pattern", [pytest.param(a, p, id=i) for i, a, p in FILE_CASES])
def test_bad_file_or_argument_is_one_line(make_args, pattern, files, tmp_path, capsys):
    out = tmp_path / "out"
    rc = cli(make_args(files, out))
    captured = capsys.readouterr()
    assert rc == 2
    assert_one_line(rc, "", captured.err, pattern)
    assert not [p for p in tmp_path.iterdir()], "nothing may be written"

