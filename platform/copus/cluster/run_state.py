"""What the driver keeps in OUTPUT_DIR between launches of the same run.

`run_state.json` ties an output directory to one MLflow run and one workload, and carries the
wall-clock already spent, so a relaunch resumes the same run (same MLflow run, clock keeps
counting) and a relaunch with a different workload is refused instead of loading a
checkpoint that cannot fit.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

from copus.config import ConfigError, ExperimentConfig
from copus.core.layout import CandidateConfig
from copus.storage import Location, ray_storage

RUN_STATE = "run_state.json"
CONTROLLER_STATE = "controller_state.json"
RECORDS_LOG = "records.jsonl"  # every record rank 0 sent, in order (also the failed attempts')
FAULT_MARKERS = "faults"  # fault-injection markers (copus.train.faults)
# Bumped whenever checkpoints written before can no longer be loaded (2: flattened,
# name-keyed optimiser state for resharding across layouts; 3: manifests and COMPLETE marker).
CHECKPOINT_FORMAT = 3


@dataclass
class RunState:
    resume_key: str
    mlflow_run_id: str | None = None
    elapsed_s: float = 0.0
    launches: int = 0
    current: dict | None = None  # the configuration the run has reached (dp, tp, pp, mbs, gbs)
    reconfigurations: list = field(default_factory=list)
    restart_cost_s: float | None = None  # the last measured restart downtime
    in_place_cost_s: float | None = None  # the last measured in-place layout change downtime
    reconfigure: str | None = None  # "restart" once an in-place change fell back (sticky)
    worker_failures: list = field(default_factory=list)  # worker groups Ray Train restarted, and what was lost


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
    """--fresh: forget checkpoints and run state (keeps anything else the user put there)."""
    ray_storage(output_dir).rmtree()
    (output_dir / FAULT_MARKERS).rmtree()
    for name in (RUN_STATE, "summary.json", RECORDS_LOG, CONTROLLER_STATE):
        (output_dir / name).unlink(missing_ok=True)


def load_run_state(output_dir: Location, key: str) -> RunState:
    path = output_dir / RUN_STATE
    if not path.is_file():
        return RunState(resume_key=key)
    state = RunState(**path.read_json())
    if state.resume_key != key:
        raise ConfigError(
            f"output_dir: {output_dir} holds a run this configuration cannot resume (model, seq_len, "
            f"seed, data or checkpoint format changed); use --fresh to start over there, or another "
            f"output_dir"
        )
    return state


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
    (output_dir / RUN_STATE).write_json(asdict(state))
