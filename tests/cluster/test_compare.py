"""`copus compare` on Ray: every policy and repeat runs, as child runs of one MLflow parent,
sharing one profile; comparison.json has what the README promises."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from mlflow.tracking import MlflowClient

from copus.cli import main
from copus.cluster.compare import comparison_columns
from copus.tracking import ui_runs_url
from tests.browser import NO_BROWSER, browser, dump_dom, mlflow_ui

pytestmark = pytest.mark.slow

POLICIES = ["copus", "copus-gbs", "static"]


def test_compare_runs_policies_under_one_parent(base_mapping, tmp_path, capsys):
    experiment = {
        **base_mapping,
        "search": {"gbs_min": 8, "gbs_max": 16, "mbs": [2], "layouts": [[2, 1, 1], [1, 1, 2]]},
        "profile": {"budget_s": 60, "warmup_steps": 1, "steps": 2, "gbs_per_shape": 2, "folds": 3},
        "policy": {"interval_s": 2.0},
        "stop": {"target_val_loss": 4.2, "max_steps": 40},
        "eval": {"every_steps": 5, "val_samples": 8},
        "checkpoint": {"every_steps": 1000},
    }
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(experiment))
    suite = {
        "name": "tiny-suite",
        "experiment": "exp.yaml",
        "policies": POLICIES,
        "repeats": 2,
        "output_dir": str(tmp_path / "cmp"),
    }
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite))

    assert main(["compare", str(tmp_path / "suite.yaml"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    saved = json.loads((tmp_path / "cmp" / "comparison.json").read_text())
    assert saved["policies"] == result["policies"]
    assert saved["mlflow_view_key"] == result["mlflow_view_key"] == f"compare-{result['mlflow_parent_run_id']}"
    # Each repeat ran every policy once, in the recorded (shuffled) order, on the repeat's seed.
    orders = result["run_order"]["repeats"]
    assert result["run_order"]["order"] == "shuffled" and [sorted(o) for o in orders] == [sorted(POLICIES)] * 2
    assert [(r["policy"], r["repeat"], r["seed"], r["position"]) for r in result["runs"]] == [
        (policy, repeat, repeat, position) for repeat in (0, 1) for position, policy in enumerate(orders[repeat])
    ]
    gbs_only = [r for r in result["runs"] if r["policy"] == "copus-gbs"]
    assert all(
        {k: r["final_layout"][k] for k in ("dp", "tp", "pp", "mbs")}
        == {k: r["initial_layout"][k] for k in ("dp", "tp", "pp", "mbs")}
        for r in gbs_only
    )  # only the GBS moves
    for policy in ("copus", "copus-gbs", "static"):
        stats = result["policies"][policy]
        assert stats["runs"] == 2 and {
            "time_to_target_s",
            "reached_target",
            "final_val_loss",
            "samples",
            "reconfigurations",
        } <= set(stats)
    copus = result["policies"]["copus"]
    for ours in ("copus", "copus-gbs"):  # the ablation is measured against the baselines, never one itself
        s = result["policies"][ours]
        if s["reached_target"] and result["policies"]["static"]["reached_target"]:
            expected = result["policies"]["static"]["time_to_target_s"] / s["time_to_target_s"] - 1
            assert s["speedup_vs_fastest_baseline"] == pytest.approx(expected) and s["fastest_baseline"] == "static"
            assert len(s["paired_speedup_per_repeat"]) == 2 and s["paired_speedup_ci95"] is not None
    if copus["reached_target"] and result["policies"]["copus-gbs"]["reached_target"]:
        assert len(copus["vs_copus_gbs"]["paired_speedup_per_repeat"]) == 2
    assert len(list((tmp_path / "cmp" / "profiles").glob("profile-*.json"))) == 1  # profiled once

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    parent = result["mlflow_parent_run_id"]
    children = [client.get_run(r["mlflow_run_id"]) for r in result["runs"]]
    assert all(c.data.tags["mlflow.parentRunId"] == parent for c in children)
    assert {c.data.tags["policy"] for c in children} == {"copus", "copus-gbs", "static"}
    assert client.get_run(parent).info.status == "FINISHED"
    assert [a.path for a in client.list_artifacts(parent)] == ["comparison.json"]
    # The outcome is in the names the runs table always shows: time to target and final configuration.
    for child, run in zip(children, result["runs"]):
        assert child.info.run_name.startswith(f"tiny-suite/{run['policy']}/r{run['repeat']} | ")
        assert child.data.tags["final_config"] in child.info.run_name
    _the_mlflow_ui_shows_the_results(tmp_path, result, client.get_run(parent))


def _the_mlflow_ui_shows_the_results(tmp_path, result, parent):
    """The MLflow 3 UI, served on loopback and read in headless Chromium: the experiment opens as
    model training (not the GenAI overview), the comparison's view shows its figures as columns."""
    if browser() is None:
        pytest.skip(NO_BROWSER)
    with mlflow_ui(f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "mlflow-ui.log") as base:
        # A wide window: the grid renders only the columns in view.
        view = ui_runs_url(base, result["mlflow_experiment_id"], result["mlflow_view_key"])
        dom = dump_dom(view, budget_ms=20000, window="4000,1200")
        assert parent.info.run_name in dom and parent.info.run_name.startswith("compare: tiny-suite | ")
        for column in comparison_columns(["copus", "copus-gbs", "static"]):
            assert f'col-id="{column}"' in dom, column
        cells = re.findall(r'cell-metrics\.`time_to_target_s\.static`-\d+" class="ag-cell-value">([^<]*)<', dom)
        if result["policies"]["static"]["reached_target"]:  # the parent's cell (its children's are empty)
            shown = [float(v) for v in cells if v not in ("", "-")]
            assert shown == pytest.approx([result["policies"]["static"]["time_to_target_s"]], rel=1e-2)
        plain = dump_dom(ui_runs_url(base, result["mlflow_experiment_id"], None), budget_ms=20000)
        assert "<title>Runs - Experiment" in plain and "compare: tiny-suite | " in plain  # named by outcome


def test_a_bad_suite_names_the_field(tmp_path, capsys):
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump({"experiment": "nope.yaml"}))
    assert main(["compare", str(tmp_path / "suite.yaml")]) == 2
    assert "experiment: file not found" in capsys.readouterr().err
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump({"experiment": "x.yaml", "policies": ["magic"]}))
    assert main(["compare", str(tmp_path / "suite.yaml")]) == 2
    assert "policies.0" in capsys.readouterr().err
