"""Worker side of `copus profile`: time real training steps of the experiment's workload in
each configuration asked for, inside one process group.

Collective: every rank calls `measure_points` with the same job. The ranks rebuild the model
for each layout on a fresh DeviceMesh over the same process group (no relaunch between
layouts) and change the batch shape between points within a layout, as training does. A step
is timed from a barrier to its end on every rank (CUDA events on GPUs, so queued kernels
count), and the slowest rank's time is kept; a point's figure is the median of its timed
steps after warm-up. Rank 0 decides, against the wall-clock deadline, whether another point
starts, and tells the others.

Failures are not caught here: a rank that fails (out of memory, say) fails the worker group,
and the driver records the point it was measuring as infeasible and relaunches for the rest.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch
import torch.distributed as dist

from copus.core.layout import CandidateConfig
from copus.parallel.agree import agree
from copus.records import ProfileLayoutRecord, ProfilePointRecord, ProfileReshardRecord, ProfileStartRecord
from copus.train.data import replica_batch
from copus.train.host import release_memory
from copus.train.profile_job import ProfileJob
from copus.train.replica import attach_gns, build_replica, make_optimizer, train_step, world_rank_size
from copus.train.reshard_in_place import ReshardFailed, reshard_in_place
from copus.train.worker_plan import WorkerPlan


class InjectedFault(RuntimeError):
    """Raised on purpose (COPUS_INJECT_PROFILE_FAILURE) to exercise the recovery path."""


class _StepClock:
    """Points in time on this rank: recorded CUDA events on a GPU (the kernels queued before a
    point count), perf_counter on a CPU; `seconds` between two of them."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, marks: list) -> list[float]:
        """The seconds between consecutive marks (waiting for the last one's kernels)."""
        if not self.cuda:
            return [b - a for a, b in zip(marks, marks[1:])]
        marks[-1].synchronize()
        return [a.elapsed_time(b) / 1000.0 for a, b in zip(marks, marks[1:])]


def _layout_groups(points: tuple[CandidateConfig, ...]) -> list[tuple[tuple, list[CandidateConfig]]]:
    """Consecutive points of the same layout, sharding and recomputation share one model build
    (the batch shape changes between steps of a replica; the rest needs another replica)."""
    groups: list[tuple[tuple, list[CandidateConfig]]] = []
    for c in points:
        build = tuple(c.replica().values())
        if groups and groups[-1][0] == build:
            groups[-1][1].append(c)
        else:
            groups.append((build, [c]))
    return groups


def measure_points(job: ProfileJob, emit: Callable[[dict], None]) -> dict:
    """Measure the job's points in order until done or past the deadline. Rank 0 emits a
    `profile_layout` record before building each layout, a `profile_reshard` record when the
    state moved there in place from the layout before, a `profile_start` record before each
    point and a `profile_point` record after it."""
    rank, _ = world_rank_size()
    done = 0
    replica, left = None, None  # the layout's (model, optimizer, stream), and its first point
    try:
        for _, group in _layout_groups(job.points):
            first = group[0]
            plan = job.plan.replaced(**first.as_dict())
            if rank == 0:
                emit(ProfileLayoutRecord(layout=[first.dp, first.tp, first.pp]).as_dict())
            # The old replica is _replica_for's to free or move from: should it fail, nothing is freed twice.
            previous, replica = replica, None
            replica = _replica_for(plan, first, previous, left, emit)
            left = first
            for cfg in group:
                stop = time.time() >= job.deadline
                if agree(1.0 if (rank == 0 and stop) else 0.0, replica[0].device) > 0:
                    return {"measured": done, "stopped": "budget"}
                if rank == 0:
                    emit(ProfileStartRecord(config=cfg.as_dict()).as_dict())
                point = _measure_point(job, plan, cfg, replica, first_of_group=done == 0)
                done += 1
                if rank == 0:
                    emit(point.as_dict())
    finally:
        if replica is not None:  # free the last layout's model, optimiser state and process groups
            replica[0].close()
            release_memory(replica[0].device)
    return {"measured": done, "stopped": "done"}


