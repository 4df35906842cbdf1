"""A bad config stops the run with one line that names the key and says how to fix it."""
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lantern.pipeline.config import (_fill_defaults, data_params, evaluate_params, expand_methods, latency_counts,
                                     load_schema, mode_shard_ranges, target_extra_images, target_params,
                                     validate_config, vq_params)
from lantern.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


def lantern_method(**kw):
    return {"sweep": {"methods": [{"name": "lantern", "delta": [0.1], "k": [5], **kw}]}}


@pytest.mark.parametrize("cfg, message", [
    ({"sedd": 1}, r"unknown key sedd; allowed keys there: .*seed"),
    ({"sweep": {"bogus": 1}}, r"unknown key sweep\.bogus"),
    ({"seed": "zero"}, r"seed = 'zero' has the wrong type; it must be an integer"),
    ({"sampling": {"top_p": 1.5}}, r"sampling\.top_p"),
    (lantern_method(delta=[-0.1]), r"sweep\.methods\[0\]\.delta = -0\.1 must be >= 0"),
    (lantern_method(k=[10_000]), r"k = 10000 is larger than neighbours\.max_k"),
    ({"neighbours": {"max_k": 600}}, r"neighbours\.max_k = 600 exceeds the codebook's 511 other codes"),
    ({"sweep": {"methods": [{"name": "lanternpp", "lam": [1.0], "k": [5]}]}}, r"lam = 1\.0 must be > 1"),
    ({"sweep": {"methods": [{"name": "lanternpp", "k": [5]}]}}, r"needs lam"),
    ({"world": "llamagen", "llamagen": {"gpt_ckpt": "/nope/c2i_B_256.pt", "vq_ckpt": "x"}},
     r"llamagen\.gpt_ckpt = /nope/c2i_B_256\.pt does not exist"),
    ({"metrics": {"fid_extractor": "inception-v3-compat"}}, r"metrics\.inception_weights is empty"),
    ({"device": "gpu"}, r"device"),
    ({"metrics": {"bootstrap_chunk": 0}}, r"metrics\.bootstrap_chunk"),
    ({"toy": {"drafter": {"checkpoint_every": -5}}}, r"toy\.drafter\.checkpoint_every"),
    ({"toy": {"drafter": {"checkpoint_every": 2.5}}}, r"toy\.drafter\.checkpoint_every"),
    ({"metrics": {"bootstrap_chunk": 512.0}}, r"metrics\.bootstrap_chunk"),
    ({"metrics": {"clip_model": "ViT-B-32", "clip_ckpt": "/x"}}, r"fid_extractor = clip uses the toy CLIP"),
    (lantern_method(delta=[1.5]), r"delta = 1\.5 exceeds 1"),
    (lantern_method(delta=[float("nan")]), r"delta = nan must be a finite number"),
    (lantern_method(k=[float("inf")]), r"k = inf must be a finite number"),
    (lantern_method(gamma=4.0), r"gamma = 4\.0 must be an integer; write 4"),
    (lantern_method(lam=[2]), r"\.lam does not apply to lantern with chain drafting \(it takes drafting, delta, k, residual, gamma, skip\); remove it"),
    ({"sweep": {"methods": [{"name": "exact", "k": 5}]}}, r"\.k does not apply to exact"),
    ({"sweep": {"methods": [{"name": "lanternpp", "lam": 2, "k": 5, "delta": 0.1}]}}, r"\.delta does not apply"),
    ({"sweep": {"methods": []}}, r"sweep\.methods is empty"),
    ({"sweep": {"modes": []}}, r"sweep\.modes is empty"),
    ({"sweep": {"n_images": 2, "shards": 3}}, r"sweep\.shards = 3 is more than sweep\.n_images = 2"),
    ({"sweep": {"modes": ["greedy"], "n_images": 20, "mode_images": {"greedy": 1}}},
     r"mode_images\.greedy = 1 is fewer than sweep\.shards \(2\): every shard needs an image"),
    ({"sweep": {"modes": ["greedy"], "n_images": 200, "shards": 2, "batch_size": {"greedy": 8}, "mode_images": {"greedy": 199}}},
     r"mode_images\.greedy = 199 puts 99 images in shard 0, which holds 96"),
    ({"sweep": {"methods": [{"name": "exact", "drafting": "static", "tree": [[0], [0, 1]]}]}}, r"\.tree: "),
])
def test_bad_config_names_the_key(cfg, message):
    with pytest.raises(UserError, match=message) as err:
        validate_config(cfg)
    assert "\n" not in str(err.value)


