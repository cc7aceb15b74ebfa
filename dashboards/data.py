"""What a report shows, read back from MLflow: one `RunSeries` per training run (a policy of a
comparison, or a single run), each metric as (step, value) series, wall-clock per step; and the
calibrations (`copus calibrate`, calibration-<id>.json) of a profile directory, read as they are."""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from mlflow.tracking import MlflowClient

from copus.cluster.profile_table import table_problem
from copus.core.calibration import calibration_problem
from copus.core.reconfiguration import Reconfiguration
from copus.storage import Location, first_line, local_path

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
    # Why there is no summary to show (none yet, or one that could not be read), else None: the
    # report says so instead of reading an empty summary as a run that missed its target.
    summary_problem: str | None = None

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


def changes(run: RunSeries) -> list[Reconfiguration]:
    """The run's reconfigurations as its summary.json lists them; an entry that is no
    reconfiguration (a summary written by hand, or cut short) is left out, and named among the
    report's problems (`unreadable_changes`)."""
    return [c for c in map(_reconfiguration, run.summary.get("reconfigurations") or []) if c is not None]


def _reconfiguration(entry) -> Reconfiguration | None:
    try:
        return Reconfiguration.from_dict(entry)
    except (KeyError, TypeError, AttributeError, ValueError):
        return None


def unreadable_changes(run: RunSeries) -> str | None:
    """What the report says of the run's reconfiguration entries it cannot read, if any."""
    entries = run.summary.get("reconfigurations") or []
    if not isinstance(entries, list):
        return f"{run.name}: summary.json's reconfigurations is not a list: none shown"
    bad = sum(_reconfiguration(e) is None for e in entries)
    if not bad:
        return None
    return f"{run.name}: {bad} of {len(entries)} reconfigurations in summary.json could not be read: left out"


def audited_changes(run: RunSeries) -> list[Reconfiguration]:
    """The run's changes of GBS that summary.json audits (`copus.core.audit`): each one's audit
    carries `predicted_efficiency_gain` (the controller's SE(new)/SE(old)) and
    `realized_efficiency_gain` (progress per sample after/before at matched loss), either
    possibly None."""
    return [c for c in changes(run) if c.audit is not None and c.changes_gbs]


@dataclass
class ReportData:
    title: str
    runs: list[RunSeries]
    comparison: dict | None
    target: float | None
    calibrations: list[dict] = field(default_factory=list)  # calibration files, as `load_calibration` reads them
    profiles: list[dict] = field(default_factory=list)  # profile tables of the output directory's profiles/
    problems: list[str] = field(default_factory=list)  # inputs that could not be read: each names its file and why


def artifact_json(client: MlflowClient, run_id: str, name: str) -> dict | None:
    """A run's JSON artifact (summary.json, comparison.json); None when the run has none.
    ReportError naming the file and what failed when it is there and cannot be read."""
    try:
        names = {a.path for a in client.list_artifacts(run_id)}
    except Exception as err:  # an artifact store that does not answer, or refuses
        raise ReportError(f"{name} of run {run_id}: could not list its artifacts ({_failure(err)})") from None
    if name not in names:
        return None
    try:
        data = json.loads(Path(client.download_artifacts(run_id, name)).read_text())
    except Exception as err:  # a download that fails, or a file that is not JSON
        raise ReportError(f"{name} of run {run_id}: could not be read ({_failure(err)})") from None
    if not isinstance(data, dict):
        raise ReportError(f"{name} of run {run_id}: not a JSON object")
    return data


def _failure(err: BaseException) -> str:
    return f"{type(err).__name__}: {first_line(err, 160)}"


def _load_run(client: MlflowClient, run_id: str) -> RunSeries:
    """A run's metrics and summary.json; a run without a readable summary is still plotted from
    what it logged, with `summary_problem` saying why its outcome is not shown."""
    run = client.get_run(run_id)
    metrics = {k: {m.step: m.value for m in client.get_metric_history(run_id, k)} for k in SERIES}
    name = run.info.run_name or run_id
    try:
        summary = artifact_json(client, run_id, "summary.json")
        problem = None if summary is not None else f"run {name}: no summary.json (MLflow status {run.info.status})"
    except ReportError as err:
        summary, problem = None, f"run {name}: {err}"
    return RunSeries(name, run.data.tags.get("policy", "?"), run_id, metrics, summary or {}, problem)


