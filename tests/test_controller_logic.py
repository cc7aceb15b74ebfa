"""The controller's bookkeeping without a cluster: decisions every interval, handed out once,
scripted noise, restart cost learned from measured downtime; LR rules follow the GBS."""

from __future__ import annotations

import math
import statistics

import pytest

from copus.cluster.controller import Controller, ControllerSpec
from copus.core.efficiency import adascale_gain, efficiency, statistical_efficiency
from copus.core.layout import CandidateConfig
from copus.core.planner import RuleSettings
from copus.core.reconfiguration import BranchRequest
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


def test_a_controller_restarted_before_its_first_decision_counts_the_restart(tmp_path):
    """bench/faults.py's smoke kills the controller 0.1 s into training: its state file did not
    exist yet, and the restart went uncounted (summary.json said 0 restarts)."""
    path = tmp_path / "controller_state.json"
    Controller(spec(), state_path=str(path)).push(step(1, 0.0, CandidateConfig(2, 1, 1, 2, 8)))
    again = Controller(spec(), state_path=str(path))
    assert again.restarts == 1 and again.history == [] and again.evaluations == []
    assert Controller(spec(), state_path=str(path)).restarts == 2


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


# --- probes: the controller measures c where its decision hangs on it ------------------------

PROBE_TABLE = ((CandidateConfig(2, 1, 1, 2, 8), 100.0), (CandidateConfig(2, 1, 1, 2, 16), 120.0))


def _probing_controller(tmp_path, prior_sd: float, min_value_ratio: float = 1.0, use_gpu: bool = False) -> Controller:
    import types

    from copus.cluster.probes import ProbeSource
    from copus.core.probing import ProbeSettings
    from copus.storage import Location

    settings = ProbeSettings(prior_sd=prior_sd, first_samples=0, min_value_ratio=min_value_ratio)
    # The plan is read for its device only: no probe trains in these tests.
    plan = types.SimpleNamespace(use_gpu=use_gpu)
    source = ProbeSource(plan=plan, checkpoint_root=Location.parse(str(tmp_path)))
    return Controller(spec(throughputs=PROBE_TABLE, probes=settings), probe_source=source)


def test_on_a_gpu_cluster_a_probe_needs_a_gpu_no_worker_holds(tmp_path, monkeypatch):
    from copus.cluster import probes

    assert probes.probe_options(False) == {"num_cpus": 0, "num_gpus": 0}
    assert probes.probe_options(True) == {"num_cpus": 0, "num_gpus": 1}  # without one it would see no GPU
    # The decision of the test above, 40 s in, where a probe pays; every GPU held by the workers.
    monkeypatch.setattr(probes.ray, "available_resources", lambda: {"CPU": 0.0, "GPU": 0.0})
    c = _probing_controller(tmp_path, prior_sd=3.0, use_gpu=True)
    start = CandidateConfig(2, 1, 1, 2, 8)
    c.push(step(1, 1.0, start, b_noise=10.0))
    c.push(step(2, 40.0, start, b_noise=10.0))
    probe = c.evaluations[-1]["probe"]
    assert probe["worth"] is True and probe["not_started"] == probes.NO_DEVICE_FOR_PROBE
    assert c.decision() is None  # no branch checkpoint asked for: nothing could train from it
    monkeypatch.setattr(probes.ray, "available_resources", lambda: {"GPU": 1.0})  # a spare GPU
    free = _probing_controller(tmp_path, prior_sd=3.0, use_gpu=True)
    free.push(step(1, 1.0, start, b_noise=10.0))
    free.push(step(2, 40.0, start, b_noise=10.0))
    assert isinstance(free.decision(), BranchRequest)


def test_the_controller_asks_for_a_branch_once_when_its_decision_hangs_on_c(tmp_path):
    # B_noise 10: at c = 2 SE(16)/SE(8) = 28/36, GBS 16's goodput 93 < 100, so the run stays; at
    # the belief's high quantile (c = 2 e^3 = 40) it is 117: a decision that hangs on c. 40 s
    # into the run a probe pays: half the 26% at stake over 40 s more, against 192 samples at 80/s.
    c = _probing_controller(tmp_path, prior_sd=3.0)
    start = CandidateConfig(2, 1, 1, 2, 8)
    c.push(step(1, 1.0, start, b_noise=10.0))
    c.push(step(2, 40.0, start, b_noise=10.0))
    assert c.evaluations[-1]["switch"] is False and c.evaluations[-1]["probe"]["worth"] is True
    request = c.decision()
    assert isinstance(request, BranchRequest) and "GBS 16" in request.reason
    assert c.decision() is None  # asked for once
    assert c.snapshot()["belief"]["c"] == pytest.approx(2.0)


