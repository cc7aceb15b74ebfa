"""What a Ray Train worker runs: Ray (checkpoints, metrics actor, rank) wired into the plain loop.
The driver names these functions through `copus.cluster.entry`, which imports this module on the
worker only: it imports torch and the training stack."""

from __future__ import annotations

import contextlib
from pathlib import Path

import ray.train

from copus.cluster.entry import TrainLaunch
from copus.cluster.loop_config import opened
from copus.core.reconfiguration import SwitchOrder
from copus.records import CheckpointRefusedRecord
from copus.storage import Location
from copus.train.checkpoint import newest_complete, resume_candidates
from copus.train.gns import measure_gns
from copus.train.loop import LoopHooks, run_training
from copus.train.profile import measure_points


def train_worker(loop_config: dict) -> dict:
    launch: TrainLaunch = opened(loop_config)["launch"]
    plan, monitor = launch.plan, launch.monitor
    rank = ray.train.get_context().get_world_rank()

    def emit(record: dict) -> None:
        monitor.push.remote(record)  # fire and forget; order is kept per caller

    def persist(path: Path, metrics: dict) -> None:
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(str(path)))

    with contextlib.ExitStack() as stack:
        resume_dir, refused = newest_complete(_resume_candidates(launch.checkpoint_root), stack, _node_copy)
        if rank == 0:
            for path, reason in refused:
                monitor.push.remote(CheckpointRefusedRecord(path=str(path), reason=reason).as_dict())
        hooks = LoopHooks(
            persist_checkpoint=persist,
            resume_from=resume_dir,
            clock_origin=launch.clock_origin,
            faults=launch.faults,
            record_sample_ids=launch.record_sample_ids,
        )
        if rank == 0:  # only rank 0 speaks to the driver (and the controller)
            hooks.emit = emit
            if launch.adaptive:
                hooks.decide = _patient_decisions(monitor, launch.controller_timeout_s)
        elif launch.adaptive:
            hooks.decide = lambda step, current: None  # follows rank 0's broadcast
        return run_training(plan, hooks)


def _resume_candidates(root: Location | None) -> list[Location]:
    """The checkpoints in the run's storage (`root`) and the one Ray Train hands over, newest
    first: a torn or corrupt one is refused and an older complete one used."""
    latest = ray.train.get_checkpoint()
    if latest is None:
        return resume_candidates(None, root)
    if root is None:
        return [Location(latest.filesystem, latest.path)]
    return resume_candidates(Location(latest.filesystem, latest.path, root.scheme, root.query), root)


def _node_copy(where: Location):
    """A checkpoint in storage as a local directory: the directory itself when storage is local,
    else one download per node that the node's ranks share (Ray's Checkpoint.as_directory)."""
    return ray.train.Checkpoint(where.path, filesystem=where.fs).as_directory()


def _patient_decisions(controller, timeout_s: float):
    """Rank 0's question to the controller at a step boundary, answered within `timeout_s`:
    a controller that crashed (and is being restarted) or hangs means no decision this time,
    and training goes on in the current configuration."""
    warned = {"down": False}

    def decide(step: int, current) -> SwitchOrder | None:
        try:
            decision = ray.get(controller.decision.remote(), timeout=timeout_s)
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError) as err:
            if not warned["down"]:
                print(
                    f"copus: the controller did not answer at step {step} ({type(err).__name__}); "
                    f"training goes on in {current.label()}",
                    flush=True,
                )
            warned["down"] = True
            return None
        warned["down"] = False
        return decision

    return decide


def gns_worker(loop_config: dict) -> dict:
    """`copus gns`: measure B_noise at fixed (initial) weights, no update, no checkpoint."""
    config = opened(loop_config)
    return measure_gns(config["plan"], config["steps"])


def profile_worker(loop_config: dict) -> dict:
    """`copus profile`: time the job's configurations; rank 0 streams results to the driver."""
    config = opened(loop_config)
    monitor = config["monitor"]
    rank = ray.train.get_context().get_world_rank()
    return measure_points(config["job"], lambda record: monitor.push.remote(record) if rank == 0 else None)
