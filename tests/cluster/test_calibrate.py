"""`copus calibrate` end to end through Ray Tune on the debug model: branch points, a GBS grid
with two seeds, fits, the calibration file, MLflow parent and children, restart, and the
planner reading it; bad settings refused before anything starts."""

from __future__ import annotations

import json

import pytest
import ray
import yaml
from mlflow.tracking import MlflowClient

from copus.cli import main
from copus.cluster.calibrate import load_calibration, run_calibration
from copus.cluster.launch import prepare_plan
from copus.config import config_from_mapping
from copus.core.calibration import CalibratedMapping
from copus.core.layout import CandidateConfig
from copus.core.planner import Planner

GRID = [2, 4, 8, 32]
SETTINGS = [
    f"calibration.gbs={GRID}",
    "calibration.branch_samples=[16,48]",
    "calibration.decrement=0.05",
    "calibration.seeds=2",
    "calibration.max_samples=640",
    "calibration.eval_every_samples=16",
    "calibration.gns_steps=4",
    "stop.max_steps=100",
]


@pytest.mark.slow
def test_calibration_measures_fits_and_is_read_by_the_planner(base_mapping):
    cfg = config_from_mapping(base_mapping, SETTINGS)
    lines: list[str] = []
    data = run_calibration(cfg, lines.append)

    assert len(data["branch_points"]) == 2 and len(data["points"]) == 2 * len(GRID) * 2
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
    assert sum(1 for line in lines if line.startswith("[")) == 16  # a progress line per run

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
    assert len(parent) == 1 and len(children) == 16
    assert "b_crit.b0" in parent[0].data.metrics or first["b_crit"] is None

    # A second call finds every run done and gives the same fits without training again.
    again = run_calibration(cfg, lines.append)
    assert again["branch_points"] == data["branch_points"] and again["tune_overhead_s_per_trial"] is None


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
