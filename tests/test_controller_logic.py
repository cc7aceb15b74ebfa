"""The controller's bookkeeping without a cluster: decisions every interval, handed out once,
scripted noise, restart cost learned from measured downtime; LR rules follow the GBS."""

from __future__ import annotations

import math

import pytest

from copus.cluster.controller import Controller, ControllerSpec
from copus.core.efficiency import adascale_gain, efficiency, statistical_efficiency
from copus.core.layout import CandidateConfig
from copus.core.schedule import LRSchedule
from copus.records import ReconfigureRecord

TABLE = (
    (CandidateConfig(2, 1, 1, 2, 8), 100.0),
    (CandidateConfig(2, 1, 1, 2, 16), 150.0),
    (CandidateConfig(1, 1, 2, 2, 16), 300.0),
)


def spec(**kw) -> ControllerSpec:
    base = dict(
        policy="copus",
        throughputs=TABLE,
        b0=8,
        efficiency="pollux",
        critical_factor=2.0,
        threshold=0.1,
        interval_s=10.0,
        restart_cost_s=5.0,
        in_place_cost_s=5.0,
    )
    return ControllerSpec(**{**base, **kw})


def step(n: int, wall: float, cfg: CandidateConfig, b_noise: float | None = 50.0) -> dict:
    return {
        "kind": "step",
        "step": n,
        "samples": n * cfg.gbs,
        "wall_clock_s": wall,
        "step_time_s": 0.1,
        "train_loss": 3.0,
        "b_noise": b_noise,
        "dp": cfg.dp,
        "tp": cfg.tp,
        "pp": cfg.pp,
        "mbs": cfg.mbs,
        "gbs": cfg.gbs,
    }


def test_decides_once_per_interval_and_hands_the_decision_out_once():
    c = Controller(spec(in_place_cost_s=1.0))
    start = CandidateConfig(2, 1, 1, 2, 8)
    c.push(step(1, 1.0, start))
    c.push(step(2, 5.0, start))
    assert c.decision() is None and c.evaluations == []  # interval not over yet
    c.push(step(3, 11.5, start))
    d = c.decision()
    assert d.config == CandidateConfig(1, 1, 2, 2, 16) and d.change == "layout" and d.way == "auto"
    assert c.decision() is None
    assert c.drain((None, 0))[1][0]["step"] == 1 and len(c.history) == 3


def switched(c: Controller, a: CandidateConfig, b: CandidateConfig, at: float, downtime: float, **how) -> None:
    """The records rank 0 sends for a switch from a to b at wall-clock `at`, the first step in b
    starting `downtime` seconds later (its step takes 0.1 s): the controller measures it."""
    how = {"in_place": True, **how}
    c.push(ReconfigureRecord(step=1, samples=8, wall_clock_s=at, from_=a, to=b, **how).as_dict())
    c.push({**step(2, at + downtime + 0.1, b), "step_time_s": 0.1})


def test_switch_costs_are_learned_and_block_switches_that_cannot_repay_them():
    c = Controller(spec(reconfigure="restart"))
    start = CandidateConfig(2, 1, 1, 2, 8)
    pipeline, gbs16 = CandidateConfig(1, 1, 2, 2, 8), CandidateConfig(2, 1, 1, 2, 16)
    switched(c, start, pipeline, 100.0, 9.5, in_place=False)
    switched(c, pipeline, CandidateConfig(1, 1, 2, 2, 16), 200.0, 0.001)  # says nothing about layout changes
    assert c.book.restart_cost_s == pytest.approx(9.5) and c.book.in_place_cost_s == 5.0
    c.evaluations.clear()
    c._interval_start = None
    c.push(step(1, 0.0, start))
    c.push(step(2, 10.0, start))
    # With a 9.5 s restart in a 10 s interval the pipeline cannot repay; GBS 16 in place can.
    assert c.decision().config == gbs16 and c.evaluations[-1]["switch"]


