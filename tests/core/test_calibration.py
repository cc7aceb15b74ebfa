"""The critical-batch calibration's fits and the efficiency mappings the planner uses."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from copus.core.calibration import (
    CalibratedMapping,
    NoiseScaleMapping,
    branch_fit_from_dict,
    fit_branch,
    mapping_from_calibration,
    samples_to_decrement,
    smoothed_crossing,
    with_noise_scales,
)
from copus.core.layout import CandidateConfig
from copus.core.planner import Planner, SwitchCosts
from copus.core.policies import decide

GRID = [4, 8, 16, 32, 64]


def mccandlish_points(b_crit: float, e_min: float, rel_noise: float, seeds: int, rng) -> dict[int, list[float]]:
    return {b: list(e_min * (1 + b / b_crit) * (1 + rel_noise * rng.standard_normal(seeds))) for b in GRID}


def test_samples_to_decrement_interpolates_the_first_crossing():
    assert samples_to_decrement([0, 100, 200], [3.0, 2.9, 2.7], 2.8) == pytest.approx(150.0)
    assert samples_to_decrement([0, 100, 200, 300], [3.0, 2.7, 2.9, 2.6], 2.8) == pytest.approx(200 / 3)
    assert math.isnan(samples_to_decrement([0, 100], [3.0, 2.95], 2.8))


@settings(max_examples=30, deadline=None)
@given(b_crit=st.floats(3.0, 200.0), e_min=st.floats(50.0, 5000.0))
def test_noise_free_sweeps_give_back_the_critical_batch(b_crit, e_min):
    points = {b: [e_min * (1 + b / b_crit)] * 2 for b in GRID}
    fit = fit_branch(3.0, 0.1, 320, points, b0=16)
    assert fit.b_crit == pytest.approx(b_crit, rel=1e-6)
    assert fit.e_min == pytest.approx(e_min, rel=1e-6) and fit.fit_ok
    assert fit.efficiency[GRID.index(16)] == pytest.approx(1.0)
    assert fit.efficiency[GRID.index(64)] == pytest.approx((b_crit + 16) / (b_crit + 64), rel=1e-6)


def test_noisy_seeds_give_an_interval_around_the_truth():
    rng = np.random.default_rng(3)
    fit = fit_branch(3.0, 0.1, 320, mccandlish_points(20.0, 400.0, 0.05, 3, rng), b0=16)
    assert fit.b_crit_low <= 20.0 <= fit.b_crit_high and fit.b_crit_low < fit.b_crit < fit.b_crit_high
    assert 0.5 * 20 < fit.b_crit < 2 * 20 and fit.fit_ok


def test_a_sweep_that_is_not_linear_in_b_is_rejected_and_its_curve_kept():
    # The quickstart sweep of issue 15 (samples to loss 2.1 at GBS 8/16/32/64 with sqrt LR
    # scaling): samples grow 2.5x from 16 to 32, faster than E_min (1 + B / B_crit) allows.
    measured = {8: 2880.0, 16: 3840.0, 32: 9600.0, 64: 16640.0}
    points = {b: [e * 0.97, e * 1.03] for b, e in measured.items()}
    fit = fit_branch(4.3, 2.2, 0, points, b0=16)
    assert not fit.fit_ok and fit.chi2_p < 0.01
    mapping = CalibratedMapping((fit,), b0=16)
    se = mapping.efficiency(float("nan"), 3.0, 16, np.array([8, 16, 32, 64]))
    assert se == pytest.approx([3840 / 2880, 1.0, 3840 / 9600, 3840 / 16640], rel=1e-6)


def test_the_calibrated_mapping_follows_c_across_progress():
    early = with_noise_scales(fit_branch(3.0, 0.2, 320, {b: [100 * (1 + b / 4)] * 2 for b in GRID}, 16), 2.0, 3.0, 2.0)
    late = with_noise_scales(
        fit_branch(2.2, 0.2, 3200, {b: [900 * (1 + b / 60)] * 2 for b in GRID}, 16), 10.0, 9.0, 5.0
    )
    assert early.c == pytest.approx(2.0) and late.c == pytest.approx(12.0)
    m = CalibratedMapping((late, early), b0=16)  # any order: sorted by progress
    assert m.factor(5.0) == pytest.approx(2.0) and m.factor(1.0) == pytest.approx(12.0)
    mid = (early.level + late.level) / 2
    assert m.factor(mid) == pytest.approx(7.0)
    assert m.critical_batch(10.0, mid) == pytest.approx(70.0)
    # No live noise estimate yet: the measured critical batch itself.
    assert m.critical_batch(float("nan"), 1.0) == pytest.approx(60.0)
    se = m.efficiency(5.0, 1.0, 16, np.array([16, 64]))
    assert se == pytest.approx([1.0, (60 + 16) / (60 + 64)])


def test_a_calibration_round_trips_through_its_json():
    fit = with_noise_scales(fit_branch(3.0, 0.2, 320, {b: [100 * (1 + b / 4)] * 2 for b in GRID}, 16), 2.0, 3.0, 2.0)
    again = branch_fit_from_dict(fit.as_dict())
    assert again == fit
    m = mapping_from_calibration({"id": "x", "branch_points": [fit.as_dict()]}, 16, 2.0)
    assert m.critical_batch(3.0) == pytest.approx(6.0)  # c = 4 / 2
    with pytest.raises(ValueError):
        mapping_from_calibration({"branch_points": []}, 16, 2.0)


def test_cbs_and_copus_read_the_same_mapping():
    cands = [CandidateConfig(2, 1, 1, 4, g) for g in (8, 16, 32, 64, 128)]
    rising = {c: 100.0 * (c.gbs / 8) ** 0.6 for c in cands}
    late = with_noise_scales(
        fit_branch(2.2, 0.2, 3200, {b: [900 * (1 + b / 60)] * 2 for b in GRID}, 16), 10.0, 9.0, 5.0
    )
    cal = {"id": "t", "branch_points": [late.as_dict()]}
    p = Planner.from_table(rising, 16, "lr-aware", 2.0, 0.1, cal)
    configured = Planner.from_table(rising, 16, "lr-aware", 2.0, 0.1)
    assert isinstance(configured.mapping, NoiseScaleMapping) and isinstance(p.mapping, CalibratedMapping)
    costs = SwitchCosts(0.0, 0.0)
    start = cands[1]
    cbs = decide("cbs", p, start, 5.0, 60, costs, loss=2.0)
    assert cbs.target.gbs == 64  # c = 12 from the calibration: 60, not 2 x 5 = 10
    assert decide("cbs", configured, start, 5.0, 60, costs).target.gbs == 8
    # COPUS's goodput uses the same SE: with B_crit 60 a large batch keeps most of its efficiency.
    assert decide("copus", p, start, 5.0, 60, costs, loss=2.0).target.gbs > start.gbs
    assert decide("copus", configured, start, 5.0, 60, costs).target.gbs <= 16


def test_the_default_planner_keeps_the_configured_factor():
    cands = [CandidateConfig(1, 1, 1, 4, g) for g in (16, 64)]
    p = Planner(cands, lambda cs: np.ones(len(cs)), 16, "lr-aware", 2.0)
    assert p.critical_batch(10.0) == 20.0
    assert p.score(cands[1], 10.0).efficiency == pytest.approx((20 + 16) / (20 + 64))


def test_the_smoothed_crossing_is_not_fooled_by_noise_the_first_passage_is():
    # A straight trend from 3.0 falling 0.1 per 100 samples, noisy; target 2.85 at 150 samples.
    rng = np.random.default_rng(0)
    s = np.arange(0, 400, 10.0)
    first, smooth = [], []
    for _ in range(200):
        loss = 3.0 - s / 1000 + 0.03 * rng.standard_normal(len(s))
        first.append(samples_to_decrement(list(s), list(loss), 2.85))
        smooth.append(smoothed_crossing(list(s), list(loss), 2.85, 0.05))
    assert np.mean(first) < 140 and abs(np.mean(smooth) - 150) < 5  # first passage: 131, 12% early
    assert math.isnan(smoothed_crossing([0, 10, 20], [3.0, 2.99, 2.98], 2.5, 0.05))
