"""`copus compare` on Ray: every policy and repeat runs, as child runs of one MLflow parent,
sharing one profile; comparison.json has what the README promises."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from copus.cli import main
from copus.cluster.compare import comparison_columns
from copus.tracking import ui_runs_url
from tests.browser import dump_dom, mlflow_ui, require_browser

pytestmark = pytest.mark.slow

# copus-gbs and static are left out for time: the tuned static (static at its tuned GBS) is the
# baseline here; copus-gbs's rule (GBS only, in the current layout and MBS) is tested in
# tests/core/test_planner.py, and vs_copus_gbs in tests/core/test_comparison.py.
POLICIES = ["copus"]


def test_compare_runs_policies_under_one_parent(base_mapping, tmp_path, capsys, monkeypatch):
    experiment = {
        **base_mapping,
        "search": {"gbs_min": 8, "gbs_max": 16, "mbs": [2], "layouts": [[2, 1, 1], [1, 1, 2]]},
        "profile": {"budget_s": 60, "warmup_steps": 1, "steps": 2, "gbs_per_shape": 2, "folds": 3},
        "policy": {"interval_s": 2.0},
        # Every run stops at the target; max_steps is room to reach it (a run that misses fails the test).
        "stop": {"target_val_loss": 4.2, "max_steps": 100},
        "eval": {"every_steps": 5, "val_samples": 8},
        "checkpoint": {"every_steps": 1000},
    }
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(experiment))
    suite = {
        "name": "tiny-suite",
        "experiment": "exp.yaml",
        "policies": POLICIES,
        # Tuned static (GBS 8 or 16, chosen on seed 100) joins the policies on evaluation seeds 0, 1.
        "tuning_seeds": [100],
        "evaluation_seeds": [0, 1],
        "tune": {"static_gbs": [8, 16]},
        "output_dir": str(tmp_path / "cmp"),
    }
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite))
    started = _watch_the_choice_before_each_run(monkeypatch, tmp_path / "cmp" / "comparison.json")

    assert main(["compare", str(tmp_path / "suite.yaml"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    saved = json.loads((tmp_path / "cmp" / "comparison.json").read_text())
    assert saved["policies"] == result["policies"]
    assert saved["mlflow_view_key"] == result["mlflow_view_key"] == f"compare-{result['mlflow_parent_run_id']}"
    entries = _the_tuned_baseline_was_chosen_first(result, started)
    # Each repeat ran every entry once, in the recorded (shuffled) order, on the repeat's seed.
    orders = result["run_order"]["repeats"]
    assert result["run_order"]["order"] == "shuffled" and [sorted(o) for o in orders] == [sorted(entries)] * 2
    assert [(r["policy"], r["repeat"], r["seed"], r["position"]) for r in result["runs"]] == [
        (policy, repeat, repeat, position) for repeat in (0, 1) for position, policy in enumerate(orders[repeat])
    ]
    for policy in POLICIES:
        stats = result["policies"][policy]
        assert stats["runs"] == 2 and {
            "time_to_target_s",
            "reached_target",
            "final_val_loss",
            "samples",
            "reconfigurations",
        } <= set(stats)
    copus = result["policies"]["copus"]
    stats = result["policies"]
    assert {e: stats[e]["reached"] for e in entries} == {e: 2 for e in entries}  # every run reached the target
    fastest = min((b for b in entries if b != "copus"), key=lambda b: stats[b]["time_to_target_s"])  # the tuned static
    expected = stats[fastest]["time_to_target_s"] / copus["time_to_target_s"] - 1
    assert copus["speedup_vs_fastest_baseline"] == pytest.approx(expected) and copus["fastest_baseline"] == fastest
    assert len(copus["paired_speedup_per_repeat"]) == 2 and copus["paired_speedup_ci95"] is not None
    assert copus["paired_speedup_excluded"] == 0
    assert len(list((tmp_path / "cmp" / "profiles").glob("profile-*.json"))) == 1  # profiled once

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    parent = result["mlflow_parent_run_id"]
    children = [client.get_run(r["mlflow_run_id"]) for r in result["runs"]]
    assert all(c.data.tags["mlflow.parentRunId"] == parent for c in children)
    assert {c.data.tags["policy"] for c in children} == set(entries)
    tuning_runs = [client.get_run(r["mlflow_run_id"]) for r in result["tuning"]["runs"]]
    assert all(c.data.tags["copus.phase"] == "tuning" for c in tuning_runs)
    assert client.get_run(parent).info.status == "FINISHED"
    assert [a.path for a in client.list_artifacts(parent)] == ["comparison.json"]
    # The outcome is in the names the runs table always shows: time to target and final configuration.
    for child, run in zip(children, result["runs"]):
        assert child.info.run_name.startswith(f"tiny-suite/{run['policy']}/r{run['repeat']} | ")
        assert child.data.tags["final_config"] in child.info.run_name
    _the_mlflow_ui_shows_the_results(tmp_path, result, client.get_run(parent), entries)
    _a_finished_suite_resumes_without_a_run(tmp_path, capsys, started, result)


def _a_finished_suite_resumes_without_a_run(tmp_path, capsys, started, result):
    """`--resume` of the finished suite keeps its tuning choice and every repeat and runs nothing
    (which runs a suite cut short makes again: tests/test_compare_resume.py); the same suite
    changed is refused in one line."""
    started.clear()
    assert main(["compare", str(tmp_path / "suite.yaml"), "--resume", "--json"]) == 0
    resumed = json.loads(capsys.readouterr().out)
    assert started == []
    assert resumed["tuning"] == result["tuning"] and resumed["runs"] == result["runs"]
    assert resumed["suite_fingerprint"] == result["suite_fingerprint"]
    suite = yaml.safe_load((tmp_path / "suite.yaml").read_text())
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump({**suite, "evaluation_seeds": [0, 1, 2]}))
    assert main(["compare", str(tmp_path / "suite.yaml"), "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "written by another suite definition" in err


def _watch_the_choice_before_each_run(monkeypatch, comparison: Path) -> list[tuple[str, dict | None]]:
    """Each run's MLflow name and the tuning block comparison.json held when the run started."""
    import copus.cluster.compare as compare

    started: list[tuple[str, dict | None]] = []

    def watched(cfg, **kwargs):
        tuning = json.loads(comparison.read_text()).get("tuning") if comparison.exists() else None
        started.append((cfg.tracking.run_name, tuning))
        return run_experiment(cfg, **kwargs)

    run_experiment = compare.run_experiment
    monkeypatch.setattr(compare, "run_experiment", watched)
    return started


