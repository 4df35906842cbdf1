"""The method registry: one owner for parameters, point names, labels and decoders; a new rule is one spec + one
function, run here through config validation, a sweep point, `lantern sample` and `lantern tables`."""
import json

import pandas as pd
import pytest
import torch

from lantern.engine import methods
from lantern.engine.rules.acceptance import AcceptRule, relaxed_mass
from lantern.engine.methods import K, RESIDUAL, Family, Param, decoder_spec, expand, mode_points, shape_key
from lantern.engine.rules.neighbours import main as neighbours
from lantern.errors import UserError
from lantern.pipeline.cli import main as cli
from lantern.pipeline.config import expand_methods, validate_config
from lantern.pipeline.sample import main as sample
from lantern.pipeline.tables import main as tables
from tiny import one_thread, save_world, tiny_target  # noqa: F401 - fixture

DEFAULT_POINTS = [
    "vanilla", "vanilla-control", "exact-chain-g4", "exact-dynamic", "lantern-chain-g4-d0.05-k5",
    "lanternpp-static-naive_extend_57-l5-k50", "lanternpp-dynamic-l5-k50",
]


def points(*entries, neighbours=None, **sweep):
    cfg = validate_config({"sweep": {"methods": list(entries), **sweep}, **({"neighbours": neighbours} if neighbours else {})})
    return expand_methods(cfg)


def test_point_names_are_stable_and_canonical():
    got = points({"name": "vanilla"}, {"name": "exact", "drafting": "chain", "gamma": 4}, {"name": "exact", "drafting": "dynamic"},
                 {"name": "lantern", "delta": 0.05, "k": 5},
                 {"name": "lanternpp", "drafting": "static", "lam": 5, "k": 50},
                 {"name": "lanternpp", "drafting": "dynamic", "lam": 5, "k": 50})
    assert list(got) == DEFAULT_POINTS
    # defaults are filled, and nothing that does not apply is kept
    assert got["exact-dynamic"] == {"name": "exact", "drafting": "dynamic", "total_tokens": 59, "depth": 4,
                                    "top_k": 10, "seed": 0}
    assert "residual" not in got["exact-chain-g4"] and "gamma" not in got["lanternpp-dynamic-l5-k50"]


def test_every_parameter_that_changes_the_output_is_in_the_name():
    got = points({"name": "exact", "drafting": "dynamic", "total_tokens": [20, 59], "top_k": 4},
                 {"name": "lantern", "delta": 0.1, "k": 5, "residual": ["bounded", "reference"]},
                 {"name": "exact", "drafting": "static", "tree": "chain", "gamma": 3},
                 {"name": "exact", "drafting": "static", "tree": [[0], [1], [0, 0]]})
    assert set(got) == {"exact-dynamic-n20-top4", "exact-dynamic-top4", "lantern-chain-g4-d0.1-k5",
                        "lantern-chain-g4-d0.1-k5-reference", "exact-static-chain-g3", "exact-static-custome93fa0d6"}