def test_mode_images_take_the_first_images_of_each_shard():
    """A mode with fewer images keeps the sweep's shard starts (index, seed, caption shard of every image unchanged)."""
    cfg = validate_config({"sweep": {"modes": ["sampling", "greedy"], "n_images": 200, "shards": 2,
                                     "batch_size": {"sampling": 8, "greedy": 8}, "mode_images": {"greedy": 33}}})
    assert mode_shard_ranges(cfg["sweep"], "sampling") == [(0, 96), (96, 200)]
    assert mode_shard_ranges(cfg["sweep"], "greedy") == [(0, 16), (96, 113)]


def test_latency_images_are_each_modes_first_images_whatever_the_shards():
    """sweep.latency_images counts the mode's images in index order: the sampling shards' first 96 + 16, the greedy
    shards' 16 + 17 (its first of each shard); with one shard, the prefix."""
    sweep = {"modes": ["sampling", "greedy"], "n_images": 200, "batch_size": {"sampling": 8, "greedy": 8},
             "mode_images": {"greedy": 33}, "latency_images": 112}
    cfg = validate_config({"sweep": {**sweep, "shards": 2}})
    assert latency_counts(cfg["sweep"], "sampling") == [96, 16]
    assert latency_counts(cfg["sweep"], "greedy") == [16, 17]
    one = validate_config({"sweep": {**sweep, "shards": 1, "latency_images": 32}})
    assert latency_counts(one["sweep"], "sampling") == [32] and latency_counts(one["sweep"], "greedy") == [32]
    with pytest.raises(UserError, match=r"sweep\.latency_images = 12 must be a multiple of every mode's batch size \(8\)"):
        validate_config({"sweep": {**sweep, "shards": 1, "latency_images": 12}})


def test_mode_images_of_a_mode_that_does_not_run_are_ignored():
    """A layered config that drops greedy cannot delete the default's mode_images.greedy (Snakemake merges dicts), so
    that entry is left unread even where it would be out of range, and null lifts the limit (the real-model recipes);
    a mode name that does not exist is still refused."""
    cfg = validate_config({"sweep": {"modes": ["sampling"], "n_images": 4, "mode_images": {"greedy": 32}}})
    assert mode_shard_ranges(cfg["sweep"], "sampling") == [(0, 2), (2, 4)]
    lifted = validate_config({"sweep": {"modes": ["greedy"], "n_images": 4, "mode_images": {"greedy": None}}})
    assert mode_shard_ranges(lifted["sweep"], "greedy") == [(0, 2), (2, 4)]
    capped = validate_config({"sweep": {"modes": ["greedy"], "n_images": 4, "mode_images": {"greedy": 30}}})
    assert mode_shard_ranges(capped["sweep"], "greedy") == [(0, 2), (2, 4)]  # a cap, never a demand
    with pytest.raises(UserError, match="gredy") as err:
        validate_config({"sweep": {"mode_images": {"gredy": 32}}})
    assert "\n" not in str(err.value)


def test_defaults_are_filled_and_grid_expands():
    cfg = validate_config({"sweep": {"methods": [
        {"name": "vanilla"}, {"name": "exact", "gamma": [4, 8]},
        {"name": "lantern", "delta": [0.1, 0.2], "k": [5, 10]},
    ]}})
    assert cfg["sampling"]["cfg_scale"] == 2.0 and cfg["neighbours"]["metric"] == "l2"
    points = expand_methods(cfg)
    assert sorted(points) == sorted([
        "vanilla", "vanilla-control", "exact-chain-g4", "exact-chain-g8",
        "lantern-chain-g4-d0.1-k5", "lantern-chain-g4-d0.1-k10", "lantern-chain-g4-d0.2-k5", "lantern-chain-g4-d0.2-k10",
    ])
    assert points["vanilla-control"]["seed"] != points["vanilla"]["seed"]


def test_clean_world_overrides_only_its_own_keys():
    cfg = validate_config({"toy": {"data": {"noise_sigma": 0.08, "n_train": 10}, "target": {"steps": 4000, "dim": 96},
                                   "clean_target": {"steps": 600}}})
    assert target_params(cfg, "default") == {"steps": 4000, "dim": 96, "num_classes": 16}
    assert target_params(cfg, "clean") == {"steps": 600, "dim": 96, "num_classes": 16}
    cfg["toy"].update(vq={"steps": 1500, "codebook_size": 2048}, clean_vq={"codebook_size": 512})
    assert vq_params(cfg, "default") == {"steps": 1500, "codebook_size": 2048}
    assert vq_params(cfg, "clean") == {"steps": 1500, "codebook_size": 512}
    assert data_params(cfg, "default") == {"noise_sigma": 0.08}
    assert data_params(cfg, "clean")["noise_sigma"] == 0.0


