"""Speculative Jacobi decoding (engine/decoding/jacobi.py): exact in distribution, greedy == greedy AR, the registry's
`jacobi` drafting kind (no drafter), and `lantern sample` on a Jacobi point."""
import json

import pandas as pd
import pytest
import torch

from lantern.engine import methods
from lantern.engine.rules.acceptance import AcceptRule
from lantern.engine.decoding.generate import generate
from lantern.engine.decoding.jacobi import Jacobi
from lantern.engine.decoding.sampling import SamplingParams, image_generator
from lantern.errors import UserError
from lantern.pipeline.sample import main as sample
from tiny import chi_square_pvalue, decode_one, one_by_one, exact_joint, gens, one_thread, save_world, tiny_target  # noqa: F401 (fixtures)

pytestmark = pytest.mark.usefixtures("one_thread")


def decode_all(target, cond, params, rule, jacobi, generators, table=None):
    return one_by_one(target, None, cond, params, rule, jacobi, generators, table)


@pytest.mark.parametrize("cfg", [1.0, 3.0])
def test_greedy_jacobi_equals_greedy_ar(cfg):
    target = tiny_target()
    params = SamplingParams(cfg_scale=cfg, greedy=True)
    cond = torch.arange(4)
    ar, _ = generate(target, cond, params, gens(4))
    accepted = 0
    for window in (1, 3, 8, 20):
        tokens, stats = decode_all(target, cond, params, AcceptRule(), Jacobi(window), gens(4))
        assert torch.equal(tokens, ar)
        accepted += sum(s.accepted_total for s in stats)
    assert accepted > 10  # Jacobi guesses were accepted, not only one token per forward


def test_greedy_jacobi_equals_greedy_ar_t2i():
    target = tiny_target("t2i")
    cond = torch.randn(2, 5, 12)
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)
    params = SamplingParams(cfg_scale=2.0, greedy=True)
    ar, _ = generate(target, cond, params, gens(2), cond_mask=mask)
    for i, g in enumerate(gens(2)):
        tokens, _ = decode_one(target, None, cond[i : i + 1], params, AcceptRule(), Jacobi(4), g, None, mask[i : i + 1])
        assert torch.equal(tokens, ar[i])


# scale 30: peaked enough that a wrong draft distribution q (e.g. uniform for the Jacobi guesses) fails at p ~ 1e-36
@pytest.mark.parametrize("cfg, top_k, window, scale", [(2.0, 2, 2, 30.0), (1.0, 0, 3, 4.0)])
def test_jacobi_sampling_reproduces_the_target_distribution(cfg, top_k, window, scale):
    V, N, n = 3, 4, 700
    target = tiny_target(scale=scale, vocab_size=V, image_tokens=N, num_classes=2)
    params = SamplingParams(cfg_scale=cfg, top_k=top_k)
    seqs, joint = exact_joint(target, 1, params, V, N)
    index = {tuple(s): i for i, s in enumerate(seqs.tolist())}
    counts = torch.zeros(len(seqs), dtype=torch.float64)
    accepted = rejected = 0
    for i in range(n):
        tokens, s = decode_one(target, None, torch.tensor([1]), params, AcceptRule(), Jacobi(window), image_generator(11, i))
        counts[index[tuple(tokens.tolist())]] += 1
        accepted += s.accepted_total
        rejected += sum(a < d for a, d in zip(s.accepted_per_step, s.tree_depth))
    assert accepted > n / 6 and rejected > n / 20  # both paths ran often
    assert chi_square_pvalue(joint, counts, n) > 1e-3


def test_stats_account_for_every_token():
    target = tiny_target()
    for window in (2, 5):
        tokens, s = decode_one(target, None, torch.tensor([1]), SamplingParams(cfg_scale=2.0), AcceptRule(),
                                  Jacobi(window), gens(1)[0])
        assert tokens.shape == (16,) and s.drafter_forwards == 0
        assert s.target_forwards == 1 + len(s.accepted_per_step) and s.accepted_total == sum(s.accepted_per_step)
        assert 1 + sum(a + 1 for a in s.accepted_per_step) in (16, 17)
        assert all(0 <= a <= d <= window for a, d in zip(s.accepted_per_step, s.tree_depth))


def test_relaxed_rules_apply_to_jacobi_drafts():
    target = tiny_target()
    params = SamplingParams(cfg_scale=2.0)
    table = torch.stack([torch.roll(torch.arange(16), -i)[1:] for i in range(16)])
    cond = torch.arange(4).repeat(2)
    tau = lambda stats: sum(s.tau for s in stats) / len(stats)  # noqa: E731
    _, exact = decode_all(target, cond, params, AcceptRule(), Jacobi(6), gens(8))
    same, same_stats = decode_all(target, cond, params, AcceptRule("lantern", delta=0.0, k=5), Jacobi(6), gens(8), table)
    want, _ = decode_all(target, cond, params, AcceptRule(), Jacobi(6), gens(8))
    assert torch.equal(same, want) and [s.accepted_per_step for s in same_stats] == [s.accepted_per_step for s in exact]
    _, relaxed = decode_all(target, cond, params, AcceptRule("lantern", delta=0.4, k=15), Jacobi(6), gens(8), table)
    assert tau(relaxed) > tau(exact)


def test_the_registry_knows_jacobi():
    spec = methods.normalize({"name": "exact", "drafting": "jacobi", "window": 8})
    assert methods.point_name(spec) == "exact-jacobi-w8" and methods.speculative(spec)
    assert not methods.needs_drafter(spec) and not methods.needs_neighbours(spec)
    assert methods.point_name(methods.normalize({"name": "exact", "drafting": "jacobi"})) == "exact-jacobi-w16"
    assert methods.needs_neighbours(methods.normalize({"name": "lantern", "drafting": "jacobi", "delta": 0.1, "k": 5}))
    for bad, match in (({"window": 0}, "window = 0 must be >= 1"), ({"window": 2.5}, "must be an integer"),
                       ({"gamma": 4}, "gamma does not apply to exact with jacobi drafting")):
        with pytest.raises(UserError, match=match):
            methods.normalize({"name": "exact", "drafting": "jacobi", **bad})
    with pytest.raises(UserError, match="window"):
        Jacobi(0)


@pytest.mark.parametrize("mode", ["greedy", "sampling"])
def test_sample_runs_a_jacobi_point_without_a_drafter(tmp_path, mode):
    world = save_world(tmp_path, tiny_target())
    out = tmp_path / "gen"
    sample(["--target", str(world / "target.pt"), "--vq", str(world / "vq.pt"), "--method",
            json.dumps({"name": "exact", "drafting": "jacobi", "window": 4}), "--sampling", '{"cfg_scale": 2.0}',
            "--mode", mode, "--seed", "3", "--start", "0", "--end", "3", "--out", str(out), "--device", "cpu",
            "--threads", "1", "--no-warmup"])
    stats = pd.read_csv(out / "stats.csv", keep_default_na=False)
    assert len(stats) == 3 and (stats["drafter_forwards"] == 0).all() and (stats["target_forwards"] < 16).any()
    assert len(list((out / "images").glob("*.png"))) == 3
