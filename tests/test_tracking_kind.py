"""MLflow: experiments open in model-training mode; a run is named by what sets it apart and,
once finished, by its outcome; a shared view shows the results as columns."""

from __future__ import annotations

import json

from mlflow.tracking import MlflowClient

from copus.cluster.compare import comparison_columns, final_configs, side_lines, speedup_metrics, speedup_phrase
from copus.cluster.driver_run import run_label
from copus.config import config_from_mapping
from copus.core.layout import CandidateConfig
from copus.tracking import (
    EXPERIMENT_KIND_TAG,
    MODEL_TRAINING_KIND,
    RESULTS_COLUMNS,
    RESULTS_VIEW_KEY,
    SHARED_VIEW_PREFIX,
    Tracker,
    results_name,
    ui_runs_url,
    view_state,
)


def test_experiments_are_tagged_as_model_training(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri, "kind-test")
    tags = MlflowClient(tracking_uri=uri).get_experiment(tracker.experiment_id).tags
    assert tags[EXPERIMENT_KIND_TAG] == MODEL_TRAINING_KIND
    assert Tracker(uri, "kind-test").experiment_id == tracker.experiment_id  # found again, tag kept


def test_a_run_is_named_by_policy_gbs_and_layout(base_mapping):
    cfg = config_from_mapping(base_mapping, ["policy.name=static"])
    assert run_label(cfg, CandidateConfig(2, 1, 1, 2, 8)) == "test static gbs8 dp2-tp1-pp1 mbs2"


def test_a_results_view_is_shared_and_finished_runs_are_named_by_their_outcome(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri, "view-test")
    tags = MlflowClient(tracking_uri=uri).get_experiment(tracker.experiment_id).tags
    assert json.loads(tags[SHARED_VIEW_PREFIX + RESULTS_VIEW_KEY]) == view_state(RESULTS_COLUMNS)
    assert "metrics.`time_to_target_s`" in RESULTS_COLUMNS and "tags.`final_config`" in RESULTS_COLUMNS
    assert (
        ui_runs_url("http://127.0.0.1:5000/", "7", "k")
        == "http://127.0.0.1:5000/#/experiments/7/runs?workflowType=machine_learning&viewStateShareKey=k"
    )
    name = results_name("s/copus/r0", 95.4, "dp4-tp1-pp1 mbs4 gbs64")
    assert name == "s/copus/r0 | 95 s to target | ended dp4-tp1-pp1 mbs4 gbs64"
    assert (
        results_name(name, None, "dp2-tp1-pp2 mbs16 gbs256")
        == "s/copus/r0 | target missed | ended dp2-tp1-pp2 mbs16 gbs256"
    )


def test_a_comparison_parent_carries_its_figures_per_policy():
    runs = [
        {"policy": p, "final_layout": CandidateConfig(*shape).__dict__}
        for p, shape in (
            ("copus", (2, 1, 2, 16, 64)),
            ("copus", (2, 1, 2, 16, 64)),
            ("copus", (4, 1, 1, 8, 32)),
            ("static", (2, 1, 2, 4, 16)),
        )
    ]
    assert final_configs(runs) == {
        "final_config.copus": "dp2-tp1-pp2 mbs16 gbs64 (2/3)",
        "final_config.static": "dp2-tp1-pp2 mbs4 gbs16 (1/1)",
    }
    policies = {
        "copus": {
            "speedup_vs_fastest_baseline": 0.12,
            "fastest_baseline": "static",
            "paired_speedup_mean": 0.1,
            "paired_speedup_ci95": [0.02, 0.18],
            "vs_copus_gbs": {"paired_speedup_mean": 0.04},
            "vs_best_baseline": {"speedup": 0.11, "samples_ratio": 0.8, "speed_ratio": 1.39},
        },
        "copus-gbs": {"speedup_vs_fastest_baseline": 0.07, "paired_speedup_mean": 0.06},
        "static": {},
    }
    assert speedup_metrics(policies) == {
        "speedup_vs_fastest_baseline": 0.12,
        "paired_speedup_mean": 0.1,
        "speedup_vs_best_baseline": 0.11,
        "samples_ratio_vs_best_baseline": 0.8,  # goodput's two sides of it
        "speed_ratio_vs_best_baseline": 1.39,
        "speedup_vs_fastest_baseline.copus-gbs": 0.07,
        "paired_speedup_mean.copus-gbs": 0.06,
        "paired_speedup_vs_copus_gbs": 0.04,
    }
    assert speedup_phrase(policies) == "copus +12.0% vs static (paired 95% CI +2%..+18%)"
    assert speedup_phrase({"copus": {"speedup_vs_fastest_baseline": None}}) == "no speedup (a target missed)"
    columns = comparison_columns(["copus", "copus-gbs", "static"])
    assert columns[:2] == ["metrics.`speedup_vs_fastest_baseline`", "metrics.`paired_speedup_mean`"]
    assert "metrics.`time_to_target_s.static`" in columns and "tags.`final_config.copus-gbs`" in columns