def test_extra_images_size_the_targets_data_not_its_model():
    cfg = validate_config({"toy": {"target": {"steps": 4000, "extra_images": 800}}})
    assert target_params(cfg, "default") == {"steps": 4000, "num_classes": 16} == target_params(cfg, "clean")
    assert target_extra_images(cfg, "default") == 800 == target_extra_images(cfg, "clean")  # inherited
    cfg["toy"]["clean_target"] = {"extra_images": 0}
    assert (target_extra_images(cfg, "default"), target_extra_images(cfg, "clean")) == (800, 0)
    assert target_extra_images(validate_config({}), "default") == 0
    for where in ("target", "clean_target"):
        with pytest.raises(UserError, match="extra_images"):
            validate_config({"toy": {where: {"extra_images": -1}}})


def test_the_target_has_the_datas_classes():
    # a target with more classes than its data would sample (and the sweep would ask it for) classes it never saw
    cfg = validate_config({"toy": {"data": {"num_classes": 6}}})
    assert target_params(cfg, "default")["num_classes"] == 6 == target_params(cfg, "clean")["num_classes"]
    with pytest.raises(UserError, match="toy.target.num_classes is 16 but toy.data.num_classes is 6"):
        validate_config({"toy": {"data": {"num_classes": 6}, "target": {"num_classes": 16}}})


def test_shipped_configs_are_valid():
    for name in ("config.yaml", "smoke.yaml"):
        path = ROOT / "config" / name
        if path.exists():
            validate_config(yaml.safe_load(path.read_text()) or {})
    base = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    scan = yaml.safe_load((ROOT / "config" / "lantern-k-scan.yaml").read_text())
    validate_config({**base, **scan, "sweep": {**base["sweep"], **scan["sweep"]}})
    band = yaml.safe_load((ROOT / "config" / "band-1024.yaml").read_text())
    cfg = validate_config({**base, **band, "sweep": {**base["sweep"], **band["sweep"]}})
    assert cfg["sweep"]["n_images"] == 1024 and cfg["sweep"]["modes"] == ["sampling"]
    assert validate_config(base)["toy"]["drafter"]["feature_layers"] == [7, 15, 23]  # the shipped drafter's recipe
    eagle1 = yaml.safe_load((ROOT / "config" / "drafter-eagle1.yaml").read_text())
    cfg = validate_config({**base, **eagle1, "toy": {**base["toy"], **eagle1["toy"]}})
    assert cfg["toy"]["drafter"]["feature_layers"] == [] and cfg["toy"]["drafter"]["unroll"] == 1
    gpu = yaml.safe_load((ROOT / "config" / "gpu-toy.yaml").read_text())
    cfg = validate_config({**base, **gpu, "sweep": {**base["sweep"], **gpu["sweep"]}})
    assert cfg["device"] == "cuda" and cfg["compile"] is True and cfg["sweep"]["latency_images"] == 32


def test_snakemake_stops_before_any_job_with_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(lantern_method(delta=[-0.5])))
    out = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--configfile", str(bad)],
        cwd=ROOT, capture_output=True, text=True, timeout=3600,  # a hang guard only
    )
    assert out.returncode != 0
    assert "error: config: sweep.methods[0].delta = -0.5 must be >= 0" in out.stderr


def test_llamagen_checks_that_would_fail_only_after_generation(tmp_path):
    """Mistakes a job would hit after the whole sweep ran are config errors (the files need only exist here)."""
    for name in ("gpt.pt", "vq.pt", "inception.pth"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "images").mkdir()
    base = {"world": "llamagen", "llamagen": {"gpt_ckpt": str(tmp_path / "gpt.pt"), "vq_ckpt": str(tmp_path / "vq.pt")},
            "metrics": {"reference": str(tmp_path / "images"), "resolution": 256, "class_names": "imagenet",
                        "fid_extractor": "inception-v3-compat", "inception_weights": str(tmp_path / "inception.pth")},
            "sweep": {"methods": [{"name": "vanilla"}]}}
    cases = [
        ({"metrics": {"resolution": 0}}, r"metrics\.resolution = 0 .* set metrics\.resolution"),
        ({"metrics": {"class_names": "toy"}}, r"metrics\.class_names = toy .* needs imagenet"),
        ({"sweep": {"methods": [{"name": "exact"}]}, "llamagen": {"drafter": {"images": str(tmp_path / "images"),
                                                                              "n_images": 2, "shards": 4}}},
         r"llamagen\.drafter\.shards = 4 is more than llamagen\.drafter\.n_images = 2"),
    ]
    for over, message in cases:
        cfg = yaml.safe_load(yaml.safe_dump(base))
        for key, value in over.items():
            cfg[key] = {**cfg.get(key, {}), **value}
        with pytest.raises(UserError, match=message) as err:
            validate_config(cfg)
        assert "\n" not in str(err.value)


