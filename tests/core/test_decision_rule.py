"""The quantile rule: a move is made when its gain at a lower quantile of what the planner knows
repays its full cost (the transient of a GBS change included) over the rest of the run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from copus.core.decision_rule import (
    DEFAULT_QUANTILE_Z,
    DEFAULT_TRANSIENT_STEPS,
    critical_batch_log_sd,
    pessimistic_log_gain,
    step_time_log_sd,
    transient_depth,
    transient_steps_from_calibration,
)
from copus.core.horizon import Horizon
from copus.core.layout import CandidateConfig
from copus.core.planner import Planner, RuleSettings, SwitchCosts
from copus.sim.config import load_sim_config, setting_from

ROOT = Path(__file__).resolve().parents[2]
Z = DEFAULT_QUANTILE_Z
A16 = CandidateConfig(4, 1, 1, 4, 16)
A64 = CandidateConfig(4, 1, 1, 4, 64)
B16 = CandidateConfig(2, 1, 2, 4, 16)
B64 = CandidateConfig(2, 1, 2, 4, 64)
FREE = SwitchCosts(0.0, 0.0)
LONG = Horizon(1e6, "target")


def planner(throughputs: dict, rule: RuleSettings | None = None, b0: int = 16) -> Planner:
    return Planner.from_table(throughputs, b0, "pollux", 2.0, 0.10, rule=rule or RuleSettings())


def test_a_move_five_percent_ahead_for_certain_is_made_where_the_threshold_rule_refuses_it():
    table = {A16: 100.0, B16: 105.0}
    certain = planner(table, RuleSettings(transient_steps=0.0))
    d = certain.decide(A16, 1e4, 30.0, FREE, horizon=LONG)
    assert d.switch and d.best.config == B16 and d.rule == "quantile"
    assert d.predicted_gain == pytest.approx(0.05) and d.gain_low == pytest.approx(0.05)
    old = planner(table, RuleSettings(rule="threshold")).decide(A16, 1e4, 30.0, FREE, elapsed_s=1e6)
    assert not old.switch and "below the 10% threshold" in old.reason


def test_the_step_time_models_error_holds_back_a_move_it_could_explain_and_not_one_within_the_same_shape():
    sds = {A16: 0.04, B16: 0.04, A64: 0.04, B64: 0.04}
    table = {A16: 100.0, B16: 105.0}
    d = planner(table, RuleSettings(throughput_log_sd=sds, transient_steps=0.0)).decide(
        A16, 1e4, 30.0, FREE, horizon=LONG
    )
    assert not d.switch and d.gain_log_sd == pytest.approx(0.04 * math.sqrt(2))
    assert d.gain_low == pytest.approx(math.exp(math.log(1.05) - Z * 0.04 * math.sqrt(2)) - 1)
    assert "does not repay" in d.reason
    # Another GBS of the same replica and MBS shares the model's terms: no throughput error on the ratio
    same = planner({A16: 100.0, A64: 400.0}, RuleSettings(throughput_log_sd=sds, transient_steps=0.0))
    d = same.decide(A16, 1e6, 30.0, FREE, horizon=LONG)
    assert d.switch and d.best.config == A64 and d.gain_log_sd == pytest.approx(0.0, abs=1e-6)


def test_the_critical_batchs_uncertainty_is_read_at_both_ends_and_saturates_far_below_it():
    table = {A16: 100.0, A64: 300.0}  # x3 throughput at x4 the batch
    rule = RuleSettings(transient_steps=0.0)
    p = planner(table, rule)
    # B_crit = 2 x 40 = 80: SE(64) = 96/144, gain 3 x 0.667 - 1 = +100% centrally
    sure = p.decide(A16, 40.0, 30.0, FREE, horizon=LONG)
    unsure = p.decide(A16, 40.0, 30.0, FREE, horizon=LONG, log_b_crit_sd=1.0)
    assert sure.gain_low == pytest.approx(sure.predicted_gain) and unsure.gain_low < sure.gain_low
    low_b = p.score(A64, 40.0 / math.exp(Z)).goodput / p.score(A16, 40.0 / math.exp(Z)).goodput
    high_b = p.score(A64, 40.0 * math.exp(Z)).goodput / p.score(A16, 40.0 * math.exp(Z)).goodput
    assert unsure.gain_log_sd == pytest.approx(abs(math.log(high_b) - math.log(low_b)) / (2 * Z))
    # far above every batch the efficiency is ~1 at both ends: the uncertainty costs nothing
    big = p.decide(A16, 1e7, 30.0, FREE, horizon=LONG, log_b_crit_sd=1.0)
    assert big.gain_log_sd < 1e-4 and big.switch


def test_a_gbs_change_pays_its_transient_at_the_new_step_time_times_its_depth():
    p = planner({A16: 100.0, A64: 200.0}, RuleSettings(transient_steps=4.0))
    d = p.decide(A16, 1e6, 30.0, FREE, horizon=Horizon(10.0, "target"))
    step_64 = 64 / 200.0
    assert d.transient_s == pytest.approx(4.0 * step_64) and d.cost_s == pytest.approx(4.0 * step_64)
    # 10 s left: 2x goodput repays 1.28 s; 1.5 s left does not (2 x 0.22 < 1.5)
    assert d.switch
    assert not p.decide(A16, 1e6, 30.0, FREE, horizon=Horizon(1.5, "target")).switch
    assert transient_depth(16, np.array([16, 22.627, 32, 256])).tolist() == pytest.approx(
        [0.0, 0.5, 1.0, 1.0], abs=1e-4
    )


def test_a_layout_change_pays_its_reshard_and_the_transient_of_its_gbs_change():
    costs = SwitchCosts(layout_s=20.0)
    p = planner({A16: 100.0, B64: 250.0}, RuleSettings(transient_steps=2.0))
    d = p.decide(A16, 1e6, 30.0, costs, horizon=Horizon(1000.0, "target"))
    assert d.switch and d.cost_s == pytest.approx(20.0 + 2.0 * 64 / 250.0)
    assert not p.decide(A16, 1e6, 30.0, costs, horizon=Horizon(30.0, "target")).switch


def test_without_a_horizon_the_rest_of_the_run_is_as_long_as_the_run_so_far():
    p = planner({A16: 100.0, B16: 130.0}, RuleSettings(transient_steps=0.0))
    costs = SwitchCosts(layout_s=50.0)
    assert not p.decide(A16, 1e6, 30.0, costs, elapsed_s=100.0).switch  # 1.3 x 50 < 100
    d = p.decide(A16, 1e6, 30.0, costs, elapsed_s=1000.0)
    assert d.switch and d.horizon.source == "elapsed" and d.horizon.seconds == 1000.0


def test_the_floor_is_a_floor_on_the_pessimistic_gain():
    table = {A16: 100.0, B16: 103.0}
    p = planner(table, RuleSettings(gain_floor=0.05, transient_steps=0.0))
    d = p.decide(A16, 1e6, 30.0, FREE, horizon=LONG)
    assert not d.switch and "below the 5% floor" in d.reason


def test_among_the_moves_that_pass_the_most_pessimistic_goodput_net_of_cost_is_taken():
    sds = {A16: 0.0, A64: 0.0, B16: 0.2, B64: 0.0}
    # B16 is centrally the best but uncertain; A64 is sure, and same-shape
    table = {A16: 100.0, A64: 160.0, B16: 190.0, B64: 120.0}
    p = planner(table, RuleSettings(throughput_log_sd=sds, transient_steps=0.0))
    d = p.decide(A16, 1e6, 30.0, FREE, horizon=LONG)
    assert d.switch and d.best.config == A64
    assert (
        planner(table, RuleSettings(transient_steps=0.0)).decide(A16, 1e6, 30.0, FREE, horizon=LONG).best.config == B16
    )


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(50.0, 200.0), min_size=4, max_size=4),
    st.lists(st.floats(0.0, 0.1), min_size=4, max_size=4),
    st.floats(1.0, 1e4),
    st.floats(0.0, 1.5),
    st.floats(0.0, 30.0),
)
def test_no_move_is_reversed_at_the_same_evidence(speeds, sds, b_noise, b_sd, layout_s):
    """From wherever a decision moves, a decision at the same evidence never moves back: the way
    back has the negated gain, lowered again by its sd, and pays a cost again."""
    cands = [A16, A64, B16, B64]
    rule = RuleSettings(throughput_log_sd=dict(zip(cands, sds)))
    p = planner(dict(zip(cands, speeds)), rule)
    costs = SwitchCosts(layout_s=layout_s)
    for start in cands:
        d = p.decide(start, b_noise, 30.0, costs, horizon=Horizon(600.0, "target"), log_b_crit_sd=b_sd)
        if d.switch:
            back = p.decide(d.target, b_noise, 30.0, costs, horizon=Horizon(600.0, "target"), log_b_crit_sd=b_sd)
            assert not (back.switch and back.target == start)


def test_the_uncertainties_combine_as_independent_logs():
    assert critical_batch_log_sd(0.69, 0.35) == pytest.approx(math.hypot(0.69, 0.35))
    sds = step_time_log_sd(0.04, 0.10, [False, True])
    assert sds.tolist() == pytest.approx([0.04 * math.sqrt(math.pi / 2), 0.10])
    r = np.array([0.1, 0.2])
    low, sd = pessimistic_log_gain(r, r - 0.1, r + 0.1, np.array([0.0, 0.05]), 1.0)
    assert sd.tolist() == pytest.approx([0.1, math.hypot(0.1, 0.05)]) and low.tolist() == pytest.approx(
        (r - sd).tolist()
    )
    assert pessimistic_log_gain(r, r - 1, r + 1, np.ones(2), 0.0)[0].tolist() == r.tolist()  # z 0: the central estimate


def test_the_transient_comes_from_the_calibration_that_measured_it():
    data = json.loads((ROOT / "docs/results/calibration-tradeoff-transient.json").read_text())
    steps = transient_steps_from_calibration(data)
    # the switches to GBS 64 and 256 at both branch points: 1.76, 3.18, 4.77, 7.88 steps
    assert steps == pytest.approx(np.mean([112.51 / 64, 813.04 / 256, 305.3 / 64, 2017 / 256]), rel=0.01)
    assert steps == pytest.approx(DEFAULT_TRANSIENT_STEPS, abs=0.05)
    assert transient_steps_from_calibration(None) is None
    assert transient_steps_from_calibration({"transient": None}) is None


def test_at_the_runs_speed_an_outlier_profile_point_no_longer_holds_the_run_where_it_is():
    """The emulated pilot's case: the current configuration's profile point read 25% fast (the
    model, pooling every point, had it right), so its profile figure hid a move the run's own
    speed shows."""
    table = {A16: 125.0, B16: 120.0}  # A16's point is the outlier
    model = {A16: 100.0, B16: 118.0}
    p = Planner.from_table(table, 16, "pollux", 2.0, 0.10, rule=RuleSettings(transient_steps=0.0), model=model)
    assert not p.decide(A16, 1e4, 30.0, FREE, horizon=LONG).switch  # as the profile reads it
    at_speed = p.at_run_speed(A16, 90.0)  # the run pays 10% more than the model said
    assert at_speed.score(A16, 1e4).throughput == pytest.approx(90.0)
    assert at_speed.score(B16, 1e4).throughput == pytest.approx(118.0 * 0.9)  # the same factor
    d = at_speed.decide(A16, 1e4, 30.0, FREE, horizon=LONG)
    assert d.switch and d.best.config == B16 and d.predicted_gain == pytest.approx(0.18)
    assert p.score(A16, 1e4).throughput == 125.0  # the planner itself is unchanged


def test_a_profile_off_by_one_factor_everywhere_changes_no_choice_at_the_runs_speed():
    table = {A16: 100.0, B16: 104.0, A64: 380.0, B64: 420.0}
    p = Planner.from_table(table, 16, "pollux", 2.0, 0.10, rule=RuleSettings(transient_steps=0.0), model=table)
    for b_noise in (4.0, 40.0, 400.0):
        read = p.decide(A16, b_noise, 30.0, FREE, horizon=LONG)
        slower = p.at_run_speed(A16, 80.0).decide(A16, b_noise, 30.0, FREE, horizon=LONG)
        assert (read.switch, read.best.config) == (slower.switch, slower.best.config)
        assert slower.predicted_gain == pytest.approx(read.predicted_gain)


def test_with_a_band_one_slow_configuration_is_not_read_as_a_slow_machine():
    """The emulated layout suite's seed 1200: the run paid x0.5 of its table in pp2 with two
    micro-batches (the slow one of two timing modes). Carried to every candidate, that factor hid
    the configuration beside it, which ran at its table's speed; bounded by the band, the others
    read at its lower edge and the move shows."""
    table = {A16: 100.0, B16: 95.0}  # B16 a little behind, by the table
    banded = RuleSettings(transient_steps=0.0, run_speed_band=(0.8, 1.1))
    unbounded = Planner.from_table(table, 16, "pollux", 2.0, 0.10, rule=RuleSettings(transient_steps=0.0), model=table)
    p = Planner.from_table(table, 16, "pollux", 2.0, 0.10, rule=banded, model=table)
    assert unbounded.at_run_speed(A16, 50.0).score(B16, 1e4).throughput == pytest.approx(47.5)
    assert not unbounded.at_run_speed(A16, 50.0).decide(A16, 1e4, 30.0, FREE, horizon=LONG).switch
    slow = p.at_run_speed(A16, 50.0)
    assert slow.score(A16, 1e4).throughput == pytest.approx(50.0)  # its own speed
    assert slow.score(B16, 1e4).throughput == pytest.approx(95.0 * 0.8)  # the band's edge
    d = slow.decide(A16, 1e4, 30.0, FREE, horizon=LONG)
    assert d.switch and d.best.config == B16
    # inside the band the factor is the machine's, as without one: carried to every candidate
    for speed in (85.0, 105.0):
        assert p.at_run_speed(A16, speed).throughputs.tolist() == pytest.approx(
            unbounded.at_run_speed(A16, speed).throughputs.tolist()
        )
    fast = p.at_run_speed(A16, 150.0)
    assert fast.score(B16, 1e4).throughput == pytest.approx(95.0 * 1.1)  # and the upper edge
    assert p.at_run_speed(A16, 90.0, {B16: 60.0}).score(B16, 1e4).throughput == 60.0  # none of these without a band:
    assert unbounded.at_run_speed(A16, 90.0, {B16: 60.0}).score(B16, 1e4).throughput == pytest.approx(85.5)


def test_with_a_band_a_configuration_the_run_measured_reads_at_its_own_speed_so_a_move_is_not_undone():
    """After the move the band made, the configuration left behind reads at what the run paid
    there, not at its table times the band: it does not call the run back."""
    table = {A16: 100.0, B16: 95.0}
    rule = RuleSettings(transient_steps=0.0, run_speed_band=(0.8, 1.1))
    p = Planner.from_table(table, 16, "pollux", 2.0, 0.10, rule=rule, model=table)
    assert p.at_run_speed(A16, 50.0).decide(A16, 1e4, 30.0, FREE, horizon=LONG).target == B16
    # B16 measured at x0.7 of its table (66.5): A16 read at the band's edge (80) would call the run back
    back = p.at_run_speed(B16, 66.5, {A16: 50.0, B16: 66.5})
    assert back.score(A16, 1e4).throughput == 50.0 and back.score(B16, 1e4).throughput == 66.5
    assert not back.decide(B16, 1e4, 30.0, FREE, horizon=LONG).switch


@pytest.mark.parametrize("band", [(0.0, 1.1), (1.2, 1.5), (0.5, 0.9), (math.nan, 1.0), (0.9, math.inf)])
def test_a_band_that_does_not_hold_the_tables_own_speed_is_refused(band):
    with pytest.raises(ValueError, match=r"0 < low <= 1 <= high"):
        RuleSettings(run_speed_band=band)


@pytest.mark.parametrize("speed", [math.nan, 0.0, -1.0])
def test_without_a_measured_speed_a_model_or_the_setting_the_profile_stands(speed):
    table = {A16: 125.0, B16: 120.0}
    with_model = Planner.from_table(table, 16, "pollux", 2.0, 0.10, rule=RuleSettings(), model=table)
    assert with_model.at_run_speed(A16, speed) is with_model
    assert planner(table).at_run_speed(A16, 90.0).score(A16, 1e4).throughput == 125.0  # no model
    off = Planner.from_table(table, 16, "pollux", 2.0, 0.10, rule=RuleSettings(read_run_speed=False), model=table)
    assert off.at_run_speed(A16, 90.0) is off
    assert with_model.at_run_speed(A64, 90.0) is with_model  # not a candidate


def test_at_the_runs_speed_precise_points_outweigh_a_model_that_misfits_the_current_configuration():
    """The simulated 13B setting's case: points measured to 2%, the model 6% high at the current
    configuration (one link per collective where the groups span nodes unevenly). Read through the
    model alone, that 6% deflated every candidate and held the run at GBS 16 for 59 hours."""
    table = {A16: 100.0, B16: 110.0}  # both measured, precisely
    model = {A16: 106.0, B16: 104.0}
    sds = {A16: 0.05, B16: 0.05}  # the model's held-out error

    def at_speed(point_sd: float) -> Planner:
        rule = RuleSettings(transient_steps=0.0, throughput_log_sd=sds, profile_point_log_sd=point_sd)
        return Planner.from_table(table, 16, "pollux", 2.0, 0.10, rule=rule, model=model).at_run_speed(A16, 100.0)

    # the points' weight: the model ratio's variance over that and the points' ratio's
    w = 2 * 0.05**2 / (2 * 0.05**2 + 2 * 0.02**2)
    ratio = (110.0 / 100.0) ** w * (104.0 / 106.0) ** (1 - w)
    precise = at_speed(0.02)
    assert precise.score(A16, 1e4).throughput == pytest.approx(100.0)
    assert precise.score(B16, 1e4).throughput == pytest.approx(100.0 * ratio)
    assert precise.decide(A16, 1e4, 30.0, FREE, horizon=LONG).best.config == B16  # the points' 10% shows
    # noisy points (or none at all: the model only) leave the model's misfit in every candidate
    assert not at_speed(1.0).decide(A16, 1e4, 30.0, FREE, horizon=LONG).switch
    # points with no noise: their own ratio (the profile's figures, carried to the run's speed)
    assert at_speed(0.0).score(B16, 1e4).throughput == pytest.approx(110.0)


def test_an_unmeasured_candidate_is_read_against_the_current_one_through_the_model():
    table = {A16: 100.0, B16: 110.0, A64: 380.0}  # A64 unmeasured: the table holds the model's figure
    model = {A16: 106.0, B16: 104.0, A64: 380.0}
    rule = RuleSettings(transient_steps=0.0, throughput_log_sd=dict.fromkeys(table, 0.05), profile_point_log_sd=0.0)
    p = Planner.from_table(table, 16, "pollux", 2.0, 0.10, rule=rule, model=model).at_run_speed(A16, 100.0)
    assert p.score(A64, 1e4).throughput == pytest.approx(100.0 * 380.0 / 106.0)  # not 380 / 100
    assert p.score(B16, 1e4).throughput == pytest.approx(110.0)


def test_the_simulated_planner_weighs_points_with_its_profiles_timing_noise():
    sim = ROOT / "experiments" / "sim"
    assert setting_from(load_sim_config(sim / "paper_llama-2-13b_2x8-h100.yaml")).rule.profile_point_log_sd == 0.02
    assert setting_from(load_sim_config(sim / "emulated_layout.yaml")).rule.profile_point_log_sd == 0.1  # a real file
    given = load_sim_config(sim / "paper_llama-2-13b_2x8-h100.yaml", ["policy.profile_point_sd=0.3"])
    assert setting_from(given).rule.profile_point_log_sd == 0.3
