"""The entry points of COPUS's Ray Train workers as the driver names them, and what a training
group is launched with.

Ray Train pickles the function a trainer runs by reference (its module and name), and the driver
must import that module to name it. The functions here import `copus.cluster.worker`, which
imports torch and the whole training stack, on the worker when they run; the driver, the
controller and the CLI never import torch for them (torch is ~5 s of every `copus` command's
start on a small machine)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from copus.storage import Location
from copus.train.faults import Faults
from copus.train.worker_plan import WorkerPlan


@dataclass(frozen=True)
class TrainLaunch:
    """What a training worker group is launched with (the driver's `launch_trainer`)."""

    plan: WorkerPlan
    monitor: Any  # the actor rank 0 reports to: the Goodput controller or a RunMonitor
    clock_origin: float  # time.time() at which the run (all its launches) started
    adaptive: bool  # rank 0 asks the controller for decisions at step boundaries
    faults: Faults = field(default_factory=Faults)
    record_sample_ids: bool = False
    controller_timeout_s: float = 10.0  # a controller slower than this to answer means no decision
    checkpoint_root: Location | None = None  # the Ray run's storage: older checkpoints to fall back to

    def as_loop_config(self) -> dict:
        """Ray Train hands its workers a dict: this launch under one key."""
        return {"launch": self}


def train_worker(loop_config: dict) -> dict:
    """A training group's rank (`copus run`, a probe's branch, a calibration's continuation)."""
    from copus.cluster import worker

    return worker.train_worker(loop_config)


def gns_worker(loop_config: dict) -> dict:
    """`copus gns`: a rank measuring the gradient noise scale."""
    from copus.cluster import worker

    return worker.gns_worker(loop_config)


def profile_worker(loop_config: dict) -> dict:
    """`copus profile`: a rank timing the job's configurations."""
    from copus.cluster import worker

    return worker.profile_worker(loop_config)