def _finished_run(policy: str, repeat: int, seed: int, t: float, suite_dir: str) -> dict:
    """A comparison.json run entry that reached the target in t seconds."""
    return {
        "policy": policy,
        "repeat": repeat,
        "seed": seed,
        "time_to_target_s": t,
        "reached_target": True,
        "final_val_loss": 2.2,
        "samples": 500,
        "reconfigurations": 0,
        "wall_clock_s": t,
        "output_dir": f"{suite_dir}/{policy}/r{repeat}",
    }


def test_the_printed_table_names_the_tuned_baselines_and_copus_against_the_best():
    from copus.cluster.compare import comparison_table
    from copus.core.comparison import summarize

    times = {"copus": [80.0, 90.0], "static": [100.0, 120.0], "tuned-static": [88.0, 95.0]}
    runs = [_finished_run(policy, r, 1000 + r, t, "runs/s") for policy, ts in times.items() for r, t in enumerate(ts)]
    candidate = {"entry": "tuned-static", "geomean_time_to_target_s": 70.0}
    tuning = {
        "seeds": [100],
        "chosen": {"tuned-static": "static-gbs32"},
        "candidates": [{**candidate, "name": "static-gbs32"}, {**candidate, "name": "static-gbs8"}],
    }
    result = {"policies": summarize(runs, list(times)), "runs": runs, "tuning": tuning}
    table = comparison_table(result).splitlines()
    assert any(line.startswith("tuned-static ") for line in table)
    best = next(line for line in table if line.startswith("copus vs best baseline (tuned-static), paired log-ratio: "))
    assert "95% CI" in best and "2 pairs" in best
    assert any(line.startswith("  copus vs static: ") for line in table)
    assert (
        "  static-gbs32         70.0 s  -> tuned-static" in table and table[-1] == "comparison: runs/s/comparison.json"
    )


def test_a_one_seed_comparison_says_it_has_no_interval():
    """`make run` compares one seed: its line must read as a reading, not as a measurement."""
    from copus.cluster.compare import comparison_table
    from copus.core.comparison import summarize

    runs = [_finished_run(policy, 0, 3000, t, "runs/q") for policy, t in {"copus": 43.0, "static": 68.6}.items()]
    table = comparison_table({"policies": summarize(runs, ["copus", "static"]), "runs": runs}).splitlines()
    best = next(line for line in table if line.startswith("copus vs best baseline (static), paired log-ratio: "))
    assert "1 pairs" in best and "no interval: fewer than 2 pairs" in best and "95% CI" not in best


def test_the_printed_sides_line_uses_the_reports_words():
    block = {"samples_ratio": 0.79, "samples_ratio_ci95": [0.71, 0.87], "speed_ratio": 1.48}
    assert side_lines(block) == []  # no interval on a side: no line
    block |= {"speed_ratio_ci95": [1.31, 1.66], "n_sides": 8}
    (line,) = side_lines(block)
    assert "statistical side x0.79 (0.71 .. 0.87), throughput side x1.48 (1.31 .. 1.66), 95% CIs over 8 pairs" in line
