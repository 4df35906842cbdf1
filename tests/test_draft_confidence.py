"""benchmarks/draft_confidence.py: its first drafts sit where the drafter trainer measures acceptance, and are drawn
from q (a draft's acceptance probability averages to the expected acceptance sum min(p, q))."""
import torch

from conftest import benchmark_script
from lantern.engine.models.drafter import Drafter
from lantern.engine.decoding.sampling import SamplingParams
from lantern.pipeline.train_drafter import drafter_losses
from tiny import tiny_target


def setup(cfg: float, n: int):
    bench = benchmark_script("draft_confidence")
    target = tiny_target()  # sharp distributions: a draft not drawn from q would pass at another rate
    torch.manual_seed(1)
    drafter = Drafter.from_target(target).eval()
    with torch.no_grad():  # fc passes the target's state through: q is the target's previous (sharp) distribution
        d = target.args.dim
        drafter.fc.weight.zero_()
        drafter.fc.weight[:, d:] = torch.eye(d)
    params = SamplingParams(cfg_scale=cfg)
    labels, tokens = bench.own_samples(target, n, params)
    return bench, target, drafter, params, labels, tokens


def test_expected_acceptance_is_the_trainers_teacher_forced_one():
    bench, target, drafter, params, labels, tokens = setup(1.0, 8)
    with torch.inference_mode():
        qx, accept, overlap = bench.first_draft_confidence(target, drafter, labels, tokens, params)
        want = drafter_losses(drafter, target, labels, tokens[:, :-1])["accept"]
    N = target.args.image_tokens
    assert qx.shape == accept.shape == overlap.shape == (8 * (N - 1),)
    assert torch.isclose(overlap.mean(), want, atol=1e-5), (overlap.mean(), want)


def test_drafts_are_drawn_from_q():
    bench, target, drafter, params, labels, tokens = setup(2.0, 64)
    with torch.inference_mode():
        qx, accept, overlap = bench.first_draft_confidence(target, drafter, labels, tokens, params)
    assert ((qx > 0) & (qx <= 1)).all() and ((accept >= 0) & (accept <= 1)).all()
    # E over x ~ q of min(1, p(x) / q(x)) is sum min(p, q), position by position
    se = (accept.var() / accept.numel()).sqrt()
    assert (accept.mean() - overlap.mean()).abs() < 4 * se, (accept.mean(), overlap.mean(), se)
