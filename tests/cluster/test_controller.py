"""The Goodput controller end to end on Ray Train: with a scripted throughput table and a
rising noise scale, the copus policy changes GBS in place once and then the layout, in place
inside the living workers (reconfigure: auto); the run's samples and losses match a
one-process reference that makes the same GBS changes without any layout change. When the
in-place path fails, the run falls back to a worker-group restart and completes; the
controller carries its state over the relaunch."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from mlflow.tracking import MlflowClient

from copus.cluster.driver import run_experiment
from copus.cluster.launch import prepare_plan
from copus.cluster.profiler import save_stated_table
from copus.config import config_from_mapping
from copus.core.belief import FactorBelief
from copus.core.layout import CandidateConfig
from copus.train.local import run_local
from tests.train.loop_helpers import shapes_hook

pytestmark = pytest.mark.slow

# Samples/s the "profile" claims: data parallel is best at small GBS, the pipeline at GBS 32.
SCRIPTED = {
    (2, 1, 1, 8): 100.0,
    (2, 1, 1, 16): 150.0,
    (2, 1, 1, 32): 160.0,
    (1, 1, 2, 8): 50.0,
    (1, 1, 2, 16): 100.0,
    (1, 1, 2, 32): 200.0,
}


def _write_scripted_profile(cfg, scripted: dict[tuple[int, int, int, int], float] = SCRIPTED) -> None:
    """A profile table of (dp, tp, pp, gbs) -> samples/s at MBS 2, where the run looks for it."""
    save_stated_table(
        cfg, {CandidateConfig(dp, tp, pp, 2, gbs): per_s for (dp, tp, pp, gbs), per_s in scripted.items()}
    )


def _mapping(base_mapping) -> dict:
    return {
        **base_mapping,
        "batch": {"gbs": 8, "mbs": 2},
        "search": {"gbs_min": 8, "gbs_max": 32, "mbs": [2], "layouts": [[2, 1, 1], [1, 1, 2]]},
        # The scripted noise scales and table were chosen for Pollux's original form, SE from
        # B_noise itself (c = 1; the pollux form ignored c then): with it decision 1 picks GBS 16,
        # with the default c it picks 24. Pinned, so the test does not follow the default.
        "gns": {"critical_factor": 1.0},
        # The scripted decisions were chosen for the threshold rule (10% ahead at the central
        # estimate); this file tests how a decided change is made, not how it is decided (the
        # quantile rule's decisions: tests/core/test_decision_rule.py, tests/test_controller_logic.py).
        # The scripted table is what the planner reads: not rescaled to the speed these CPU
        # workers really run at (policy.read_run_speed, tested in tests/test_controller_logic.py).
        "policy": {
            "name": "copus",
            "decision_rule": "threshold",
            "read_run_speed": False,
            "interval_s": 0.5,
            "restart_cost_s": 0.05,
            "in_place_cost_s": 0.05,
            "threshold": 0.1,
        },
        "stop": {"max_steps": 90, "max_wall_clock_s": 120},
        "eval": {"every_steps": 1000, "val_samples": 8},
        "checkpoint": {"every_steps": 1000},
    }


def test_copus_changes_gbs_then_layout_in_place(base_mapping, tmp_path):
    cfg = config_from_mapping(_mapping(base_mapping))
    _write_scripted_profile(cfg)
    messages: list[str] = []
    # Decision 1 sees B_noise 20: GBS 16 in place is best (+17%); decision 2 sees 1000: the
    # pipeline at GBS 32 (+31%, a layout change); later decisions: stay.
    summary = run_experiment(cfg, echo=messages.append, b_noise_script=(20.0, 1000.0))

    recon = summary["reconfigurations"]
    assert len(recon) == 2, recon
    first, second = recon
    assert (
        first["in_place"]
        and first["from"]["gbs"] == 8
        and CandidateConfig.from_dict(first["to"]) == CandidateConfig(2, 1, 1, 2, 16)
    )
    assert second["in_place"] and CandidateConfig.from_dict(second["to"]) == CandidateConfig(1, 1, 2, 2, 32)
    assert first["change"] == "gbs" and second["change"] == "layout"
    # dp2 -> pp2: each rank already holds its new stage (a full replica before): all copied locally.
    assert second["reshard"]["bytes_moved"] == 0 and second["reshard"]["bytes_local"] > 0
    assert first["predicted_gain"] == pytest.approx(116.67 / 100 - 1, rel=1e-3)
    assert second["downtime_s"] > first["downtime_s"] >= 0
    assert summary["layout"] == second["to"] and summary["launches"] == 1  # no worker group restarted
    assert summary["controller"]["decisions"] >= 3 and summary["controller"]["in_place_cost_s"] == second["downtime_s"]
    assert any("reconfigure dp2-tp1-pp1 mbs2 gbs8 -> dp2-tp1-pp1 mbs2 gbs16 (in place" in m for m in messages)
    assert any("reconfigure dp2-tp1-pp1 mbs2 gbs16 -> dp1-tp1-pp2 mbs2 gbs32 (in place, " in m for m in messages)

    client = MlflowClient(tracking_uri=cfg.resolved_tracking_uri())
    run = summary["mlflow_run_id"]
    losses = {m.step: m.value for m in client.get_metric_history(run, "train_loss")}
    gbs = {m.step: m.value for m in client.get_metric_history(run, "gbs")}
    pp = {m.step: m.value for m in client.get_metric_history(run, "pp")}
    assert sorted(losses) == list(range(1, summary["steps"] + 1))
    assert pp[second["step"]] == 1 and pp[second["step"] + 1] == 2  # the next step ran as a pipeline
    assert [m.step for m in client.get_metric_history(run, "reconfiguration_downtime_s")] == [
        first["step"],
        second["step"],
    ]
    saved = json.loads((cfg.resolved_output_dir() / "summary.json").read_text())
    assert len(saved["reconfigurations"]) == 2

    # Reference: one process, the same GBS changes at the same steps, no layout change.
    _, plan = prepare_plan(cfg)
    reference = plan.replaced(dp=1, stop=replace(plan.stop, max_wall_clock_s=None, max_steps=summary["steps"]))
    shapes = {first["step"]: (16, 2), second["step"]: (32, 2)}
    records, final, _ = run_local(reference, tmp_path / "ref-ckpt", batch_size=shapes_hook(shapes))
    ref_losses = {r["step"]: r["train_loss"] for r in records if r["kind"] == "step"}
    assert final["samples"] == summary["samples"]
    assert all(gbs[r["step"]] == r["gbs"] for r in records if r["kind"] == "step")
    diff = {s: abs(losses[s] / ref_losses[s] - 1) for s in ref_losses}
    # Layouts differ only in floating-point summation order: identical until that drift is
    # amplified by training (after tens of steps), and the layout change adds no jump of its own.
    assert max(d for s, d in diff.items() if s <= min(first["step"], 30)) < 1e-4
    before = max(diff[s] for s in range(second["step"] - 2, second["step"] + 1))
    after = max(diff[s] for s in range(second["step"] + 1, min(second["step"] + 4, summary["steps"] + 1)))
    assert after <= max(1e-3, 20 * before), (before, after)
    assert max(diff.values()) < 5e-2


def test_a_failing_in_place_change_falls_back_to_a_restart(base_mapping, monkeypatch):
    cfg = config_from_mapping({**_mapping(base_mapping), "stop": {"max_steps": 60, "max_wall_clock_s": 120}})
    _write_scripted_profile(cfg)
    monkeypatch.setenv("COPUS_INJECT_RESHARD_FAILURE", "1")
    messages: list[str] = []
    summary = run_experiment(cfg, echo=messages.append, b_noise_script=(20.0, 1000.0))
    first, second = summary["reconfigurations"]
    assert first["in_place"] and not second["in_place"] and "InjectedReshardFault" in second["fell_back"]
    assert summary["layout"] == second["to"] and summary["launches"] == 2 and summary["stop_reason"] == "max_steps"
    assert summary["steps"] == 60 and summary["controller"]["reconfigure"] == "restart"
    assert summary["controller"]["restart_cost_s"] == second["downtime_s"] > 0
    assert any("(restart after the in-place path failed: " in m for m in messages)


def test_without_a_calibration_the_controller_probes_where_its_decision_hangs_on_c(base_mapping):
    # B_noise 4 (scripted) and c with a wide prior (median 1, sd 2 in log c): at c = e^-2 and at
    # the median the policy keeps GBS 8, at c = e^2 it picks a larger one (16 or 24, as the fitted
    # step-time model has it). So the controller asks for a branch checkpoint, a probe trains 320
    # samples at that GBS from it beside the run, and once the run has trained as far at GBS 8 the
    # two curves are set against each other. A probe's price is not weighed (min_value_ratio 0:
    # a few seconds into a debug run none would pay; that test is tests/test_controller_logic.py's).
    probes = {"prior_sd": 2.0, "max_probes": 1, "samples": 320, "first_samples": 0, "min_value_ratio": 0}
    mapping = _mapping(base_mapping)
    mapping["policy"] = {**mapping["policy"], "probes": probes, "interval_s": 1.0}
    mapping["stop"] = {"max_steps": 150, "max_wall_clock_s": 150}
    cfg = config_from_mapping(mapping)
    _write_scripted_profile(cfg)
    messages: list[str] = []
    summary = run_experiment(cfg, echo=messages.append, b_noise_script=(4.0,))

    records = [json.loads(line) for line in (cfg.resolved_output_dir() / "records.jsonl").read_text().splitlines()]
    branches = [r for r in records if r["kind"] == "checkpoint" and r.get("branch")]
    assert len(branches) == 1, [m for m in messages if "probe" in m]
    (probe,) = [r for r in records if r["kind"] == "probe"]
    assert (probe["run_gbs"], probe["start_samples"]) == (8, branches[0]["samples"]) and probe["probe_gbs"] > 8
    assert probe["probe_time_s"] > 0
    belief = summary["controller"]["belief"]
    assert belief["c"] == pytest.approx(probe["belief_c"])
    # Where the branch falls depends on the clock, and so does what the probe can measure: on the
    # debug model's steep early curve a probe at the larger GBS sometimes starts below where the
    # run ends (no common progress; the record says so and the belief stays the prior). Otherwise
    # the belief is the prior updated with exactly this measurement (which may even widen it).
    # The measurement itself is checked on fixed curves in tests/test_controller_logic.py.
    if probe["probe_gain"] is None:
        assert probe["note"].startswith("not used") and belief["observations"] == []
        assert (belief["mean"], belief["sd"]) == pytest.approx((0.0, 2.0))
    else:
        (seen,) = belief["observations"]
        assert (seen["rho"], seen["low"], seen["high"]) == (
            probe["probe_gain"],
            probe["probe_gain_low"],
            probe["probe_gain_high"],
        )
        expected = FactorBelief.prior(1.0, 2.0).observed_ratio(
            seen["rho"], seen["low"], seen["high"], 4.0, 8, probe["probe_gbs"], probe["start_samples"], 0.5
        )
        assert (belief["mean"], belief["sd"]) == pytest.approx((expected.mean, expected.sd))
    assert summary["controller"]["probes_started"] == [branches[0]["samples"]]
    assert any(m.startswith(f"[{probe['wall_clock_s']:.0f} s] probe at GBS {probe['probe_gbs']}") for m in messages)
    client = MlflowClient(tracking_uri=cfg.resolved_tracking_uri())
    (logged,) = client.get_metric_history(summary["mlflow_run_id"], "belief_c")
    assert logged.value == pytest.approx(probe["belief_c"]) and logged.step == probe["step"]