def load_calibration(path: Path | Location) -> dict:
    """A calibration file of `copus calibrate` (its dict, with `path` added); ReportError with
    one line when the file is not one. Values not measured are null (None) in it."""
    try:
        data = Location.parse(path).read_json()
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ReportError(f"{path}: not a readable calibration file ({type(err).__name__})") from None
    problem = calibration_problem(data)
    if problem:
        raise ReportError(f"{path}: not a calibration file ({problem})")
    return {**data, "path": str(path)}


def _profile_files(directory: Location, prefix: str) -> list[Location]:
    return [f for f in (directory / "profiles").iterdir() if f.name.startswith(prefix) and f.name.endswith(".json")]


def calibrations_in(directory: Location, problems: list[str]) -> list[dict]:
    """The calibrations in an output directory's profiles/ folder (none: an empty list). A file
    there that is not a calibration does not stop the run's report: it is named in `problems`."""
    found = []
    for path in _profile_files(directory, "calibration-"):
        try:
            found.append(load_calibration(path))
        except ReportError as err:
            problems.append(f"{err}: not shown")
    return found


def profiles_in(directory: Location, problems: list[str]) -> list[dict]:
    """The profile tables (`copus profile`) in an output directory's profiles/ folder; a file
    there that is not one is named in `problems`."""
    found = []
    for path in _profile_files(directory, "profile-"):
        try:
            table = path.read_json()
        except (OSError, ValueError) as err:
            problems.append(f"{path}: not a readable profile table ({_failure(err)}): not shown")
            continue
        problem = table_problem(table)
        if problem is None:
            found.append(table)
        else:
            problems.append(f"{path}: {problem}: not shown")
    return found


# What MLflow names a run: uuid4().hex.
RUN_ID = re.compile(r"[0-9a-f]{32}")


def output_location(source: str) -> Location | None:
    """`source` as a location when it names one (a URI, or a path that exists), else None: an
    MLflow run id. StorageError for a path that cannot name a file (too long, a symlink loop)."""
    return Location.parse(source) if "://" in source or local_path(source).exists() else None


def _pointer(file: Location, run_key: str) -> dict:
    """comparison.json or summary.json: the MLflow run it points at must be named in it
    (`mlflow_tracking_uri` and `run_key`); ReportError naming the file when it is not."""
    try:
        data = file.read_json()
    except (UnicodeDecodeError, ValueError) as err:
        raise ReportError(f"{file}: not readable JSON ({type(err).__name__})") from None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), str) for k in ("mlflow_tracking_uri", run_key)):
        raise ReportError(f"{file}: not a copus {file.name} (no mlflow_tracking_uri and {run_key})")
    return data


def _run_source(source: str, path: Location | None, tracking_uri: str | None) -> tuple[dict | None, str, str]:
    """(comparison or None, tracking URI, run id) of what `source` names."""
    if path is not None and path.is_dir():
        if (path / "comparison.json").is_file():
            comparison = _pointer(path / "comparison.json", "mlflow_parent_run_id")
            return comparison, comparison["mlflow_tracking_uri"], comparison["mlflow_parent_run_id"]
        if (path / "summary.json").is_file():
            summary = _pointer(path / "summary.json", "mlflow_run_id")
            return None, summary["mlflow_tracking_uri"], summary["mlflow_run_id"]
        raise ReportError(f"{path}: no comparison.json or summary.json (not a copus output directory)")
    if path is not None or not RUN_ID.fullmatch(source):
        raise ReportError(f"{source}: no such output directory or calibration file, and not an MLflow run id")
    return None, tracking_uri or f"sqlite:///{Path.cwd() / 'mlflow.db'}", source


