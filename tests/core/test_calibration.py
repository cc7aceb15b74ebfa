"""The critical-batch calibration's fits and the efficiency mappings the planner uses."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from copus.config import CalibrationConfig
from copus.core.calibration import (
    CalibratedMapping,
    NoiseScaleMapping,
    Sweep,
    branch_fit_from_dict,
    branch_point_problem,
    crossing_unresolved,
    finer_evaluation,
    fit_branch,
    fit_branches,
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


def test_a_crossing_within_the_first_evaluation_is_unresolved():
    # The branch point at 0 samples, evaluations every 64: the trend is 0.15 down by the first.
    samples, losses = [0, 64, 128, 192], [3.0, 2.8, 2.75, 2.7]
    early = smoothed_crossing(samples, losses, 2.85, 0.05)
    assert 0 < early <= 64 and crossing_unresolved(samples, early)
    late = smoothed_crossing(samples, losses, 2.78, 0.05)
    assert late > 64 and not crossing_unresolved(samples, late)
    assert not crossing_unresolved(samples, float("nan"))


def test_finer_evaluation_goes_down_to_one_step():
    assert finer_evaluation(64, 4) == 16 and finer_evaluation(16, 4) == 4 and finer_evaluation(4, 4) is None
    assert finer_evaluation(64, 32) == 32 and finer_evaluation(64, 64) is None
    assert finer_evaluation(40, 16) == 16  # 2 steps between evaluations, then 1


def test_the_joint_fit_pools_a_critical_batch_that_falls_with_progress():
    early = Sweep(3.0, 0.1, 320, {b: [100 * (1 + b / 40)] * 2 for b in GRID})
    late = Sweep(2.5, 0.1, 960, {b: [300 * (1 + b / 10)] * 2 for b in GRID})
    fits = fit_branches([late, early], b0=16)
    assert [f.b_crit_raw for f in fits] == pytest.approx([10.0, 40.0])
    # Equally precise: both at the geometric mean, which the planner then reads.
    assert [f.b_crit for f in fits] == pytest.approx([20.0, 20.0])
    assert CalibratedMapping(tuple(fits), b0=16).critical_batch(float("nan"), 2.0) == pytest.approx(20.0)
    # A branch point alone is its own joint fit.
    alone = fit_branch(3.0, 0.1, 320, early.points, 16)
    assert alone.b_crit == pytest.approx(40.0) and alone.b_crit_raw == alone.b_crit


def test_a_sweep_with_a_point_not_measured_is_fitted_from_the_others():
    rng = np.random.default_rng(5)
    points = mccandlish_points(20.0, 400.0, 0.05, 4, rng)
    points[4][1] = float("nan")  # seed 1 at GBS 4: not measurable
    points[64] = [float("nan")] * 4  # never reached at GBS 64
    fit = fit_branch(3.0, 0.1, 320, points, b0=16)
    assert fit.gbs == [4, 8, 16, 32] and fit.b_crit_low <= 20.0 <= fit.b_crit_high


def test_a_calibration_file_written_before_the_joint_fit_still_loads():
    fit = fit_branch(3.0, 0.2, 320, {b: [100 * (1 + b / 4)] * 2 for b in GRID}, 16)
    old = {
        k: v
        for k, v in fit.as_dict().items()
        if k not in ("b_crit_raw", "b_crit_raw_low", "b_crit_raw_high", "log_b_crit_sd")
    }
    assert branch_point_problem(old) is None
    again = branch_fit_from_dict(old)
    assert again.b_crit == pytest.approx(4.0) and math.isnan(again.b_crit_raw)
    assert branch_point_problem({**fit.as_dict(), "b_crit_raw": "4"}) == "b_crit_raw has the wrong type"


def test_the_calibration_defaults_measure_with_4_seeds_on_at_least_512_samples():
    default = CalibrationConfig()
    assert default.seeds == 4
    assert default.validation_samples(64, 10_000) == 512  # at least 512 ...
    assert default.validation_samples(1024, 10_000) == 1024  # ... and at least eval.val_samples ...
    assert default.validation_samples(64, 300) == 300  # ... but no more than the split holds
    assert CalibrationConfig(val_samples=64).validation_samples(1024, 10_000) == 64  # as given


def test_the_lr_probe_table_compares_each_lr_with_the_rules_and_the_jump_with_the_switch():
    from copus.core.calibration import lr_probe_table

    def point(branch, gbs, seed, samples, factor=1.0):
        return {"branch": branch, "gbs": gbs, "seed": seed, "samples": samples, "lr_factor": factor}

    points = [
        point(0, 16, 0, 100.0),
        point(0, 16, 1, 120.0),  # E(16) = 110 at the rule's LR
        point(0, 64, 0, 440.0),  # E(64) = 440: the switch 16 -> 64 takes 4x the samples
        point(0, 16, 0, 200.0, 2.0),
        point(0, 16, 1, float("nan"), 2.0),  # not measured: left out of the mean
        point(0, 64, 0, 220.0, 0.5),
    ]
    probe = {"jump_to": 64, "jump_factor": 2.0, "pairs": [[16, 2.0], [64, 0.5]]}
    table = lr_probe_table(points, 16, probe)
    first, second = table["rows"]
    assert (first["mean_samples"], first["seeds"], first["rule_samples"]) == (200.0, 1, 110.0)
    assert first["relative_to_rule"] == pytest.approx(200 / 110)
    assert second["relative_to_rule"] == pytest.approx(0.5)
    (jump,) = table["jumps"]
    # The LR jump alone takes 200/110 of B0's samples; the switch 4x: a share log(1.82)/log(4).
    assert jump["lr_share_of_switch"] == pytest.approx(math.log(200 / 110) / math.log(4))
    no_switch = lr_probe_table([point(0, 16, 0, 100.0), point(0, 64, 0, 100.0)], 16, probe)
    assert no_switch["jumps"][0]["lr_share_of_switch"] is None and no_switch["rows"][0]["mean_samples"] is None
