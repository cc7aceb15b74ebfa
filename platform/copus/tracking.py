"""MLflow logging, done by the driver only (SQLite dislikes concurrent writers).

Uses an explicit `MlflowClient` bound to one tracking URI rather than mlflow's global
"active run", so several runs (and tests) never step on each other.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import urlparse

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

# Which fields of a worker record become which MLflow metrics.
STEP_METRICS = ("train_loss", "samples_per_s", "tokens_per_s", "step_time_s", "forward_backward_time_s",
                "dp_allreduce_time_s", "grad_norm_time_s", "optimizer_time_s", "pipeline_bubble_fraction", "grad_norm",
                "gbs", "mbs", "microbatches", "lr", "samples", "wall_clock_s", "dp", "tp", "pp",
                "gns_sqr", "gns_var", "b_noise", "critical_batch_size", "statistical_efficiency")
EVAL_METRICS = ("val_loss",)
CHECKPOINT_METRICS = ("checkpoint_time_s",)
_BY_KIND = {"step": STEP_METRICS, "eval": EVAL_METRICS, "checkpoint": CHECKPOINT_METRICS}
_MAX_BATCH = 900  # MLflow accepts at most 1000 metrics per log_batch


def flatten(mapping: dict, prefix: str = "") -> dict[str, str]:
    """{'a': {'b': 1}} -> {'a.b': '1'}: the resolved config as MLflow params."""
    out: dict[str, str] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = str(value)
    return out


def artifact_location(tracking_uri: str) -> str | None:
    """Artifacts of a SQLite-backed store sit beside the database file; a server decides its own."""
    parsed = urlparse(tracking_uri)
    if parsed.scheme == "sqlite":
        db_path = Path(tracking_uri[len("sqlite:///"):])
        return (db_path.parent / "mlartifacts").resolve().as_uri()
    return None


def metrics_of(record: dict, timestamp_ms: int | None = None) -> list[Metric]:
    keys = _BY_KIND.get(record.get("kind"), ())
    ts = timestamp_ms if timestamp_ms is not None else int(time.time() * 1000)
    step = int(record.get("step", 0))
    # Non-finite values (an early B_noise of inf, say) are left out: MLflow charts cannot draw them.
    return [Metric(k, float(record[k]), ts, step) for k in keys
            if record.get(k) is not None and math.isfinite(float(record[k]))]


class Tracker:
    def __init__(self, tracking_uri: str, experiment: str):
        self.uri = tracking_uri
        self.client = MlflowClient(tracking_uri=tracking_uri)
        found = self.client.get_experiment_by_name(experiment)
        self.experiment_id = found.experiment_id if found else self.client.create_experiment(
            experiment, artifact_location=artifact_location(tracking_uri))

    def start_run(self, run_name: str, params: dict[str, str], tags: dict[str, str],
                  parent_run_id: str | None = None) -> str:
        all_tags = dict(tags)
        if parent_run_id:
            all_tags["mlflow.parentRunId"] = parent_run_id
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags=all_tags)
        run_id = run.info.run_id
        items = [Param(k, v[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(run_id, params=items[i:i + 100])
        return run_id

    def resume_run(self, run_id: str) -> None:
        self.client.update_run(run_id, status="RUNNING")

    def log_metrics(self, run_id: str, metrics: Iterable[Metric]) -> None:
        batch = list(metrics)
        for i in range(0, len(batch), _MAX_BATCH):
            self.client.log_batch(run_id, metrics=batch[i:i + _MAX_BATCH])

    def log_values(self, run_id: str, values: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        self.log_metrics(run_id, [Metric(k, float(v), now, step) for k, v in values.items()])

    def log_records(self, run_id: str, records: Iterable[dict]) -> None:
        self.log_metrics(run_id, [m for r in records for m in metrics_of(r)])

    def set_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_dict(self, run_id: str, data: dict, artifact_file: str) -> None:
        self.client.log_dict(run_id, data, artifact_file)

    def finish(self, run_id: str, status: str = "FINISHED") -> None:
        self.client.set_terminated(run_id, status=status)
