"""Ray Train worker entry: wires Ray (checkpoints, metrics actor, rank) into the plain loop."""

from __future__ import annotations

import contextlib
from pathlib import Path

import ray.train

from copus.train.gns import measure_gns
from copus.train.loop import LoopHooks, run_training
from copus.train.plan import WorkerPlan
from copus.train.profile import measure_points


def train_worker(loop_config: dict) -> dict:
    plan: WorkerPlan = loop_config["plan"]
    monitor = loop_config["monitor"]
    rank = ray.train.get_context().get_world_rank()

    def emit(record: dict) -> None:
        monitor.push.remote(record)  # fire and forget; order is kept per caller

    def persist(path: Path, metrics: dict) -> None:
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(str(path)))

    checkpoint = ray.train.get_checkpoint()
    with checkpoint.as_directory() if checkpoint else contextlib.nullcontext() as resume_dir:
        hooks = LoopHooks(persist_checkpoint=persist, resume_from=Path(resume_dir) if resume_dir else None,
                          clock_origin=loop_config["clock_origin"], fail_reshard=loop_config.get("fail_reshard", False))
        if rank == 0:  # only rank 0 speaks to the driver (and the controller)
            hooks.emit = emit
            if loop_config.get("adaptive"):
                hooks.decide = lambda step, current: ray.get(monitor.decision.remote())
        elif loop_config.get("adaptive"):
            hooks.decide = lambda step, current: None  # follows rank 0's broadcast
        return run_training(plan, hooks)


def gns_worker(loop_config: dict) -> dict:
    """`copus gns`: measure B_noise at fixed (initial) weights, no update, no checkpoint."""
    return measure_gns(loop_config["plan"], loop_config["steps"])


def profile_worker(loop_config: dict) -> dict:
    """`copus profile`: time the job's configurations; rank 0 streams results to the driver."""
    monitor = loop_config["monitor"]
    rank = ray.train.get_context().get_world_rank()
    return measure_points(loop_config["job"], lambda record: monitor.push.remote(record) if rank == 0 else None)
