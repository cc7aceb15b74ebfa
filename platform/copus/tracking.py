"""MLflow logging, done by the driver only (SQLite dislikes concurrent writers).

Uses an explicit `MlflowClient` bound to one tracking URI rather than mlflow's global
"active run", so several runs (and tests) never step on each other.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import urlparse

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from copus.records import Record, parse_record

# Which fields of a worker record become which MLflow metrics.
STEP_METRICS = (
    "train_loss",
    "samples_per_s",
    "tokens_per_s",
    "step_time_s",
    "forward_backward_time_s",
    "dp_allreduce_time_s",
    "grad_norm_time_s",
    "optimizer_time_s",
    "pipeline_bubble_fraction",
    "grad_norm",
    "gbs",
    "mbs",
    "microbatches",
    "lr",
    "samples",
    "wall_clock_s",
    "dp",
    "tp",
    "pp",
    "gns_sqr",
    "gns_var",
    "b_noise",
    "critical_batch_size",
    "statistical_efficiency",
)
EVAL_METRICS = ("val_loss",)
CHECKPOINT_METRICS = ("checkpoint_time_s",)
_BY_KIND = {
    "step": STEP_METRICS,
    "eval": EVAL_METRICS,
    "checkpoint": CHECKPOINT_METRICS,
    "nonfinite": ("nonfinite_steps",),
    "probe": ("probe_gain", "probe_c_observed", "belief_c", "belief_log_c_sd"),
}
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
        db_path = Path(tracking_uri[len("sqlite:///") :])
        return (db_path.parent / "mlartifacts").resolve().as_uri()
    return None


def metrics_of(record: Record, timestamp_ms: int | None = None) -> list[Metric]:
    keys = _BY_KIND.get(record.kind, ())
    if not keys:
        return []
    ts = timestamp_ms if timestamp_ms is not None else int(time.time() * 1000)
    values = {k: getattr(record, k) for k in keys}
    # Non-finite values (an early B_noise of inf, say) are left out: MLflow charts cannot draw them.
    return [
        Metric(k, float(v), ts, int(record.step))
        for k, v in values.items()
        if v is not None and math.isfinite(float(v))
    ]


EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING_KIND = "custom_model_development"
# The MLflow UI's shared view states are experiment tags under this prefix; a URL with
# ?viewStateShareKey=KEY opens the runs table in that state (columns, order).
SHARED_VIEW_PREFIX = "mlflow.sharedViewState."
RESULTS_VIEW_KEY = "copus-results"
# What a results view shows beside the run names: time to target, speedup, where the run ended.
RESULTS_COLUMNS = (
    "metrics.`time_to_target_s`",
    "metrics.`speedup_vs_fastest_baseline`",
    "metrics.`paired_speedup_mean`",
    "metrics.`final_val_loss`",
    "tags.`final_config`",
    "metrics.`reconfigurations`",
    "attributes.`Duration`",
)


def view_state(columns: Iterable[str]) -> dict:
    """A runs-table state the MLflow UI reads from a shared view: these columns, oldest run first."""
    return {"selectedColumns": list(columns), "orderByKey": "attributes.start_time", "orderByAsc": True}


def ui_runs_url(base: str, experiment_id: str, view_key: str | None = RESULTS_VIEW_KEY) -> str:
    """The MLflow UI's runs table of an experiment (at `base`, e.g. http://127.0.0.1:5000), in
    a shared view. The MLflow 3 UI picks GenAI or model-training pages from a browser-wide
    switch (default GenAI), not from the experiment's kind tag: the URL sets it."""
    query = "?workflowType=machine_learning" + (f"&viewStateShareKey={view_key}" if view_key else "")
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs{query}"


def results_name(name: str, time_to_target_s: float | None, final_config: str) -> str:
    """A finished run's name: the name it started with, its time to target and where it ended,
    so the runs table shows the outcome without any column configured."""
    base = name.split(" | ")[0]
    outcome = "target missed" if time_to_target_s is None else f"{time_to_target_s:.0f} s to target"
    return f"{base} | {outcome} | ended {final_config}"