def test_a_probe_that_would_not_pay_for_itself_is_declined_and_says_why(tmp_path):
    # The same decision 12 s into the run: the probe's expected saving, 0.5 x 26% x 12 s = 1.6 s,
    # is less than its 2.4 s (192 samples at the run's 80 samples/s).
    c = _probing_controller(tmp_path, prior_sd=3.0)
    start = CandidateConfig(2, 1, 1, 2, 8)
    c.push(step(1, 1.0, start, b_noise=10.0))
    c.push(step(2, 12.0, start, b_noise=10.0))
    probe = c.evaluations[-1]["probe"]
    assert probe["worth"] is False and probe["gbs"] == 16
    low, high = 10 * 2 * math.exp(-3), 10 * 2 * math.exp(3)  # B_crit at the quantiles: c x B_noise
    se16_low, se16_high = (low + 8) / (low + 16), (high + 8) / (high + 16)
    assert probe["stake"] == pytest.approx(0.5 * ((1 - se16_low * 120 / 100) + (1 - 100 / (se16_high * 120))))
    assert probe["value_s"] == pytest.approx(0.5 * probe["stake"] * 12.0) and probe["cost_s"] == pytest.approx(192 / 80)
    assert c.decision() is None and c.snapshot()["probes_declined"] == 1
    always = _probing_controller(tmp_path, prior_sd=3.0, min_value_ratio=0.0)  # the test switched off
    always.push(step(1, 1.0, start, b_noise=10.0))
    always.push(step(2, 12.0, start, b_noise=10.0))
    assert isinstance(always.decision(), BranchRequest)


def test_the_controller_does_not_probe_where_the_decision_does_not_hang_on_c(tmp_path):
    c = _probing_controller(tmp_path, prior_sd=0.05)
    start = CandidateConfig(2, 1, 1, 2, 8)
    c.push(step(1, 1.0, start, b_noise=10.0))
    c.push(step(2, 12.0, start, b_noise=10.0))
    assert c.decision() is None and c.probes.wanted is None


def _curve(start: int, gbs: int, length: int, rate: float, seed: int) -> tuple[list[int], list[float]]:
    """Per-step losses from `start` at `gbs` that fall with the samples as 3 − 0.4 ln(1 + rate·x/512)
    (x: samples since `start`), with small noise: `rate` is the progress per sample."""
    import numpy as np

    rng = np.random.default_rng(seed)
    samples = list(range(start + gbs, start + length + 1, gbs))
    loss = [3.0 - 0.4 * math.log1p(rate * (s - start) / 512) + rng.normal(0, 0.002) for s in samples]
    return samples, loss


def test_a_finished_probe_is_set_against_the_runs_own_curve_and_moves_the_belief(tmp_path):
    # The run at GBS 8 and the probe at GBS 16 from 512 samples, where the larger batch makes 0.8
    # of the progress per sample: rho = 0.8, which at B_noise 10 says c = (0.8·16 − 8)/(0.2·10) = 2.4.
    c = _probing_controller(tmp_path, prior_sd=0.69)
    length = c.spec.probes.samples
    samples, loss = _curve(512, 16, length, 0.8, seed=1)
    c.probes.finished = {
        "start_samples": 512,
        "gbs": 16,
        "samples": samples,
        "train_loss": loss,
        "probe_time_s": 3.0,
        "run_gbs": 8,
        "b_noise": 10.0,
        "length": length,
    }
    run = CandidateConfig(2, 1, 1, 2, 8)
    run_samples, run_loss = _curve(512, 8, length, 1.0, seed=2)
    for n, (s, value) in enumerate(zip(run_samples, run_loss), start=65):
        c.push({**step(n, float(n), run, b_noise=10.0), "samples": s, "train_loss": value})
    probes = [r for r in c.drain((None, 0))[1] if r["kind"] == "probe"]
    assert len(probes) == 1 and c.probes.finished is None
    p = probes[0]
    assert p["probe_gain"] == pytest.approx(0.8, abs=0.03)
    assert p["probe_c_observed"] == pytest.approx(2.4, rel=0.25)
    assert p["belief_log_c_sd"] < 0.69  # the measurement narrowed the belief
    assert c.planner.critical_factor == pytest.approx(p["belief_c"])  # and the planner uses it
    assert c.snapshot()["belief"]["observations"][0]["rho"] == pytest.approx(p["probe_gain"])