def tracking_client(uri: str, source: str) -> MlflowClient:
    """A client that only reads: a SQLite database that is not there is refused, where MLflow
    would create an empty one (in the current directory, for the default URI)."""
    if not uri.strip():  # MLflow would take the default: a new database in the current directory
        raise ReportError(f"{source}: no MLflow tracking URI")
    if uri.startswith("sqlite:") and not (uri.startswith("sqlite:///") and Path(uri[len("sqlite:///") :]).is_file()):
        raise ReportError(f"{source}: no MLflow database at {uri}")
    try:
        return MlflowClient(tracking_uri=uri)
    except Exception as err:  # MlflowException for a URI it does not serve (a file store, a typo)
        raise ReportError(f"{source}: cannot open MLflow at {uri} ({first_line(err, 160)})") from None


# A report reads a few things once: an MLflow server that does not answer fails it in seconds
# (MLflow's own default retries an unreachable server for minutes, with 120 s timeouts).
BOUNDED_MLFLOW = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


@contextlib.contextmanager
def bounded_mlflow_requests() -> Iterator[None]:
    """MLflow's HTTP requests bounded while a report reads (the user's own settings win)."""
    saved = {k: os.environ.get(k) for k in BOUNDED_MLFLOW}
    os.environ.update({k: v for k, v in BOUNDED_MLFLOW.items() if saved[k] is None})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)


def _comparison_of(client: MlflowClient, run_id: str) -> tuple[dict | None, str | None]:
    """A comparison's parent run's comparison.json, or None and why it is not shown."""
    try:
        comparison = artifact_json(client, run_id, "comparison.json")
    except ReportError as err:
        return None, f"{err}: no paired statistics shown"
    if comparison is None:
        return None, f"run {run_id}: no comparison.json (the suite has not finished): no paired statistics shown"
    return comparison, None


def _runs_of(
    client: MlflowClient, parent, comparison: dict | None
) -> tuple[str, list[RunSeries], dict | None, list[str]]:
    """The report's title and runs: a comparison's children (and its comparison.json when the
    folder did not hold one), or the run itself; and what of them could not be read."""
    run_id = parent.info.run_id
    children = client.search_runs(
        [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{run_id}'", order_by=["attributes.start_time ASC"]
    )
    # A suite's tuning runs chose its tuned baselines; the report shows the evaluation.
    children = [c for c in children if c.data.tags.get("copus.phase") != "tuning"]
    if not children:
        runs = [_load_run(client, run_id)]
        return runs[0].name, runs, comparison, _summary_problems(runs)
    problem = None
    if comparison is None:
        comparison, problem = _comparison_of(client, run_id)
    runs = [_load_run(client, c.info.run_id) for c in children]
    return parent.info.run_name or run_id, runs, comparison, ([problem] if problem else []) + _summary_problems(runs)


def _summary_problems(runs: list[RunSeries]) -> list[str]:
    said = [r.summary_problem for r in runs] + [unreadable_changes(r) for r in runs]
    return [problem for problem in said if problem]


def load(source: str, tracking_uri: str | None) -> ReportData:
    """`source`: an output directory (of `copus compare` or `copus run`; a path or an object-store
    URI) or an MLflow run id (a comparison's parent run, or a single run)."""
    path = output_location(source)
    comparison, tracking_uri, run_id = _run_source(source, path, tracking_uri)
    on_disk = path is not None and path.is_dir()
    client = tracking_client(tracking_uri, source)
    with bounded_mlflow_requests():
        try:
            parent = client.get_run(run_id)
        except Exception as err:
            raise ReportError(f"{source}: no MLflow run {run_id} at {tracking_uri} ({type(err).__name__})") from None
        title, runs, comparison, problems = _runs_of(client, parent, comparison)
    target = (comparison or {}).get("target_val_loss")
    if target is None:
        target = next((r.summary.get("target_val_loss") for r in runs if r.summary.get("target_val_loss")), None)
    calibrations = calibrations_in(path, problems) if on_disk else []
    profiles = profiles_in(path, problems) if on_disk else []
    return ReportData(title, runs, comparison, target, calibrations, profiles, problems)
