"""LANTERN-TV, Cool-SD and GSD through the real decoder (chain and static tree, sampling and greedy) on a tiny
trained target: switched off they are token-identical to exact decoding under the same generators; switched on
they decode valid images and leave exact decoding's path."""

import pytest
import torch

from lantern.engine import methods
from lantern.engine.rules.acceptance import AcceptRule
from lantern.engine.rules.peers import CoolRule, GroupRule
from lantern.engine.rules.retarget import RetargetRule
from lantern.engine.decoding.sampling import SamplingParams
from test_acceptance import rand_table
from tiny import decode_one, gens, one_thread, trained  # noqa: F401 (fixtures)

OFF = {
    "lanterntv": AcceptRule("lanterntv", k=3, impl=RetargetRule(0.0, 3)),
    "coolsd": AcceptRule("coolsd", impl=CoolRule(1.0, 0.0, 0.0)),
    "gsd": AcceptRule("gsd", k=3, impl=GroupRule(1, 3, 0.15)),
}
DRAFTS = {"chain": {"drafting": "chain", "gamma": 3}, "static": {"drafting": "static", "tree": "twin_chain_8"}}


def decode(trained, rule, drafting, params, n=3):
    target, drafter = trained
    table = rand_table(torch.Generator().manual_seed(0), 16)
    draft = methods.drafting({"name": "exact", **DRAFTS[drafting]})
    out = []
    for i, g in enumerate(gens(n, seed=5)):
        tokens, stats = decode_one(target, drafter, torch.tensor([i % 4]), params, rule, draft, g, table)
        out.append((tokens.tolist(), stats))
    return out


@pytest.mark.parametrize("name", OFF)
@pytest.mark.parametrize("drafting", DRAFTS)
@pytest.mark.parametrize("greedy", [False, True])
def test_switched_off_rules_decode_token_for_token_like_exact(trained, name, drafting, greedy):
    params = SamplingParams(cfg_scale=2.0, greedy=greedy)
    got = decode(trained, OFF[name], drafting, params)
    want = decode(trained, AcceptRule("exact"), drafting, params)
    assert [t for t, _ in got] == [t for t, _ in want]


@pytest.mark.parametrize("spec", [
    {"name": "lanterntv", "delta": 0.4, "k": 3},
    {"name": "coolsd", "scale": 4.0, "nu": 0.2, "mu": 0.0},
    {"name": "gsd", "group": 6, "k": 5, "gap": 0.5},
])
@pytest.mark.parametrize("drafting", DRAFTS)
def test_relaxed_rules_decode_and_change_the_output(trained, spec, drafting):
    rule = methods.rule(methods.normalize({**spec, "drafting": "chain"}))
    for greedy in (False, True):
        params = SamplingParams(cfg_scale=2.0, greedy=greedy)
        got = decode(trained, rule, drafting, params, n=4)
        assert all(len(t) == 16 and 0 <= min(t) and max(t) < 16 for t, _ in got)
        if not greedy:  # the relaxation is live: some image leaves exact decoding's path
            exact = decode(trained, AcceptRule("exact"), drafting, params, n=4)
            assert [t for t, _ in got] != [t for t, _ in exact]


def test_cool_sd_runs_through_lantern_sample_without_a_neighbour_table(tmp_path):
    """Cool-SD reads no neighbours: the workflow gives its jobs no table, and `lantern sample` must not ask for one."""
    import json

    import pandas as pd

    from lantern.pipeline.sample import main as sample
    from tiny import save_world, tiny_target

    spec = {"name": "coolsd", "drafting": "chain", "gamma": 3, "scale": 2.0, "nu": 0.1}
    assert not methods.needs_neighbours(methods.normalize(spec))
    world = save_world(tmp_path, tiny_target())
    out = tmp_path / "gen"
    sample(["--target", str(world / "target.pt"), "--vq", str(world / "vq.pt"), "--drafter", str(world / "drafter.pt"),
            "--method", json.dumps(spec), "--start", "0", "--end", "2", "--out", str(out), "--device", "cpu",
            "--threads", "1", "--no-warmup"])
    assert len(pd.read_csv(out / "stats.csv")) == 2