def test_a_restarted_controller_goes_on_from_its_belief_and_planner(tmp_path):
    from copus.cluster.probes import ProbeSource
    from copus.core.belief import FactorBelief
    from copus.core.probing import ProbeSettings
    from copus.storage import Location

    state = tmp_path / "controller_state.json"
    source = ProbeSource(plan=None, checkpoint_root=Location.parse(str(tmp_path)))  # not reached here
    first = Controller(spec(throughputs=PROBE_TABLE, probes=ProbeSettings()), state, source)
    first.probes.belief = FactorBelief.prior(2.0, 0.69).observed_ratio(0.9, 0.8, 1.0, 10.0, 8, 16, 640, 0.5)
    first.probes.started = [640]
    start = CandidateConfig(2, 1, 1, 2, 8)
    first.push(step(1, 1.0, start))
    first.push(step(2, 12.0, start))  # a decision: the state is saved

    again = Controller(spec(throughputs=PROBE_TABLE, probes=ProbeSettings()), state, source)
    assert again.probes.belief == first.probes.belief and again.probes.started == [640]
    assert again.planner.critical_factor == pytest.approx(first.probes.belief.factor)


def test_a_probe_is_short_early_long_enough_for_its_larger_batch_and_capped():
    from copus.core.probing import ProbeSettings, probe_length

    s = ProbeSettings(samples=1024, share=0.5, min_steps=12)
    assert probe_length(s, 640, 16, 4) == 320  # half the samples seen
    assert probe_length(s, 640, 16, 64) == 768  # 12 steps of GBS 64
    assert probe_length(s, 8000, 16, 64) == 1024  # capped
    assert probe_length(s, 8000, 16, 128) == 1536  # unless 12 steps need more


def test_a_probe_pays_when_half_the_stake_over_the_run_so_far_exceeds_its_time():
    from copus.core.probing import ProbeSettings, decision_stake, probe_value

    # At the low quantile staying gives 100 and moving 80; at the high one moving 125, staying 100.
    assert decision_stake((100.0, 125.0), (80.0, 100.0)) == pytest.approx(0.2)
    assert math.isnan(decision_stake((100.0, math.nan), (80.0, 100.0)))  # a configuration not scored
    s = ProbeSettings(min_value_ratio=1.0)
    early = probe_value(s, 0.2, elapsed_s=30.0, probe_samples=800, run_speed=100.0)
    assert (early.value_s, early.cost_s, early.worth) == (pytest.approx(3.0), pytest.approx(8.0), False)
    assert probe_value(s, 0.2, elapsed_s=80.0, probe_samples=800, run_speed=100.0).worth  # 8 s against 8 s
    assert probe_value(ProbeSettings(min_value_ratio=2.0), 0.2, 80.0, 800, 100.0).worth is False
    assert probe_value(ProbeSettings(min_value_ratio=0.0), 0.2, 1.0, 800, 100.0).worth  # the test off
    unknown = probe_value(s, math.nan, 30.0, 800, 100.0)
    assert unknown.worth and unknown.as_dict()["value_s"] is None  # no stake known: probed, as before
    assert probe_value(s, 0.2, 30.0, 800, math.nan).worth  # no speed measured yet: likewise


def test_probe_settings_follow_the_config_and_stay_off_with_a_calibration_or_a_baseline(base_mapping):
    from copus.cluster.controller_setup import probe_settings
    from copus.config import config_from_mapping

    probes = {"samples": 512, "share": 0.25, "prior_sd": 1.0}
    cfg = config_from_mapping({**base_mapping, "policy": {"name": "copus", "probes": probes}})
    settings = probe_settings(cfg, calibrated=False)
    assert (settings.samples, settings.share, settings.prior_sd, settings.max_probes) == (512, 0.25, 1.0, 3)
    assert settings.first_samples == cfg.schedule.warmup_samples  # by default, not during the LR warm-up
    assert probe_settings(cfg, calibrated=True) is None  # auto: a calibration measured c already
    forced = config_from_mapping({**base_mapping, "policy": {"name": "copus", "probes": {"enabled": True}}})
    assert probe_settings(forced, calibrated=True) is not None
    off = config_from_mapping({**base_mapping, "policy": {"name": "copus", "probes": {"enabled": False}}})
    assert probe_settings(off, calibrated=False) is None
    assert probe_settings(config_from_mapping({**base_mapping, "policy": {"name": "static"}}), calibrated=False) is None


