"""What the driver keeps in OUTPUT_DIR between launches of the same run.

`run_state.json` ties an output directory to one MLflow run and one workload, and carries the
wall-clock already spent, so a relaunch resumes the same run (same MLflow run, clock keeps
counting) and a relaunch with a different workload is refused instead of loading a
checkpoint that cannot fit.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from dataclasses import dataclass, field
from typing import Callable

from pydantic import TypeAdapter, ValidationError

from copus.config import ConfigError, ExperimentConfig, format_pydantic_error
from copus.core.layout import CandidateConfig
from copus.core.reconfiguration import Reconfiguration
from copus.storage import RAY_STORAGE, Location, ray_storage, read_lines

RUN_STATE = "run_state.json"
CONTROLLER_STATE = "controller_state.json"
RECORDS_LOG = "records.jsonl"  # every record rank 0 sent, in order (also the failed attempts')
FAULT_MARKERS = "faults"  # fault-injection markers (copus.train.faults)


class RecordsLog(list):
    """The records of OUTPUT_DIR/records.jsonl, in order, with the numbers (from 1) of the lines
    that were not records (`malformed_lines`): what an audit that reads them rests on less."""

    def __init__(self, records: list[dict], malformed_lines: list[int]):
        super().__init__(records)
        self.malformed_lines = malformed_lines


def read_records_log(out: Location, warn: Callable[[str], None] | None = None) -> RecordsLog:
    """OUTPUT_DIR/records.jsonl as parsed records. A last line cut short (no newline: a driver
    died mid-write) is dropped silently; any other line that is not a record is left out,
    counted (`RecordsLog.malformed_lines`) and named in a warning to `warn` (default: stderr)."""
    path = out / RECORDS_LOG
    lines = list(read_lines(path))
    records, malformed = [], []
    for number, line in enumerate(lines, start=1):
        record = _record(line)
        if record is not None:
            records.append(record)
        elif not (number == len(lines) and not line.endswith("\n")):
            malformed.append(number)
    if malformed:
        (warn or _to_stderr)(malformed_lines_warning(path, malformed, len(lines)))
    return RecordsLog(records, malformed)


def _record(line: str) -> dict | None:
    """One line of records.jsonl as its record, or None when it is not one."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None


def malformed_lines_warning(path: Location, malformed: list[int], total: int) -> str:
    """The warning that names the lines of records.jsonl left out (up to five of them)."""
    shown = ", ".join(str(n) for n in malformed[:5]) + (f" and {len(malformed) - 5} more" if len(malformed) > 5 else "")
    return (
        f"warning: {path}: {len(malformed)} of {total} lines are not records and were left out (line {shown}); "
        "only a last line cut short by a dying driver is expected, so what reads these records rests on fewer"
    )


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr)


# Bumped whenever checkpoints written before can no longer be loaded (2: flattened,
# name-keyed optimiser state for resharding across layouts; 3: manifests and COMPLETE marker).
CHECKPOINT_FORMAT = 3
# Everything a run writes in its output directory (besides the hidden temporary file of an
# atomic write): what --fresh may delete, and all an output directory it starts over in may hold.
RUN_FILES = (
    RAY_STORAGE,
    FAULT_MARKERS,
    RUN_STATE,
    "summary.json",
    RECORDS_LOG,
    CONTROLLER_STATE,
    "profiles",
    "report.html",
)


@dataclass
class RunState:
    resume_key: str
    mlflow_run_id: str | None = None
    elapsed_s: float = 0.0
    launches: int = 0
    current: dict | None = None  # the configuration the run has reached (dp, tp, pp, mbs, gbs)
    reconfigurations: list[Reconfiguration] = field(default_factory=list)
    worker_failures: list = field(default_factory=list)  # worker groups Ray Train restarted, and what was lost

    def as_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["reconfigurations"] = [r.as_dict() for r in self.reconfigurations]
        return out


# Written by runs before the controller became the one owner of what a switch costs (its state
# file keeps it): read and dropped, so such a run still resumes.
_RETIRED_KEYS = frozenset({"restart_cost_s", "in_place_cost_s", "reconfigure"})