def _replica_for(plan: WorkerPlan, first: CandidateConfig, replica: tuple | None, left, emit) -> tuple:
    """The replica for `plan`'s layout: built, for the group's first layout; else moved there in
    place from the layout before (`reshard_in_place`, as a run's layout change: what it takes is
    the figure the planner charges a first layout change, rank 0 emits it), or, when that fails,
    the old one freed and the new one built. Collective."""
    if replica is not None:
        model, optimizer, stream = replica
        try:
            new_model, new_optimizer, stats = reshard_in_place(
                model, optimizer, plan, first, lambda m: make_optimizer(m, plan.optimizer, plan.lr.base_lr)
            )
        except ReshardFailed:  # the old layout is intact on every rank
            model.close()
            release_memory(model.device)
        else:
            release_memory(new_model.device)
            seconds = agree(stats["reshard_s"], new_model.device)
            moved = agree(float(stats["bytes_moved"]), new_model.device)
            if world_rank_size()[0] == 0:
                emit(
                    ProfileReshardRecord(
                        from_=left.as_dict(), to=first.as_dict(), seconds=seconds, bytes_moved=moved
                    ).as_dict()
                )
            attach_gns(new_model, new_optimizer, plan)  # training probes gradient norms every step: so does profiling
            return new_model, new_optimizer, stream
    model, optimizer, stream = build_replica(plan, fresh=False)  # timing only: no need to read init_from
    attach_gns(model, optimizer, plan)
    return model, optimizer, stream


def _measure_point(
    job: ProfileJob, plan: WorkerPlan, cfg: CandidateConfig, replica: tuple, first_of_group: bool
) -> ProfilePointRecord:
    """Time `cfg`'s steps on the layout's replica (model, optimizer, stream); collective. The
    figure is the median of the timed steps; the peak memory is the largest rank's (GPUs only)."""
    model = replica[0]
    cuda = model.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(model.device)
    settle_until = time.time() + (job.settle_s if first_of_group else 0.0)
    times, warmup = _time_steps(job, plan, cfg, replica, settle_until)
    peak = agree(float(torch.cuda.max_memory_allocated(model.device)), model.device) if cuda else None
    step = statistics.median(times)
    return ProfilePointRecord(
        config=cfg.as_dict(),
        step_time_s=step,
        step_times=times,
        warmup_times=warmup,
        samples_per_s=cfg.gbs / step,
        peak_memory_bytes=peak,
    )


def _time_steps(
    job: ProfileJob, plan: WorkerPlan, cfg: CandidateConfig, replica: tuple, settle_until: float
) -> tuple[list[float], list[float]]:
    """(timed steps, warm-up steps): each step's time is the slowest rank's. A step is warm-up
    while within job.warmup_steps or, on every rank's word, before `settle_until`."""
    model = replica[0]
    rank, _ = world_rank_size()
    clock = _StepClock(model.device)
    warmup: list[float] = []
    while len(warmup) < job.warmup_steps or agree(float(time.time() < settle_until), model.device) > 0:
        warmup.append(_barrier_step(clock, plan, cfg, replica))
    if rank == 0 and job.fail_at == cfg.label():
        # Where the other ranks' next collective is the timed steps' first barrier: the one the
        # failing rank's clean-up (the model's close) also enters.
        raise InjectedFault(f"injected failure at {cfg.label()}")
    if job.timing == "barrier":
        return [_barrier_step(clock, plan, cfg, replica) for _ in range(job.steps)], warmup
    return _continuous_steps(clock, job.steps, plan, cfg, replica), warmup


def _fetch(plan: WorkerPlan, cfg: CandidateConfig, replica: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's inputs and targets of the next step at cfg's batch shape, as training fetches them."""
    model, _, stream = replica
    batch = replica_batch(stream.next_global_batch(cfg.gbs), model.dp_rank, plan.dp, cfg.mbs)
    return stream.windows.batch(batch.sample_indices)


def _train(plan: WorkerPlan, cfg: CandidateConfig, replica: tuple, data: tuple[torch.Tensor, torch.Tensor]) -> None:
    model, optimizer, _ = replica
    train_step(model, optimizer, *data, cfg.mbs, plan.lr.lr(0, cfg.gbs), plan.optimizer.grad_clip)


def _barrier_step(clock: _StepClock, plan: WorkerPlan, cfg: CandidateConfig, replica: tuple) -> float:
    """One step timed from a barrier to its end (the data fetched before the barrier); the
    slowest rank's time."""
    data = _fetch(plan, cfg, replica)
    if dist.is_initialized():
        dist.barrier()
    start = clock.mark()
    _train(plan, cfg, replica, data)
    (elapsed,) = clock.seconds([start, clock.mark()])
    return agree(elapsed, replica[0].device)


def _continuous_steps(
    clock: _StepClock, steps: int, plan: WorkerPlan, cfg: CandidateConfig, replica: tuple
) -> list[float]:
    """`steps` steps back to back after one barrier, each timed from its start to the next
    one's, as a training run pays them (its data and the ranks' waits on one another included);
    agreed on (the slowest rank's) only after the last, so that no collective of the
    measurement's own runs between them."""
    if dist.is_initialized():
        dist.barrier()
    marks = []
    for _ in range(steps):
        marks.append(clock.mark())
        _train(plan, cfg, replica, _fetch(plan, cfg, replica))
    marks.append(clock.mark())
    return [agree(t, replica[0].device) for t in clock.seconds(marks)]
