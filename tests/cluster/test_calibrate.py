"""`copus calibrate` end to end through Ray Tune on the debug model: branch points, a GBS grid
with two seeds, fits, the calibration file, MLflow parent and children, restart, and the
planner reading it; bad settings refused before anything starts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import ray
import yaml
from mlflow.tracking import MlflowClient

from copus.cli import main
from copus.cluster.calibrate import (
    _say_replaced,
    calibration_path,
    load_calibration,
    quick_branches,
    run_calibration,
)
from copus.cluster.launch import prepare_plan
from copus.config import config_from_mapping
from copus.core.calibration import CalibratedMapping
from copus.core.layout import CandidateConfig
from copus.core.planner import Planner

GRID = [2, 4, 8, 32]
SETTINGS = [
    f"calibration.gbs={GRID}",
    "calibration.branch_samples=[16,48]",
    # The debug model's loss falls 0.1-0.4 a step here: a smaller decrement is reached within the
    # first step, which the calibration refuses as not measurable.
    "calibration.decrement=0.5",
    "calibration.val_samples=8",  # the default (512) is for real workloads: slow here, to no purpose
    "calibration.seeds=2",
    "calibration.max_samples=640",
    "calibration.eval_every_samples=16",
    "calibration.gns_steps=4",
    "stop.max_steps=100",
    # The LR rule's share: B0 = 8 at twice the rule's LR, which is also the LR the rule gives
    # GBS 32 (sqrt rule): one pair besides the grid, 4 more continuations.
    "calibration.lr_probe={gbs: [8], factors: [2.0], jump_to: 32}",
]


@pytest.mark.slow
def test_calibration_measures_fits_and_is_read_by_the_planner(base_mapping):
    cfg = config_from_mapping(base_mapping, SETTINGS)
    lines: list[str] = []
    data = run_calibration(cfg, lines.append)

    assert len(data["branch_points"]) == 2 and len(data["points"]) == 2 * (len(GRID) + 1) * 2
    first, second = data["branch_points"]
    assert first["samples_seen"] == 16 and second["samples_seen"] == 48 and second["val_loss"] < first["val_loss"]
    for b in data["branch_points"]:
        for key in ("val_loss", "b_crit", "b_crit_low", "b_crit_high", "b_noise", "b_noise_adam", "c"):
            assert key in b
        assert b["gbs"] == GRID and b["b_crit"] is not None and b["b_crit"] >= 0
        # null where the estimate is not finite (|G|^2 <= 0 over so few batches reads as all noise)
        assert b["b_noise"] is not None or b["b_noise_adam"] is not None
    for p in data["points"]:
        assert {"branch", "gbs", "seed", "samples", "steps"} <= set(p)
        if p["reached"]:
            assert p["steps"] == pytest.approx(p["samples"] / p["gbs"])
    assert sum(1 for line in lines if line.startswith("[")) == 20  # a progress line per run
    # The cost: the reference run, the noise measurements and every continuation, in its units.
    kept = _work_points(cfg)
    own = sum(p["wall_clock_s"] for p in kept)
    assert len(kept) == 20 and data["cost_s"] >= data["reference_run_s"] + own - 1e-6
    assert data["cost_in_reference_runs"] == pytest.approx(data["cost_s"] / data["reference_run_s"])
    # ... and each continuation's own share of it is in the file.
    assert sorted(p["wall_clock_s"] for p in data["points"]) == sorted(p["wall_clock_s"] for p in kept)

    # The LR probe: the B0 continuations at the jumped LR, against B0 and GBS 32 at the rule's LR.
    probe = data["lr_probe"]
    assert probe["jump_factor"] == pytest.approx(2.0) and len(probe["rows"]) == 2 and len(probe["jumps"]) == 2
    for row, jump in zip(probe["rows"], probe["jumps"]):
        assert (row["gbs"], row["lr_factor"], row["seeds"]) == (8, 2.0, 2)
        assert jump["samples_b0_jumped_lr"] == row["mean_samples"] and jump["samples_b0"] == row["rule_samples"]
    assert sum(1 for p in data["points"] if p["lr_factor"] == 2.0) == 4
    # ... and only the grid's points at the rule's LR enter the fit.
    assert all(len(b["gbs"]) <= len(GRID) for b in data["branch_points"])

    # The switch's transient, read off every grid continuation's kept curve: a row per GBS but B0.
    b0 = cfg.optimizer.reference_gbs
    assert [t["branch"] for t in data["transient"]] == [0, 1]
    for t in data["transient"]:
        assert [r["gbs"] for r in t["rows"]] == [g for g in GRID if g != b0]
        assert all(r["seeds"] <= 2 for r in t["rows"]) and "b_crit_late" in t

    # Stored beside the profile table, keyed by the workload: the controller's planner reads it.
    tokens, _ = prepare_plan(cfg)
    stored = load_calibration(cfg, tokens.fingerprint)
    assert stored is not None and stored["id"] == data["id"]
    planner = Planner.from_table({CandidateConfig(1, 1, 1, 2, g): 1.0 for g in (4, 8)}, 8, "pollux", 2.0, 0.1, stored)
    assert isinstance(planner.mapping, CalibratedMapping)

    # MLflow: one parent with the fits, a child per continuation.
    client = MlflowClient(tracking_uri=cfg.resolved_tracking_uri())
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    runs = client.search_runs([exp.experiment_id])
    parent = [r for r in runs if r.data.tags.get("kind") == "calibration"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent[0].info.run_id]
    assert len(parent) == 1 and len(children) == 20
    assert "b_crit.b0" in parent[0].data.metrics or first["b_crit"] is None

    # A second call finds every run done and gives the same fits without training again.
    again = run_calibration(cfg, lines.append)
    assert again["branch_points"] == data["branch_points"] and again["tune_overhead_s_per_trial"] is None

    # Another noise estimator: the continuations are taken over (no continuation runs, the same
    # B_crit), only the reference run is repeated, and the file is keyed by the new estimator.
    fixed = config_from_mapping(base_mapping, [*SETTINGS, "gns.horizon=fixed"])
    lines.clear()
    reused = run_calibration(fixed, lines.append, reuse_points=data["path"])
    assert not any(line.startswith("[") for line in lines) and reused["tune_overhead_s_per_trial"] is None
    assert reused["key"]["gns"] != data["key"]["gns"] and reused["path"] != data["path"]
    assert [b["b_crit"] for b in reused["branch_points"]] == [b["b_crit"] for b in data["branch_points"]]
    assert reused["settings"]["points_from"]["id"] == data["id"]
    assert reused["transient"] is None  # points taken over from a file keep no curves
    assert all(p["wall_clock_s"] is None for p in reused["points"])  # they cost nothing here
    assert load_calibration(fixed, tokens.fingerprint)["id"] == reused["id"]


def _work_points(cfg) -> list[dict]:
    """The continuations the calibration kept in its work folder (each with its own wall-clock)."""
    tokens, _ = prepare_plan(cfg)
    folder = calibration_path(cfg, tokens.fingerprint)
    return [json.loads(f.read_text()) for f in Path(str(folder).removesuffix(".json")).glob("*/points/*.json")]


def test_bad_calibration_settings_are_refused_before_anything_starts(base_mapping, tmp_path, capsys):
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(base_mapping))
    was_up = ray.is_initialized()
    assert main(["calibrate", str(path), "--set", "calibration.gbs=[4,8,16]"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("copus: calibration.gbs:")
    assert main(["calibrate", str(path), "--set", "calibration.branch_samples=[12,48]"]) == 2
    assert "calibration.branch_samples" in capsys.readouterr().err
    assert ray.is_initialized() == was_up and not (tmp_path / "out").exists()


def test_a_suite_is_calibrated_where_its_runs_look(base_mapping, tmp_path):
    import argparse

    from copus.cli import experiment_config

    suite = {
        "name": "s",
        "policies": ["copus", "static"],
        "output_dir": str(tmp_path / "suite"),
        "experiment": base_mapping,
    }
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(suite))
    cfg = experiment_config(argparse.Namespace(experiment=str(path), overrides=[]))
    assert cfg.resolved_profile_dir() == (tmp_path / "suite" / "profiles").resolve()
    assert json.loads(json.dumps(cfg.model_dump(mode="json")))["name"] == "test"


def test_quick_mode_keeps_two_seeds_at_two_middle_branch_points(tmp_path):
    import argparse

    from copus.cli import calibrate_config

    experiment = yaml.safe_load(Path("experiments/tradeoff_cpu.yaml").read_text())
    experiment["calibration"]["seeds"] = 6
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(experiment))

    assert quick_branches([320, 1280, 3840, 9600]) == [1280, 3840]  # neither the warm-up's nor the dearest
    assert quick_branches([1, 2, 3, 4, 5]) == [2, 3]
    assert quick_branches([16, 48, 96]) == [16, 48]  # three: not the dearest
    assert quick_branches([16, 48]) == [16, 48]

    def cfg(*overrides, quick=True):
        args = argparse.Namespace(experiment=str(tmp_path / "exp.yaml"), overrides=list(overrides), quick=quick)
        return calibrate_config(args)

    quick = cfg()
    assert (quick.calibration.seeds, quick.calibration_branches()) == (2, [1280, 3840])
    assert quick.calibration_grid() == cfg(quick=False).calibration_grid()  # the grid is the experiment's
    assert cfg("calibration.seeds=3").calibration.seeds == 3  # the user's --set wins
    assert cfg("calibration.branch_samples=[16, 32, 64, 128]").calibration_branches() == [16, 32, 64, 128]
    full = cfg(quick=False)
    assert full.calibration.seeds == 6 and full.calibration_branches() == [320, 1280, 3840, 9600]


def test_a_calibration_that_measured_less_says_what_it_replaces(tmp_path):
    from copus.storage import Location

    path = Location.parse(str(tmp_path / "calibration-x.json"))
    lines: list[str] = []
    _say_replaced(path, {"points": [{}] * 8}, lines.append)  # nothing there yet
    path.write_text(json.dumps({"points": [{}] * 32}))
    _say_replaced(path, {"points": [{}] * 32}, lines.append)  # as many: a rerun
    _say_replaced(path, {"points": [{}] * 8}, lines.append)
    assert len(lines) == 1 and "replaces a calibration of 32 continuations with this one of 8" in lines[0]


def test_on_a_gpu_cluster_each_continuation_asks_for_a_gpu_and_a_workers_cores():
    from copus.cluster.calibrate import task_resources, trial_cpus

    assert task_resources(2.0, use_gpu=False) == {"cpu": 2.0}
    assert task_resources(4.0, use_gpu=True) == {"cpu": 4.0, "gpu": 1}  # a task without one sees no GPU
    assert trial_cpus(use_gpu=True, cpus_per_worker=4) == 4.0  # one continuation per GPU
    # On CPU every core of the driver's machine, whatever a worker's share: one continuation at a time.
    assert trial_cpus(use_gpu=False, cpus_per_worker=4) == float(os.cpu_count())