@pytest.mark.parametrize("entries, message", [
    ([{"name": "lantern", "delta": 0.1, "k": 5}, {"name": "lantern", "delta": [0.2, 0.1], "k": 5}],
     r"sweep\.methods\[1\] repeats the point lantern-chain-g4-d0\.1-k5 of sweep\.methods\[0\]"),
    ([{"name": "exact", "drafting": "chain", "gamma": 4}, {"name": "exact"}], r"repeats the point exact-chain-g4"),
    ([{"name": "lantern", "drafting": "dynamic", "delta": 0.1, "k": 5, "gamma": 4}],
     r"\.gamma does not apply to lantern with dynamic drafting"),
    ([{"name": "exact", "drafting": "chain", "tree": "chain"}], r"\.tree does not apply to exact with chain"),
    ([{"name": "exact", "drafting": "static", "gamma": 4}], r"\.gamma does not apply to exact with static drafting"),
    ([{"name": "vanilla", "drafting": "chain"}], r"\.drafting does not apply to vanilla"),
    ([{"name": "exact", "colour": "red"}], r"\.colour is not a parameter of exact"),
    ([{"name": "lantern", "delta": [], "k": 5}], r"\.delta is an empty list"),
    ([{"name": "lantern", "delta": 0.1, "k": 5, "residual": "loose"}], r"\.residual = 'loose' is not allowed"),
    ([{"name": "exact", "drafting": "dynamic", "depth": 0}], r"\.depth = 0 must be >= 1"),
    ([{"name": "exact", "drafting": "static", "tree": "bushy"}], r"\.tree = 'bushy' is not a static tree"),
    ([{"name": "medusa"}], r"\.name = 'medusa' is not a method; use one of vanilla, exact, lantern, lanternpp"),
])
def test_registry_refuses_bad_entries_in_one_line(entries, message):
    with pytest.raises(UserError, match=message) as err:
        points(*entries)
    assert "\n" not in str(err.value) and str(err.value).startswith("config: ")


def test_sample_takes_one_point_not_a_grid():
    with pytest.raises(UserError, match=r"--method\.delta = \[0\.1, 0\.2\] must be one value here"):
        methods.normalize({"name": "lantern", "delta": [0.1, 0.2], "k": 5}, "--method")


def test_methods_command_lists_every_family_and_parameter(capsys):
    assert cli(["methods"]) == 0
    out = capsys.readouterr().out
    for word in [*methods.FAMILIES, *methods.DRAFTINGS, "delta (float, required", "total_tokens (int, default 59"]:
        assert word in out


# -- a new acceptance rule: one spec + one function -------------------------------------------------------------
def half_budget(spec: dict, p_x: torch.Tensor) -> torch.Tensor:
    """The rule under test: a draft x may claim neighbour mass up to `share` times its own probability."""
    return spec["share"] * p_x


SHARE = Param("share", "neighbour mass a draft may claim, relative to its own probability", low=0.0, tag="s",
              symbol="σ", relaxation=True)
HALF = Family("half", "Half-share", "toy relaxed rule for the registry test", (SHARE, K, RESIDUAL), bound=half_budget)


@pytest.fixture
def half_registered():
    methods.register(HALF)
    yield HALF
    del methods.FAMILIES[HALF.name]


def test_a_registered_family_builds_its_own_relaxed_rule(half_registered):
    rule = methods.rule(methods.normalize({"name": "half", "share": 1.0, "k": 2}))
    assert isinstance(rule, AcceptRule) and rule.relaxed and rule.table_width == 2
    p = torch.tensor([0.3, 0.2, 0.1, 0.4])
    table = torch.tensor([[1, 2], [0, 2], [1, 0], [0, 1]])
    c, m = relaxed_mass(p.expand(2, -1), torch.tensor([0, 2]), table, rule)
    # x = 0 (p 0.3): neighbours 1, 2 have cumulative mass 0.2, 0.3 <= 0.3; x = 2 (p 0.1): 0.2 > 0.1 already
    assert torch.allclose(c, torch.tensor([0.3, 0.0])) and m.tolist() == [2, 0]


@pytest.fixture(scope="module")
def c2i_world(tmp_path_factory):
    root = tmp_path_factory.mktemp("c2i")
    save_world(root, tiny_target())
    neighbours(["--vq", str(root / "vq.pt"), "--out", str(root / "nb.pt"), "--params", '{"k": 8}'])
    return root


def draw(world, out, spec: dict, mode: str) -> pd.DataFrame:
    sample(["--target", str(world / "target.pt"), "--vq", str(world / "vq.pt"), "--drafter", str(world / "drafter.pt"),
            "--neighbours", str(world / "nb.pt"), "--method", json.dumps(spec), "--sampling", '{"cfg_scale": 2.0}',
            "--mode", mode, "--seed", "3", "--start", "0", "--end", "3", "--out", str(out), "--device", "cpu",
            "--threads", "1", "--no-warmup"])
    return pd.read_csv(out / "stats.csv", keep_default_na=False)