def test_each_decision_records_its_gain_quantile_costs_and_the_rest_of_the_run_off_the_curve():
    """With a target and a validation curve the horizon is read off the curve (before three
    evaluations, as long as the run so far); every evaluation and the switch order carry what was
    weighed; the critical batch's sd is the prior's and the noise estimate's together."""
    c = Controller(spec(target_loss=2.0, in_place_cost_s=1.0))
    start = CandidateConfig(2, 1, 1, 2, 8)
    c.push(step(1, 0.0, start))
    c.push(step(2, 10.0, start, b_noise=None))
    first = c.evaluations[-1]
    assert first["horizon_source"] == "elapsed" and first["horizon_s"] == 10.0 and first["log_b_crit_sd"] == 0.0
    c.decision()
    for n, (samples, loss) in enumerate([(80, 3.2), (160, 3.0), (320, 2.8), (640, 2.6)]):
        c.push({"kind": "eval", "step": n, "samples": samples, "val_loss": loss})
    c.push(step(10, 20.0, start))
    c.push(step(11, 30.5, start))
    e = c.evaluations[-1]
    assert e["rule"] == "quantile" and e["horizon_source"] == "target" and e["horizon_s"] > 0
    assert e["log_b_crit_sd"] == pytest.approx(math.hypot(0.69, 0.35))
    assert e["gain_low"] <= e["predicted_gain"] and e["cost_s"] >= e["transient_s"] >= 0.0
    # the pipeline at GBS 16 is 3x as fast for SE 0.93: the move is made, and its order carries the
    # same figures to the reconfigure record and MLflow
    order = c.decision()
    assert e["switch"] and order.config == CandidateConfig(1, 1, 2, 2, 16)
    assert order.rule == "quantile" and order.gain_low == e["gain_low"] and order.horizon_source == "target"


def test_the_threshold_rule_stays_selectable_and_reads_as_before():
    from copus.core.planner import RuleSettings

    c = Controller(spec(in_place_cost_s=1.0, rule=RuleSettings(rule="threshold")))
    start = CandidateConfig(2, 1, 1, 2, 8)
    c.push(step(1, 1.0, start))
    c.push(step(3, 11.5, start))
    assert c.evaluations[-1]["rule"] == "threshold" and c.evaluations[-1]["transient_s"] == 0.0
    assert c.decision().config == CandidateConfig(1, 1, 2, 2, 16)


def test_the_current_configurations_speed_is_its_latest_stretch_after_it_settled():
    from copus.cluster.controller import SPEED_MIN_STEPS, SPEED_SETTLE_STEPS, current_speed

    def steps(label, n, seconds, gbs=16):
        return [{"config": label, "step_time_s": seconds, "gbs": gbs} for _ in range(n)]

    settled = SPEED_SETTLE_STEPS + SPEED_MIN_STEPS
    # an earlier stretch in the same configuration does not count; the first steps after a switch are left out
    history = steps("a", 30, 0.1) + steps("b", 5, 0.5) + steps("a", SPEED_SETTLE_STEPS, 9.0) + steps("a", 9, 0.2)
    assert math.isnan(current_speed(history, "a"))  # 9 settled steps: not yet
    history += steps("a", 1, 0.2)
    assert len(history) - 35 == settled
    assert current_speed(history, "a") == pytest.approx(16 / 0.2)
    history += [{"config": "a", "step_time_s": 3.0, "gbs": 16}]  # one slow step: the median keeps it out
    assert current_speed(history, "a") == pytest.approx(16 / 0.2)
    assert math.isnan(current_speed(history, "b"))  # not the latest stretch