def _the_tuned_baseline_was_chosen_first(result: dict, started: list) -> list[str]:
    """The tuning block: both candidates on the tuning seed, the choice written to comparison.json
    before the first evaluation run started; the per-seed and paired log-ratio fields. Returns the
    suite's entries."""
    tuning = result["tuning"]
    assert tuning["seeds"] == [100] and [c["name"] for c in tuning["candidates"]] == ["static-gbs8", "static-gbs16"]
    assert [(r["candidate"], r["seed"]) for r in tuning["runs"]] == [(n, 100) for n in tuning["run_order"][0]]
    chosen = tuning["chosen"]["tuned-static"]
    assert chosen in ("static-gbs8", "static-gbs16")  # both reach the target on the tuning seed
    entries = POLICIES + ["tuned-static"]
    names = [name for name, _ in started]
    assert [n.split("/")[1] for n in names[:2]] == ["tuning", "tuning"] and len(names) == 2 + 2 * len(entries)
    assert all(seen is not None and seen["chosen"] == tuning["chosen"] for _, seen in started[2:])  # pre-registered
    assert all(r["started_at"] > tuning["chosen_at"] for r in result["runs"])
    settings = next(c["settings"] for c in tuning["candidates"] if c["name"] == chosen)
    tuned = [r for r in result["runs"] if r["policy"] == "tuned-static"]
    assert [r["initial_layout"]["gbs"] for r in tuned] == [settings["gbs"]] * 2
    stats = result["policies"]
    assert [row["seed"] for row in stats["tuned-static"]["per_seed"]] == [0, 1]
    assert set(stats["copus"]["paired_log_ratio"]) == {e for e in entries if e not in ("copus", "copus-gbs")}
    best = result["best_baseline"]
    assert (stats["copus"]["vs_best_baseline"] or {}).get("baseline") == best
    return entries


def _the_mlflow_ui_shows_the_results(tmp_path, result, parent, entries):
    """The MLflow 3 UI, served on loopback and read in headless Chromium: the experiment opens as
    model training (not the GenAI overview), the comparison's view shows its figures as columns."""
    require_browser()
    with mlflow_ui(f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "mlflow-ui.log") as base:
        # A wide window: the grid renders only the columns in view.
        view = ui_runs_url(base, result["mlflow_experiment_id"], result["mlflow_view_key"])
        dom = dump_dom(view, budget_ms=20000, window="4000,1200")
        assert parent.info.run_name in dom and parent.info.run_name.startswith("compare: tiny-suite | ")
        for column in comparison_columns(entries):
            assert f'col-id="{column}"' in dom, column
        cells = re.findall(r'cell-metrics\.`time_to_target_s\.tuned-static`-\d+" class="ag-cell-value">([^<]*)<', dom)
        shown = [float(v) for v in cells if v not in ("", "-")]  # the parent's cell (its children's are empty)
        assert shown == pytest.approx([result["policies"]["tuned-static"]["time_to_target_s"]], rel=1e-2)
        plain = dump_dom(ui_runs_url(base, result["mlflow_experiment_id"], None), budget_ms=20000)
        assert "<title>Runs - Experiment" in plain and "compare: tiny-suite | " in plain  # named by outcome


def test_a_bad_suite_names_the_field(tmp_path, capsys):
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump({"experiment": "nope.yaml"}))
    assert main(["compare", str(tmp_path / "suite.yaml")]) == 2
    assert "experiment: file not found" in capsys.readouterr().err
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump({"experiment": "x.yaml", "policies": ["magic"]}))
    assert main(["compare", str(tmp_path / "suite.yaml")]) == 2
    assert "policies.0" in capsys.readouterr().err


def test_the_runs_of_a_suite_with_a_ramp_drop_the_schedule_except_the_ramp_run(base_mapping, tmp_path):
    """What `copus compare` builds for each policy of a suite whose experiment carries batch.ramp:
    the ramp run keeps it, every other policy's run has batch.ramp=null (else its config is refused)."""
    from copus.cluster.compare import _policy_config
    from copus.config import load_suite
    from copus.storage import Location

    experiment = {**base_mapping, "policy": {"name": "ramp"}, "batch": {"gbs": 16, "mbs": 2}}
    experiment["batch"]["ramp"] = {"start_gbs": 4, "increment": 4, "samples": 96}
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({"experiment": experiment, "policies": ["ramp", "static", "copus"]}))
    loaded, raw = load_suite(suite)
    run_dir = Location.parse(str(tmp_path / "out"))
    for policy in ("ramp", "static", "copus"):
        cfg = _policy_config(loaded, raw, [], policy, 0, 0, run_dir, str(tmp_path / "profiles"))
        assert (cfg.batch.ramp is not None) == (policy == "ramp"), policy