def resume_key(cfg: ExperimentConfig, data_fingerprint: str) -> str:
    """What must not change for a checkpoint to be resumable: the model, the data and the
    checkpoint format. The layout and batch shape may change: checkpoints reshard."""
    w = cfg.workload
    ident = {
        "model": w.model,
        "seq_len": w.seq_len,
        "seed": w.seed,
        "data": data_fingerprint,
        "format": CHECKPOINT_FORMAT,
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def clear_run(output_dir: Location) -> None:
    """--fresh: forget checkpoints and run state (profile tables and reports are kept). Only in
    a directory that holds nothing but a run's files: anything else (the current directory given
    by mistake, a folder of the user's) means these names may not be a run's either, and it is
    refused with nothing deleted."""
    foreign = sorted(c.name for c in output_dir.iterdir() if c.name not in RUN_FILES and not _temporary(c.name))
    if foreign:
        listed = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise ConfigError(
            f"output_dir: {output_dir} holds files a COPUS run does not write ({listed}): --fresh deletes "
            f"a run's files only where nothing else is; use another output_dir"
        )
    ray_storage(output_dir).rmtree()
    (output_dir / FAULT_MARKERS).rmtree()
    for name in (RUN_STATE, "summary.json", RECORDS_LOG, CONTROLLER_STATE):
        (output_dir / name).unlink(missing_ok=True)


def _temporary(name: str) -> bool:
    return name.startswith(".") and name.endswith(".tmp")


def load_run_state(output_dir: Location, key: str) -> RunState:
    path = output_dir / RUN_STATE
    if not path.is_file():
        return RunState(resume_key=key)
    state = _parsed_run_state(path)
    if state.resume_key != key:
        raise ConfigError(
            f"output_dir: {output_dir} holds a run this configuration cannot resume (model, seq_len, "
            f"seed, data or checkpoint format changed); use --fresh to start over there, or another "
            f"output_dir"
        )
    return state


def _parsed_run_state(path: Location) -> RunState:
    """run_state.json as a RunState, or ConfigError naming the file when it is not one."""
    try:
        data = path.read_json()
    except (UnicodeDecodeError, ValueError) as err:
        data, why = None, f"not JSON ({type(err).__name__})"
    else:
        why = "not a run state (expected an object with resume_key)"
    known = {f.name for f in dataclasses.fields(RunState)} | _RETIRED_KEYS
    if isinstance(data, dict) and "resume_key" in data and set(data) <= known:
        data = {k: v for k, v in data.items() if k not in _RETIRED_KEYS}
        changes = data.pop("reconfigurations", [])
        try:  # the field types too: a resumed run computes with them
            state = TypeAdapter(RunState).validate_python(data)
            state.reconfigurations = [Reconfiguration.from_dict(c) for c in changes]
            return state
        except ValidationError as err:
            why = f"{format_pydantic_error(err)}"
        except (KeyError, TypeError, AttributeError) as err:
            why = f"reconfigurations: not a list of reconfigurations ({type(err).__name__}: {err})"
    raise ConfigError(f"output_dir: {path} is damaged: {why}; use --fresh to start over there, or another output_dir")


def resume_config(reached: dict | None, start: CandidateConfig) -> tuple[CandidateConfig, str | None]:
    """Where a (re)started run trains: the configuration it had reached, unless the cluster
    has another number of workers now (it grew or shrank): then the experiment's starting
    configuration for the new size, from the same checkpoint (DCP reshards across world sizes).
    Returns the configuration and, for a changed cluster, a line saying so."""
    if not reached:
        return start, None
    before = CandidateConfig.from_dict(reached)
    if before.world_size == start.world_size:
        return before, None
    return start, (
        f"the cluster has {start.world_size} workers now, {before.world_size} before: resuming from the "
        f"last checkpoint in {start.label()}"
    )


def save_run_state(output_dir: Location, state: RunState) -> None:
    output_dir.mkdir()
    (output_dir / RUN_STATE).write_json(state.as_dict())
