"""lantern.metrics.economics: the ratio arithmetic, and the timing harness on a tiny target and drafter."""
import pytest

from lantern.engine.models.drafter import Drafter
from lantern.metrics.economics import StepCosts, ratios, round_costs, step_costs
from tiny import tiny_target


def test_ratios_divide_by_the_one_token_step():
    c = StepCosts(batch=8, rows=16, positions=5, target_step_s=0.010, verify_s=0.012, drafter_step_s=0.0007)
    r = ratios(c)
    assert r["drafter_over_step"] == pytest.approx(0.07)
    assert r["verify_over_step"] == pytest.approx(1.2)


def test_ratios_refuse_a_zero_step():
    with pytest.raises(ValueError, match="target step"):
        ratios(StepCosts(batch=1, rows=2, positions=5, target_step_s=0.0, verify_s=1.0, drafter_step_s=1.0))


@pytest.mark.parametrize("cfg, rows", [(True, 6), (False, 3)])
def test_step_costs_time_every_call_and_leave_no_cache(cfg, rows):
    target = tiny_target()
    drafter = Drafter.from_target(target).eval()
    c = step_costs(target, drafter, batch=3, cfg=cfg, positions=4, repeats=3, warmup=1)
    assert (c.batch, c.rows, c.positions) == (3, rows, 4)
    assert min(c.target_step_s, c.verify_s, c.drafter_step_s) > 0
    assert target.layers[0].attention.kv_cache is None and drafter.layer.attention.kv_cache is None


def test_round_costs_price_a_round_in_plain_ar_steps():
    ar = [{"time_total_s": 0.64, "target_forwards": 64}, {"time_total_s": 0.64, "target_forwards": 64}]  # 10 ms / step
    spec = [{"time_draft_s": 0.08, "time_verify_s": 0.24, "time_other_s": 0.02, "time_total_s": 0.34,
             "target_forwards": 20, "n_tokens": 64}] * 2
    r = round_costs(spec, ar)
    assert r["draft_steps"] == pytest.approx(0.4) and r["verify_steps"] == pytest.approx(1.2)
    assert r["other_steps"] == pytest.approx(0.1) and r["round_steps"] == pytest.approx(1.7)
    assert r["tau"] == pytest.approx(3.2) and r["speedup"] == pytest.approx(1.28 / 0.68)
    assert r["speedup"] == pytest.approx(r["tau"] / r["round_steps"])  # the same images: tokens per step cancel
    with pytest.raises(ValueError, match="at least one image"):
        round_costs([], ar)