def test_read_by_its_mean_a_configuration_with_bimodal_steps_is_as_fast_as_the_run_pays():
    """pp2 mbs 2 at GBS 8 on the emulated cluster: most steps 0.12 s, one in three 0.30 s. The
    median reads 0.12 s; the run pays the mean, 0.18 s."""
    from copus.cluster.controller import SPEED_SETTLE_STEPS, current_speed, measured_speeds

    times = [0.3] * SPEED_SETTLE_STEPS + [0.12, 0.12, 0.30] * 12
    history = [{"config": "a", "step_time_s": t, "gbs": 8} for t in times]
    assert current_speed(history, "a") == pytest.approx(8 / 0.12)
    assert current_speed(history, "a", "mean") == pytest.approx(8 / 0.18)
    assert measured_speeds(history, "mean") == {"a": pytest.approx(8 / 0.18)}
    with pytest.raises(ValueError, match="policy.run_speed_reading"):
        RuleSettings(run_speed_reading="mode")
    # the controller reads the run's speed as its rule says
    start = CandidateConfig(2, 1, 1, 2, 8)
    model = tuple((c, 1.25 * v) for c, v in TABLE)
    seconds = {n: 0.1 if n % 3 else 0.4 for n in range(1, 16)}
    for reading in ("median", "mean"):
        c = Controller(spec(model_throughputs=model, rule=RuleSettings(run_speed_reading=reading)))
        for n in range(1, 16):
            c.push({**step(n, 0.9 * n, start), "step_time_s": seconds[n]})
        e = c.evaluations[-1]
        read = [seconds[n] for n in range(SPEED_SETTLE_STEPS + 1, e["step"] + 1)]
        typical = statistics.fmean(read) if reading == "mean" else statistics.median(read)
        assert e["current"]["throughput"] == pytest.approx(8 / typical)


def test_a_decision_records_the_runs_speed_factor_and_the_one_a_band_carries_to_the_others():
    """The run pays 80 samples/s where its table reads 100 (x0.8); with a band of [0.9, 1.1] the
    other candidates read at x0.9 of theirs, and the evaluation says both factors."""
    start = CandidateConfig(2, 1, 1, 2, 8)
    model = tuple((c, 1.25 * v) for c, v in TABLE)
    for band, shared in ((None, 0.8), ((0.9, 1.1), 0.9)):
        c = Controller(spec(model_throughputs=model, rule=RuleSettings(run_speed_band=band)))
        for n in range(1, 16):
            c.push(step(n, 0.9 * n, start))
        e = c.evaluations[-1]
        assert (e["run_speed_factor"], e["shared_speed_factor"]) == pytest.approx((0.8, shared))
        assert e["current"]["throughput"] == pytest.approx(80.0)
        assert e["best"]["throughput"] == pytest.approx(100.0 * 375.0 / 125.0 * shared)


def test_every_configuration_the_run_trained_in_has_its_latest_stretchs_speed():
    from copus.cluster.controller import SPEED_MIN_STEPS, SPEED_SETTLE_STEPS, measured_speeds

    def steps(label, n, seconds, gbs=16):
        return [{"config": label, "step_time_s": seconds, "gbs": gbs} for _ in range(n)]

    enough = SPEED_SETTLE_STEPS + SPEED_MIN_STEPS
    history = steps("a", enough, 0.1) + steps("b", enough, 0.5, 32) + steps("c", enough - 1, 0.2)
    assert measured_speeds(history) == {"a": pytest.approx(160.0), "b": pytest.approx(64.0)}  # c: not yet
    history += steps("a", enough, 0.4)  # a again, slower: its latest stretch counts
    assert measured_speeds(history) == {"a": pytest.approx(40.0), "b": pytest.approx(64.0)}
    assert measured_speeds([]) == {}


def test_a_decision_reads_the_current_configuration_at_the_runs_own_speed():
    """Its step records say the run pays 0.1 s a step at GBS 8 (80 samples/s) where the profile
    read 100: the decision's current throughput is the run's, a candidate's the model's times
    the same factor; with `read_run_speed` off, the profile's figures stand."""
    start = CandidateConfig(2, 1, 1, 2, 8)
    model = tuple((c, 1.25 * v) for c, v in TABLE)  # the model reads every point 25% faster still
    for read, current, other in ((True, 80.0, 375.0 * 80.0 / 125.0), (False, 100.0, 300.0)):
        c = Controller(spec(model_throughputs=model, rule=RuleSettings(read_run_speed=read)))
        for n in range(1, 16):
            c.push(step(n, 0.9 * n, start))
        e = c.evaluations[-1]
        assert e["current"]["throughput"] == pytest.approx(current)
        assert e["best"]["config"] == CandidateConfig(1, 1, 2, 2, 16).as_dict()
        assert e["best"]["throughput"] == pytest.approx(other)
