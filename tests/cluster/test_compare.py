"""`copus compare` on Ray: every policy and repeat runs, as child runs of one MLflow parent,
sharing one profile; comparison.json has what the README promises."""

from __future__ import annotations

import json

import pytest
import yaml
from mlflow.tracking import MlflowClient

from copus.cli import main

pytestmark = pytest.mark.slow


def test_compare_runs_policies_under_one_parent(base_mapping, tmp_path, capsys):
    experiment = {**base_mapping,
                  "search": {"gbs_min": 8, "gbs_max": 16, "mbs": [2], "layouts": [[2, 1, 1], [1, 1, 2]]},
                  "profile": {"budget_s": 60, "warmup_steps": 1, "steps": 2, "gbs_per_shape": 2, "folds": 3},
                  "policy": {"interval_s": 2.0},
                  "stop": {"target_val_loss": 4.2, "max_steps": 40},
                  "eval": {"every_steps": 5, "val_samples": 8},
                  "checkpoint": {"every_steps": 1000}}
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(experiment))
    suite = {"name": "tiny-suite", "experiment": "exp.yaml", "policies": ["copus", "static"], "repeats": 2,
             "output_dir": str(tmp_path / "cmp")}
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite))

    assert main(["compare", str(tmp_path / "suite.yaml"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    saved = json.loads((tmp_path / "cmp" / "comparison.json").read_text())
    assert saved["policies"] == result["policies"]
    assert [(r["policy"], r["repeat"], r["seed"]) for r in result["runs"]] == \
        [("copus", 0, 0), ("static", 0, 0), ("copus", 1, 1), ("static", 1, 1)]
    for policy in ("copus", "static"):
        stats = result["policies"][policy]
        assert stats["runs"] == 2 and {"time_to_target_s", "reached_target", "final_val_loss", "samples",
                                       "reconfigurations"} <= set(stats)
    copus = result["policies"]["copus"]
    if copus["reached_target"] and result["policies"]["static"]["reached_target"]:
        expected = result["policies"]["static"]["time_to_target_s"] / copus["time_to_target_s"] - 1
        assert copus["speedup_vs_fastest_baseline"] == pytest.approx(expected)
    assert len(list((tmp_path / "cmp" / "profiles").glob("profile-*.json"))) == 1  # profiled once

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    parent = result["mlflow_parent_run_id"]
    children = [client.get_run(r["mlflow_run_id"]) for r in result["runs"]]
    assert all(c.data.tags["mlflow.parentRunId"] == parent for c in children)
    assert {c.data.tags["policy"] for c in children} == {"copus", "static"}
    assert client.get_run(parent).info.status == "FINISHED"
    assert [a.path for a in client.list_artifacts(parent)] == ["comparison.json"]


def test_a_bad_suite_names_the_field(tmp_path, capsys):
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump({"experiment": "nope.yaml"}))
    assert main(["compare", str(tmp_path / "suite.yaml")]) == 2
    assert "experiment: file not found" in capsys.readouterr().err
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump({"experiment": "x.yaml", "policies": ["magic"]}))
    assert main(["compare", str(tmp_path / "suite.yaml")]) == 2
    assert "policies.0" in capsys.readouterr().err