@pytest.mark.parametrize("mode", ["greedy", "sampling"])
def test_a_new_rule_runs_through_a_sweep_point(half_registered, c2i_world, tmp_path, mode, one_thread):  # noqa: F811
    sweep = points({"name": "half", "share": [0.0, 4.0], "k": 8, "gamma": 3}, {"name": "exact", "gamma": 3},
                   neighbours={"max_k": 8}, modes=[mode])
    assert set(sweep) == {"half-chain-g3-s0-k8", "half-chain-g3-s4-k8", "exact-chain-g3"}
    gen = tmp_path / "gen" / mode
    stats = {name: draw(c2i_world, gen / name / "shard0", spec, mode) for name, spec in sweep.items()}
    # share 0 claims nothing: the same tokens as exact speculative decoding, through the same loop
    assert stats["half-chain-g3-s0-k8"]["tokens"].tolist() == stats["exact-chain-g3"]["tokens"].tolist()
    relaxed = stats["half-chain-g3-s4-k8"]
    assert (relaxed["n_tokens"] == 16).all() and (relaxed["target_forwards"] >= 1).all()

    tables(["--shards", *[str(gen / name / "shard0") for name in sweep], "--out", str(tmp_path / "tables")])
    table = pd.read_csv(tmp_path / "tables" / "sweep.csv")
    row = table[table["point"] == "half-chain-g3-s4-k8"].iloc[0]
    assert row["name"] == "half" and row["share"] == 4.0 and row["k"] == 8
    summary = (tmp_path / "tables" / "summary.md").read_text()
    assert "Half-share" in summary and "σ=4" in summary


def test_greedy_mode_runs_no_control_point():
    points = expand([{"name": "vanilla"}, {"name": "exact", "drafting": "chain", "gamma": 4}], seed=0, control_seed=1)
    assert "vanilla-control" in points and mode_points(points, "sampling") == points
    assert list(mode_points(points, "greedy")) == [n for n in points if n != "vanilla-control"]


def test_an_entrys_modes_limit_its_points_to_those_modes_and_never_reach_the_decoder():
    points = expand([{"name": "vanilla"}, {"name": "exact", "drafting": "chain", "gamma": 4},
                     {"name": "lantern", "delta": [0.1, 0.2], "k": 4, "modes": ["sampling"]}], seed=0, control_seed=1)
    relaxed = ["lantern-chain-g4-d0.1-k4", "lantern-chain-g4-d0.2-k4"]
    assert all(points[n]["modes"] == ["sampling"] for n in relaxed)
    assert set(relaxed) <= set(mode_points(points, "sampling"))
    assert list(mode_points(points, "greedy")) == ["vanilla", "exact-chain-g4"]
    assert decoder_spec(points[relaxed[0]]) == {"name": "lantern", "drafting": "chain", "gamma": 4, "delta": 0.1,
                                                 "k": 4, "residual": "bounded", "seed": 0}
    assert shape_key(points[relaxed[0]]) == shape_key(points[relaxed[1]])  # still one delta curve
    for bad in (["beam"], [], "sampling"):
        with pytest.raises(UserError, match=r"sweep.methods\[0\].modes = .* must be a non-empty list of decoding modes"):
            expand([{"name": "vanilla", "modes": bad}], seed=0)


def test_config_refuses_a_vanilla_left_out_of_a_mode_that_runs_other_points():
    with pytest.raises(UserError, match="vanilla's modes leave greedy out"):
        points({"name": "vanilla", "modes": ["sampling"]}, {"name": "exact", "drafting": "chain"},
               modes=["sampling", "greedy"])
    assert list(points({"name": "vanilla", "modes": ["sampling"]}, modes=["sampling", "greedy"])) == [
        "vanilla", "vanilla-control"]  # greedy then runs nothing: nothing to compare