def test_in_place_layout_changes_cost_what_was_measured_and_a_fallback_makes_later_ones_restart():
    c = Controller(spec(restart_cost_s=9.5))
    start, pipeline = CandidateConfig(2, 1, 1, 2, 8), CandidateConfig(1, 1, 2, 2, 16)
    switched(c, pipeline, start, 100.0, 0.4)
    assert c.costs().layout_s == pytest.approx(0.4) and c.costs().mbs_s == 0.0
    c._interval_start = None
    c.push(step(1, 0.0, start))
    c.push(step(2, 10.0, start))
    order = c.decision()
    assert order.config.pp == 2 and order.way == "auto"  # the pipeline repays a 0.4 s in-place change
    # The in-place path failed: the controller learns it from the record, before the relaunch.
    c.push(
        ReconfigureRecord(
            step=3, samples=24, wall_clock_s=11.0, from_=start, to=pipeline, in_place=False, fell_back="boom"
        ).as_dict()
    )
    assert c.book.way == "restart" and c.costs().layout_s == c.costs().mbs_s == 9.5
    c.push({**step(4, 20.6, pipeline), "step_time_s": 0.1})  # the relaunched group's first step
    assert c.book.restart_cost_s == pytest.approx(9.5) and c.snapshot()["reconfigure"] == "restart"


def test_scripted_noise_replaces_the_measured_one_per_decision():
    c = Controller(spec(b_noise_script=(1.0, 1000.0), interval_s=1.0))
    start = CandidateConfig(2, 1, 1, 2, 8)
    for i, wall in enumerate((0.0, 1.0, 2.0)):
        c.push(step(i + 1, wall, start, b_noise=float("nan")))
    assert [e["b_noise"] for e in c.evaluations] == [1.0, 1000.0]


def test_static_policy_never_decides():
    c = Controller(spec(policy="static", interval_s=1.0))
    for i in range(5):
        c.push(step(i, float(i * 2), CandidateConfig(2, 1, 1, 2, 8)))
    assert c.decision() is None and all(not e["switch"] for e in c.evaluations)


def test_lr_rules_follow_the_gbs_and_keep_the_warmup():
    s = LRSchedule(1e-3, 16, "sqrt", warmup_samples=160)
    assert s.lr(0, 64) == pytest.approx(1e-3 * 2 / 160)
    assert s.lr(1000, 64) == pytest.approx(2e-3)
    assert LRSchedule(1e-3, 16, "linear").lr(0, 64) == pytest.approx(4e-3)
    ada = LRSchedule(1e-3, 16, "adascale", warmup_samples=160)
    gain = adascale_gain(grad_sqr=1.0, grad_var=16.0, b0=16, b=64)  # var at B0 = 1 = sqr: r = 2 / 1.25
    # AdamW takes sqrt(r) (AdaptDL's Adam form), not r.
    assert gain == pytest.approx(1.6) and ada.lr(1000, 64, gain) == pytest.approx(1e-3 * math.sqrt(1.6))
    assert ada.lr(1000, 64, None) == pytest.approx(1e-3)
    assert ada.lr(80, 64, gain) == pytest.approx(1e-3 * math.sqrt(1.6) * 81 / 160)
    assert adascale_gain(float("nan"), 1.0, 16, 64) == 1.0
    assert 1.0 <= adascale_gain(2.0, 3.0, 16, 64) <= 64 / 16


def test_adascale_with_adamw_scales_the_lr_by_the_square_root_of_the_gain():
    # B_noise 1000 at B0 16 (var/sqr = B_noise / B0), B 256: r = 12.9, the LR only 3.6x.
    gain = adascale_gain(grad_sqr=1.0, grad_var=1000.0, b0=16, b=256)
    assert gain == pytest.approx(12.94, abs=0.01)
    assert LRSchedule(1e-3, 16, "adascale").lr(10_000, 256, gain) == pytest.approx(1e-3 * 3.597, rel=1e-3)


def test_all_noise_means_full_efficiency_and_full_gain():
    # Smoothed |G|^2 <= 0: SE treats the gradient as all noise (1 at any B), AdaScale agrees (r = s).
    assert statistical_efficiency(float("inf"), 16, 256) == 1.0
    assert adascale_gain(grad_sqr=-0.5, grad_var=10.0, b0=16, b=256) == 16.0
    assert adascale_gain(grad_sqr=0.0, grad_var=0.0, b0=16, b=256) == 1.0