def test_hpsv2_weights_are_named_before_any_job_and_reach_evaluate(tmp_path):
    """A t2i llamagen run with HPS v2.1 on: its missing weights file is one line naming metrics.hpsv2.weights_path
    (the files need only exist here); placed, the check passes on to the next input. A c2i run has no prompts to
    score against. evaluate_params hands the section to `lantern evaluate` only when it is on."""
    for name in ("gpt.pt", "vq.pt", "inception.pth", "prompts.csv"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "images").mkdir()
    (tmp_path / "t5").mkdir()
    hps = tmp_path / "HPS_v2.1_compressed.pt"
    cfg = {"world": "llamagen",
           "llamagen": {"model_type": "t2i", "cls_token_num": 120, "gpt_ckpt": str(tmp_path / "gpt.pt"),
                        "vq_ckpt": str(tmp_path / "vq.pt"), "prompts": {"file": str(tmp_path / "prompts.csv")},
                        "t5": {"path": str(tmp_path / "t5")}},
           "metrics": {"reference": str(tmp_path / "images"), "resolution": 256,
                       "fid_extractor": "inception-v3-compat", "inception_weights": str(tmp_path / "inception.pth"),
                       "hpsv2": {"enabled": True, "weights_path": str(hps)}},
           "sweep": {"methods": [{"name": "vanilla"}]}}
    with pytest.raises(UserError) as err:
        validate_config(cfg)
    assert str(err.value) == (f"config: HPS v2.1 weights not found at {hps}: put HPS_v2.1_compressed.pt there and "
                              "point metrics.hpsv2.weights_path at it, or set metrics.hpsv2.enabled: false")
    hps.write_bytes(b"")
    with pytest.raises(UserError) as err:  # past the HPS check, the empty VQ file is the next input refused
        validate_config(cfg)
    assert str(err.value).startswith("config: llamagen.vq_ckpt: ") and "HPS" not in str(err.value)
    c2i = yaml.safe_load(yaml.safe_dump(cfg))
    c2i["llamagen"] = {"gpt_ckpt": str(tmp_path / "gpt.pt"), "vq_ckpt": str(tmp_path / "vq.pt")}
    c2i["metrics"]["class_names"] = "imagenet"
    with pytest.raises(UserError, match=r"^config: metrics\.hpsv2\.enabled: .* llamagen world here is class-cond"):
        validate_config(c2i)
    filled = yaml.safe_load(yaml.safe_dump(cfg))
    _fill_defaults(filled, load_schema())  # what validate_config hands the Snakefile
    assert evaluate_params(filled, "clip.pt")["hpsv2"] == {"enabled": True, "model": "ViT-H-14",
                                                           "weights_path": str(hps), "batch_size": 16}
    filled["metrics"]["hpsv2"]["enabled"] = False
    assert "hpsv2" not in evaluate_params(filled, "clip.pt")


@pytest.mark.parametrize("toy, message", [
    ({"target": {"lerning_rate": 1}}, r"^config: toy\.target: unknown key toy\.target\.lerning_rate"),
    ({"clean_target": {"lerning_rate": 1}}, r"^config: toy\.target \(with toy\.clean_target, clean world\)"),
    ({"data": {"noise_sigma": -1}}, r"^config: toy\.data: .*noise_sigma"),
    ({"ambiguity": {"cfg_scales": [0.5]}}, r"^config: toy\.ambiguity: cfg_scales"),
    ({"drafter": {"epochs": 0}}, r"^config: toy\.drafter: drafter epochs"),
    ({"drafter": {"threads": -1}}, r"^config: toy\.drafter: drafter threads=-1 must be >= 0"),
    ({"drafter": {"feature_layers": [15, 7]}}, r"^config: toy\.drafter: drafter feature_layers=\[15, 7\] must be increas"),
    ({"target": {"n_layer": 32}, "drafter": {"feature_layers": [7, 31]}},
     r"^config: toy\.drafter \(toy\.target\.n_layer 32\): drafter feature_layers \[7, 31\] must lie below the "
     r"target's last layer \(31: its output is h_t"),
    ({"clip": {"threads": -1}}, r"^config: toy\.clip: train-clip threads=-1"),
    ({"classifier": {"threads": -1}}, r"^config: toy\.classifier: train-classifier threads=-1"),
])
def test_toy_hyperparameters_are_checked_before_any_job(toy, message):
    with pytest.raises(UserError, match=message):
        validate_config({"toy": toy})


def test_the_default_config_validates_without_importing_torch():
    """The Snakefile validates the config at every start, twice in each SLURM job, and a dry run is what users
    wait on: importing torch there (for the hyperparameter classes, the tree shapes, the rules) cost ~6 s each."""
    code = ("import sys, yaml\n"
            "from lantern.pipeline.config import validate_config\n"
            "import lantern.engine.methods, lantern.pipeline.config\n"
            "validate_config(yaml.safe_load(open('config/config.yaml')))\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('open_clip')))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
