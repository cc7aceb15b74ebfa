"""What a report shows, read back from MLflow: one `RunSeries` per training run (a policy of a
comparison, or a single run), each metric as (step, value) series, wall-clock per step; and the
calibrations (`copus calibrate`, calibration-<id>.json) of a profile directory, read as they are."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from mlflow.tracking import MlflowClient

from copus.storage import Location

SERIES = (
    "val_loss",
    "train_loss",
    "gbs",
    "mbs",
    "dp",
    "tp",
    "pp",
    "samples_per_s",
    "statistical_efficiency",
    "b_noise",
    "wall_clock_s",
    "reconfiguration_downtime_s",
)


class ReportError(ValueError):
    pass


@dataclass
class RunSeries:
    name: str
    policy: str
    run_id: str
    metrics: dict[str, dict[int, float]] = field(default_factory=dict)
    summary: dict = field(default_factory=dict)

    def series(self, key: str) -> tuple[list[float], list[float]]:
        """(wall-clock seconds, values) of a metric, in step order."""
        wall = self.metrics.get("wall_clock_s", {})
        points = sorted((s, v) for s, v in self.metrics.get(key, {}).items() if s in wall or key == "val_loss")
        xs, ys = [], []
        for step, value in points:
            t = wall.get(step)
            if t is None:  # validation at step 0 or between reported steps: nearest earlier time
                earlier = [w for s, w in wall.items() if s <= step]
                t = max(earlier) if earlier else 0.0
            xs.append(t)
            ys.append(value)
        return xs, ys


def audited_changes(run: RunSeries) -> list[dict]:
    """The run's changes of GBS that summary.json audits (`copus.core.audit`): each carries
    `predicted_efficiency_gain` (the controller's SE(new)/SE(old)) and `realized_efficiency_gain`
    (progress per sample after/before at matched loss), either possibly None."""
    return [
        r
        for r in run.summary.get("reconfigurations") or []
        if "realized_efficiency_gain" in r and (r.get("from") or {}).get("gbs") != (r.get("to") or {}).get("gbs")
    ]


@dataclass
class ReportData:
    title: str
    runs: list[RunSeries]
    comparison: dict | None
    target: float | None
    calibrations: list[dict] = field(default_factory=list)  # calibration files, as `load_calibration` reads them
    profiles: list[dict] = field(default_factory=list)  # profile tables of the output directory's profiles/


def _load_run(client: MlflowClient, run_id: str) -> RunSeries:
    run = client.get_run(run_id)
    metrics = {k: {m.step: m.value for m in client.get_metric_history(run_id, k)} for k in SERIES}
    summary = {}
    try:
        path = client.download_artifacts(run_id, "summary.json")
        summary = json.loads(Path(path).read_text())
    except Exception:  # a run that did not finish has no summary: plot what it logged
        pass
    return RunSeries(run.info.run_name or run_id, run.data.tags.get("policy", "?"), run_id, metrics, summary)


def load_calibration(path: Path | Location) -> dict:
    """A calibration file of `copus calibrate` (its dict, with `path` added); ReportError with
    one line when the file is not one. Values not measured are null (None) in it."""
    try:
        data = Location.parse(path).read_json()
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ReportError(f"{path}: not a readable calibration file ({type(err).__name__})") from None
    if (
        not isinstance(data, dict)
        or (data.get("key") or {}).get("kind") != "calibration"
        or not isinstance(data.get("branch_points"), list)
    ):
        raise ReportError(f"{path}: not a calibration file (no key.kind 'calibration' and branch_points)")
    return {**data, "path": str(path)}


def _profile_files(directory: Location, prefix: str) -> list[Location]:
    return [f for f in (directory / "profiles").iterdir() if f.name.startswith(prefix) and f.name.endswith(".json")]


def calibrations_in(directory: Location) -> list[dict]:
    """The calibrations in an output directory's profiles/ folder (none: an empty list). A file
    there that is not a calibration is passed over: it does not stop the run's report."""
    found = []
    for path in _profile_files(directory, "calibration-"):
        try:
            found.append(load_calibration(path))
        except ReportError:
            continue
    return found


def profiles_in(directory: Location) -> list[dict]:
    """The profile tables (`copus profile`) in an output directory's profiles/ folder; a file
    there that is not one is passed over."""
    found = []
    for path in _profile_files(directory, "profile-"):
        try:
            table = path.read_json()
        except (OSError, ValueError):
            continue
        if isinstance(table, dict) and isinstance(table.get("rows"), list):
            found.append(table)
    return found


def output_location(source: str) -> Location | None:
    """`source` as a location when it names one (a URI, or a path that exists), else None: an
    MLflow run id."""
    return Location.parse(source) if "://" in source or Path(source).exists() else None


def load(source: str, tracking_uri: str | None) -> ReportData:
    """`source`: an output directory (of `copus compare` or `copus run`; a path or an object-store
    URI) or an MLflow run id (a comparison's parent run, or a single run)."""
    path = output_location(source)
    comparison = None
    on_disk = path is not None and path.is_dir()
    if on_disk:
        if (path / "comparison.json").is_file():
            comparison = (path / "comparison.json").read_json()
            tracking_uri, run_id = comparison["mlflow_tracking_uri"], comparison["mlflow_parent_run_id"]
        elif (path / "summary.json").is_file():
            summary = (path / "summary.json").read_json()
            tracking_uri, run_id = summary["mlflow_tracking_uri"], summary["mlflow_run_id"]
        else:
            raise ReportError(f"{path}: no comparison.json or summary.json (not a copus output directory)")
    else:
        run_id = source
        tracking_uri = tracking_uri or f"sqlite:///{Path.cwd() / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        parent = client.get_run(run_id)
    except Exception as err:
        raise ReportError(f"{source}: no MLflow run {run_id} at {tracking_uri} ({type(err).__name__})") from None
    children = client.search_runs(
        [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{run_id}'", order_by=["attributes.start_time ASC"]
    )
    if children:
        if comparison is None:
            try:
                comparison = json.loads(Path(client.download_artifacts(run_id, "comparison.json")).read_text())
            except Exception:
                comparison = None
        runs = [_load_run(client, c.info.run_id) for c in children]
        title = parent.info.run_name or run_id
    else:
        runs = [_load_run(client, run_id)]
        title = runs[0].name
    target = (comparison or {}).get("target_val_loss")
    if target is None:
        target = next((r.summary.get("target_val_loss") for r in runs if r.summary.get("target_val_loss")), None)
    return ReportData(
        title, runs, comparison, target, calibrations_in(path) if on_disk else [], profiles_in(path) if on_disk else []
    )