def test_efficiency_forms():
    assert efficiency("pollux", 100.0, 16, 16) == 1.0
    assert efficiency("lr-aware", 100.0, 16, 64, 2.0) == pytest.approx(216 / 264)
    # Every form applies the critical factor (issue 26): one critical batch per run, whatever
    # the form; Pollux's original form is c = 1.
    for form in ("pollux", "lr-aware"):
        assert efficiency(form, 100.0, 16, 64, 2.0) == pytest.approx(216 / 264)
        assert efficiency(form, 100.0, 16, 64, 1.0) == pytest.approx(statistical_efficiency(100.0, 16, 64))
    assert math.isnan(efficiency("pollux", float("nan"), 16, 64))
    with pytest.raises(ValueError, match="policy.efficiency"):
        efficiency("magic", 1.0, 16, 64)


def test_a_restarted_controller_recovers_its_history_decisions_and_costs(tmp_path):
    path = tmp_path / "controller_state.json"
    c = Controller(spec(in_place_cost_s=1.0), state_path=str(path))
    start = CandidateConfig(2, 1, 1, 2, 8)
    c.push(step(1, 0.0, start))
    c.push(step(2, 11.0, start))
    switched(c, CandidateConfig(1, 1, 2, 2, 16), start, 11.0, 0.7)
    assert c.decision() is not None and path.is_file()
    # Ray restarts the actor with its original arguments: it finds its state file.
    again = Controller(spec(in_place_cost_s=1.0), state_path=str(path))
    assert again.restarts == 1 and again.history == c.history and again.evaluations == c.evaluations
    assert again.book.in_place_cost_s == pytest.approx(0.7) and again.incarnation != c.incarnation
    again.push(step(3, 15.0, start))  # the interval started at 11 s goes on: no decision before 21 s
    assert len(again.evaluations) == len(c.evaluations)
    again.push(step(4, 22.0, start))
    assert len(again.evaluations) == len(c.evaluations) + 1
    # A driver draining the old incarnation starts over on the new one.
    cursor, records = again.drain((c.incarnation, 5))
    assert [r["step"] for r in records] == [3, 4] and cursor == (again.incarnation, 2)


def _calibration(level_losses: tuple[float, ...], b_crits: tuple[float, ...], b_noise_run: float) -> dict:
    from copus.core.calibration import fit_branch, with_noise_scales

    branches = []
    for loss, b_crit in zip(level_losses, b_crits):
        fit = fit_branch(loss, 0.1, 100, {b: [100 * (1 + b / b_crit)] * 2 for b in (4, 8, 16, 64)}, 8)
        branches.append(with_noise_scales(fit, 1.0, 1.0, b_noise_run).as_dict())
    return {"id": "test-calibration", "branch_points": branches}


def test_the_controller_reads_the_calibration_at_the_runs_progress():
    # Measured: B_crit 2 early (loss 3.5), 400 late (loss 2.0); the run's noise estimate is 1 there.
    c = Controller(spec(calibration=_calibration((3.5, 2.0), (2.0, 400.0), 1.0), interval_s=1.0, throughputs=TABLE[:2]))
    start = CandidateConfig(2, 1, 1, 2, 8)
    c.push({"kind": "eval", "step": 0, "val_loss": 3.6})
    c.push(step(1, 0.0, start, b_noise=1.0))
    c.push(step(2, 1.0, start, b_noise=1.0))
    assert c.decision() is None  # early: a larger batch wastes samples (SE(16) = 10/18 of SE(8))
    c.push({"kind": "eval", "step": 2, "val_loss": 1.9})
    c.push(step(3, 2.0, start, b_noise=1.0))
    d = c.decision()
    assert d.config.gbs == 16 and d.efficiency_source == "test-calibration"
    assert d.val_loss == 1.9 and d.critical_batch == pytest.approx(400.0)
    assert d.predicted_efficiency_gain == pytest.approx((400 + 8) / (400 + 16))
