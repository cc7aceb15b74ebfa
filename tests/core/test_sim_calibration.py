"""The simulated planner's efficiency mapping from a `copus calibrate` of the truth
(`copus.core.sim_calibration`, issue 42 item 2): what it measures, what it gets wrong and why,
and that the planner reads it as a real run reads its calibration file."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from copus.config import ConfigError
from copus.core.calibration import CalibratedMapping, NoiseScaleMapping
from copus.core.decision_rule import factor_log_sd_at
from copus.core.sim_calibration import (
    CalibrationSampling,
    _samples_to,
    calibration_grid,
    calibration_truth,
    simulated_calibration,
)
from copus.core.sim_protocol import perfect_setting
from copus.core.simulator import best_speed_by_gbs, make_planner, planner_view, search_space
from copus.sim.config import load_sim_config, setting_from

SETTING_3B = Path(__file__).resolve().parents[2] / "experiments" / "sim" / "paper_llama-3.2-3b_1x8-h100.yaml"
# The estimate read exactly (no noise, no lag) and the sweep measured without scatter: what is
# left between the calibration and the truth is the method's own.
EXACT = ["estimate.noise=0", "estimate.half_life_share=0", "estimate.min_half_life=0"]
EXACT += ["calibration.point_noise=0", "calibration.seed_noise=0"]


def _calibrated(overrides: list[str], seed: int = 0):
    s = setting_from(load_sim_config(SETTING_3B, ["protocol=null", *overrides]))
    space = search_space(s)
    truth = calibration_truth(s, s.calibration, best_speed_by_gbs(space))
    data, report = simulated_calibration(s, s.calibration, truth, seed)
    return s, space, truth, data, report


def _inside_grid(report: dict) -> list[dict]:
    """Branch points whose true critical batch lies within the grid (the fit can tell it there)."""
    lo, hi = min(report["grid"]), max(report["grid"])
    return [b for b in report["branches"] if lo <= b["b_crit_true"] <= hi]


def test_without_scatter_or_transient_the_calibration_measures_the_true_critical_batch():
    s, _, truth, data, report = _calibrated([*EXACT, "training.transient_steps=0"])
    inside = _inside_grid(report)
    assert len(inside) >= 2, report["branches"]
    for b in inside:
        # over a 0.02-nat decrement the critical batch hardly moves: the fit reads the truth
        assert b["b_crit"] == pytest.approx(b["b_crit_true"], rel=0.05), b
        assert b["c"] == pytest.approx(s.critical_factor, rel=0.05), b
    # the reference run branches at 1%, 3% and 10% of its samples to the target, in order
    assert [b.samples_seen for b in truth.branches] == sorted(b.samples_seen for b in truth.branches)
    assert len(data["branch_points"]) == len(s.calibration.branch_shares)


def test_the_calibration_measures_a_mapping_error_away():
    # The truth's noise scale three times what the configured c assumes: a run reading c = 2 would
    # put the critical batch at 3x the truth; the calibration measures c = B_crit / b_noise_run.
    s, space, _, data, report = _calibrated([*EXACT, "training.transient_steps=0", "estimate.mapping_error=3"])
    mapping = make_planner(
        s, replace(planner_view(replace(s, calibration=CalibrationSampling()), space), calibration=data)
    ).mapping
    assert isinstance(mapping, CalibratedMapping)
    for b in _inside_grid(report):
        b_noise_run = b["b_crit_true"] * 3 / s.critical_factor
        assert b["c"] == pytest.approx(s.critical_factor / 3, rel=0.05), b
        assert mapping.critical_batch(b_noise_run, b["loss"] - 0.01) == pytest.approx(b["b_crit_true"], rel=0.1)


def test_the_switch_transient_biases_the_measured_critical_batch_low():
    # A continuation changes the batch at the branch point and pays the truth's LR transient,
    # a fixed number of its steps: more samples at a large batch, so E(B) grows faster in B than
    # the McCandlish form says and the fit reads a smaller critical batch, as a real sweep would.
    _, _, _, _, without = _calibrated([*EXACT, "training.transient_steps=0"])
    _, _, _, _, paying = _calibrated(EXACT)
    for a, b in zip(without["branches"], paying["branches"]):
        assert b["b_crit"] < a["b_crit"], (a, b)


def test_each_seed_draws_its_own_measurements_and_a_seed_repeats():
    _, _, _, first, report = _calibrated([], seed=0)
    _, _, _, again, _ = _calibrated([], seed=0)
    _, _, _, other, _ = _calibrated([], seed=1)
    assert first == again
    assert [b["c"] for b in first["branch_points"]] != [b["c"] for b in other["branch_points"]]
    # with the scatter of a real sweep and a live estimate's noise, c is off the truth's
    assert report["c_log_error"] > 0 and report["cost_h"] > 0
    assert all(math.isfinite(b["c"]) for b in report["branches"])


def test_the_planner_reads_the_calibration_and_its_interval():
    s = setting_from(load_sim_config(SETTING_3B, ["protocol=null"]))
    space = search_space(s)
    view = planner_view(s, space, seed=2)
    assert view.calibration is not None and view.calibration_report["source"] == "simulated calibration"
    mapping = make_planner(s, view).mapping
    assert isinstance(mapping, CalibratedMapping)
    # its decisions weigh the calibration's interval at the run's progress, not the prior's 0.69
    loss = view.calibration_report["branches"][-1]["loss"]
    assert factor_log_sd_at(mapping, loss, 0.69) < 0.69
    # calibration.use false: the configured c, as a run without a calibration
    off = replace(s, calibration=replace(s.calibration, use=False))
    assert isinstance(make_planner(off, planner_view(off, space)).mapping, NoiseScaleMapping)
    # the perfect planner reads the exact critical batch, not a calibration
    assert not perfect_setting(s).calibration.use


def test_the_default_grid_and_a_bad_calibration_section():
    s = setting_from(load_sim_config(SETTING_3B))
    assert calibration_grid(s, s.calibration) == (8, 32, 128, 512, 2048)
    assert calibration_grid(s, replace(s.calibration, gbs=(64, 16, 256, 1024))) == (16, 64, 256, 1024)
    with pytest.raises(ConfigError, match=r"calibration\.branch_shares"):
        load_sim_config(SETTING_3B, ["calibration.branch_shares=[0.1, 1.5]"])
    with pytest.raises(ConfigError, match=r"calibration\.seeds"):
        load_sim_config(SETTING_3B, ["calibration.seeds=0"])


def test_a_branch_point_no_continuation_can_measure_is_left_out():
    # A decrement every continuation crosses within its first step: nothing to fit (a real sweep
    # refuses such a crossing), so the planner maps with the configured c and the report says why.
    s, space, truth, data, report = _calibrated(["calibration.decrement=0.000001"])
    assert data is None and report["branches"] == [] and report["unmeasurable_branches"] == len(truth.branches)
    view = planner_view(s, space)
    assert view.calibration is None and isinstance(make_planner(s, view).mapping, NoiseScaleMapping)


def test_a_continuation_below_the_loss_curves_floor_is_unmeasurable_without_stepping_to_the_cap():
    # A loss curve that drops to its floor in one step (a hostile `training.loss_curve.beta`):
    # every continuation aims below the floor. Stepping 2 million times per continuation to find
    # that out took 40 s; the floor says it at once.
    s = setting_from(load_sim_config(SETTING_3B, ["protocol=null", "training.loss_curve.beta=3e8"]))
    model = s.truth_model()
    model.step(s.start.gbs)
    assert math.isnan(_samples_to(model, s.start.gbs, model.floor)) and model.samples == s.start.gbs
    assert _samples_to(model, s.start.gbs, model.floor + 1.0) == 0.0