class Tracker:
    """One experiment's MLflow client. Metrics of a run in progress never stop training: when a
    write fails (server down, SQLite database locked), they are kept in memory, a warning says
    so once per outage, and they are written, in order, with the next write that succeeds;
    `finish` retries before giving up and saying how many were lost."""

    def __init__(self, tracking_uri: str, experiment: str, warn=None, retry_s: float = 30.0):
        self.uri = tracking_uri
        self.retry_s = retry_s  # after a failed write, buffer without trying for this long
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.warn = warn or (lambda line: None)
        self._pending: dict[str, list[Metric]] = {}
        self._outage, self._retry_at = False, 0.0
        found = self.client.get_experiment_by_name(experiment)
        self.experiment_id = (
            found.experiment_id
            if found
            else self.client.create_experiment(experiment, artifact_location=artifact_location(tracking_uri))
        )
        if found is None or EXPERIMENT_KIND_TAG not in found.tags:
            # The MLflow 3 UI opens an untagged experiment on its GenAI overview; these are training runs.
            self.client.set_experiment_tag(self.experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND)
        if found is None or SHARED_VIEW_PREFIX + RESULTS_VIEW_KEY not in found.tags:
            self.share_view(RESULTS_VIEW_KEY, RESULTS_COLUMNS)

    def start_run(
        self, run_name: str, params: dict[str, str], tags: dict[str, str], parent_run_id: str | None = None
    ) -> str:
        all_tags = dict(tags)
        if parent_run_id:
            all_tags["mlflow.parentRunId"] = parent_run_id
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags=all_tags)
        run_id = run.info.run_id
        items = [Param(k, v[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(run_id, params=items[i : i + 100])
        return run_id

    def resume_run(self, run_id: str) -> None:
        self.client.update_run(run_id, status="RUNNING")

    @property
    def pending(self) -> int:
        return sum(len(v) for v in self._pending.values())

    def flush(self, run_id: str) -> bool:
        """Write the run's buffered metrics; False (and they stay buffered) when MLflow fails.
        A failed write can take a while (MLflow's SQLite store waits 20 s on a locked
        database), so after one the next attempt waits `retry_s` (the driver keeps draining)."""
        batch = self._pending.get(run_id, [])
        try:
            while batch:
                self.client.log_batch(run_id, metrics=batch[:_MAX_BATCH])
                del batch[:_MAX_BATCH]
        except Exception as err:  # any client, store or network error: training goes on
            if not self._outage:
                self.warn(
                    f"warning: MLflow at {self.uri} is unreachable ({type(err).__name__}: "
                    f"{str(err).splitlines()[0][:200] if str(err) else ''}); training goes on, "
                    f"metrics are kept and written when it is back"
                )
            self._outage, self._retry_at = True, time.time() + self.retry_s
            return False
        self._retry_at = 0.0
        if self._outage:
            self.warn(f"MLflow at {self.uri} is back: buffered metrics written")
        self._outage = False
        return True

    def log_metrics(self, run_id: str, metrics: Iterable[Metric]) -> None:
        self._pending.setdefault(run_id, []).extend(metrics)
        if time.time() >= self._retry_at:
            self.flush(run_id)

    def log_values(self, run_id: str, values: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        self.log_metrics(run_id, [Metric(k, float(v), now, step) for k, v in values.items()])

    def log_records(self, run_id: str, records: Iterable[dict]) -> None:
        """The metrics of workers' records (as they arrive: dicts)."""
        self.log_metrics(run_id, [m for r in records for m in metrics_of(parse_record(r))])

    def _tolerant(self, what: str, write) -> None:
        try:
            write()
        except Exception as err:  # the run's figures are in summary.json and records.jsonl too
            self.warn(f"warning: could not write {what} to MLflow at {self.uri} ({type(err).__name__})")

    def set_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        self._tolerant("tags", lambda: self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()]))

    def share_view(self, key: str, columns: Iterable[str]) -> None:
        """Store a shared view of the experiment's runs table (open it with `ui_runs_url`)."""
        self._tolerant(
            "a shared view",
            lambda: self.client.set_experiment_tag(
                self.experiment_id, SHARED_VIEW_PREFIX + key, json.dumps(view_state(columns))
            ),
        )

    def rename(self, run_id: str, name: str) -> None:
        self._tolerant("the run name", lambda: self.client.update_run(run_id, name=name))

    def run_name(self, run_id: str) -> str:
        return self.client.get_run(run_id).info.run_name

    def log_dict(self, run_id: str, data: dict, artifact_file: str) -> None:
        self._tolerant(artifact_file, lambda: self.client.log_dict(run_id, data, artifact_file))

    def finish(self, run_id: str, status: str = "FINISHED", retries: int = 5, wait_s: float = 2.0) -> None:
        for _ in range(retries):
            if self.flush(run_id):
                break
            time.sleep(wait_s)
        else:
            self.warn(
                f"warning: {self.pending} metrics could not be written to MLflow at {self.uri}; "
                f"summary.json and records.jsonl in the output directory have the run's figures"
            )
            return
        self.client.set_terminated(run_id, status=status)
