"""What the launches of one `copus run` share (the driver's side)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from copus.cluster.controller import ControllerSpec
from copus.cluster.run_state import RunState
from copus.config import ExperimentConfig
from copus.core.layout import CandidateConfig
from copus.storage import Location
from copus.tracking import Tracker
from copus.train.faults import Faults
from copus.train.worker_plan import WorkerPlan
from workloads.corpus import TokenFiles


@dataclass
class DriverRun:
    """What the launches of one run share: its inputs, its state in the output directory
    (run_state.json), its MLflow run, and the configuration the next launch trains in."""

    cfg: ExperimentConfig
    out: Location  # the output directory: a path or an object-store URI (copus.storage)
    tokens: TokenFiles
    plan: WorkerPlan
    faults: Faults
    record_sample_ids: bool  # step records carry the global batch's sample ids (SAMPLE_IDS_ENV)
    state: RunState
    spec: ControllerSpec | None  # None: a static run, without a controller
    start: CandidateConfig
    current: CandidateConfig
    tracker: Tracker
    echo: Callable[[str], None]
    run_id: str = ""
    clock_origin: float = 0.0  # time.time() at which the run (all its launches) started


def run_label(cfg: ExperimentConfig, start: CandidateConfig) -> str:
    """A run's default MLflow name: what tells it apart from other runs of the experiment."""
    return f"{cfg.name} {cfg.policy.name} gbs{start.gbs} dp{start.dp}-tp{start.tp}-pp{start.pp} mbs{start.mbs}"
