"""`copus profile` for real on Ray Train: measures the search space, skips what the memory
model rules out, records a configuration whose workers fail and carries on, fits the model,
stores the table (file and MLflow artifact) and reuses it on the next call."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from copus.cli import main
from copus.cluster.profiler import FAULT_ENV, memory_estimate, run_profile, search_space
from copus.config import config_from_mapping
from copus.core.memory import GIB
from copus.core.search import profile_points

pytestmark = pytest.mark.slow


def _profile_mapping(base_mapping: dict) -> dict:
    mapping = dict(base_mapping)
    mapping["search"] = {"gbs_min": 8, "gbs_max": 16, "mbs": [2]}
    mapping["profile"] = {"budget_s": 240, "warmup_steps": 1, "steps": 3, "gbs_per_shape": 2, "folds": 4}
    return mapping


def test_profile_skips_infeasible_survives_a_failure_and_is_reused(base_mapping, tmp_path, monkeypatch, capsys):
    mapping = _profile_mapping(base_mapping)
    cfg = config_from_mapping(mapping)
    cpu = {"kind": "cpu"}
    space = search_space(cfg)
    # A memory limit between the two largest memory needs of the search space: the largest
    # configurations must be skipped by the memory model, the rest measured.
    needs = sorted({memory_estimate(cfg, c, cpu).total for c in space})
    limit_gb = (needs[-1] + needs[-2]) / 2 / (1 - cfg.cluster.memory_margin) / GIB
    too_big = {c.label() for c in space if memory_estimate(cfg, c, cpu).total > needs[-2]}
    assert too_big and len({(c.dp, c.tp, c.pp) for c in space if c.label() not in too_big}) >= 2
    cfg = config_from_mapping(mapping, [f"cluster.memory_per_worker_gb={limit_gb}"])
    fits = [c for c in space if c.label() not in too_big]
    doomed = profile_points(fits, 2)[1]  # its workers fail mid-measurement: recorded, then the next group goes on
    monkeypatch.setenv(FAULT_ENV, doomed.label())

    messages: list[str] = []
    result = run_profile(cfg, echo=messages.append)

    reasons = {(r["dp"], r["tp"], r["pp"], r["mbs"], r["gbs"]): r for r in result["infeasible"]}
    for c in space:
        if c.label() in too_big:
            assert reasons[(c.dp, c.tp, c.pp, c.mbs, c.gbs)]["reason"].startswith("memory model"), c
    failed = reasons[(doomed.dp, doomed.tp, doomed.pp, doomed.mbs, doomed.gbs)]
    assert "InjectedFault" in failed["reason"] and failed["source"] == "measured"
    assert result["worker_groups"] >= 2
    # The failed configuration's shape gets another GBS instead: the plan is made from what runs.
    wanted = profile_points([c for c in fits if c != doomed], 2)
    assert result["points"] == len(wanted) and not result["not_measured_budget"]
    assert math.isfinite(result["mape"]) and result["max_ape"] >= result["mape"] >= 0

    table = json.loads(Path(result["table"]).read_text())
    assert table["schema_version"] == 1 and table["key"]["world_size"] == 2
    assert table["key"]["workload"]["model"] == "debug" and table["model"]["error"]["mape"] == result["mape"]
    ok_rows = [r for r in table["rows"] if r["status"] == "ok"]
    assert all(r["step_time_s"] > 0 and len(r["step_times"]) >= 3 for r in ok_rows)
    # Between layouts the state moved in place, as a run's layout change moves it, and was timed.
    assert table["reshards"] == result["reshards"] and len(table["reshards"]) >= 1
    assert all(r["seconds"] > 0 and r["bytes_moved"] >= 0 for r in table["reshards"])  # from dp2 all is local
    assert all(
        (r["from"]["dp"], r["from"]["tp"], r["from"]["pp"]) != (r["to"]["dp"], r["to"]["tp"], r["to"]["pp"])
        for r in table["reshards"]
    )
    assert result["in_place_reshard_s"] == statistics.median(r["seconds"] for r in table["reshards"])
    assert any(m.startswith("  in place dp") for m in messages)
    client = MlflowClient(tracking_uri=cfg.resolved_tracking_uri())
    artifacts = [a.path for a in client.list_artifacts(result["mlflow_run_id"], "profile")]
    assert artifacts == [f"profile/{Path(result['table']).name}"]
    assert client.get_run(result["mlflow_run_id"]).data.metrics["mape"] == pytest.approx(result["mape"])

    # The same key again, through the CLI: nothing new to measure, one JSON object out.
    monkeypatch.delenv(FAULT_ENV)
    capsys.readouterr()
    yaml_path = tmp_path / "exp.yaml"
    yaml_path.write_text(json.dumps(mapping))
    assert main(["profile", str(yaml_path), "--json", "--set", f"cluster.memory_per_worker_gb={limit_gb}"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["table"] == result["table"] and again["points"] == result["points"]
    assert again["measured_now"] <= len(result["remeasured"]) + len(again["remeasured"])
    assert {"points", "infeasible", "mape", "max_ape", "table"} <= set(again)
