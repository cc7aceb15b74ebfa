"""What a profiling group is given (`copus.train.profile` measures it on the workers): plain
values only, so that the driver builds one without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

from copus.core.layout import CandidateConfig
from copus.train.worker_plan import WorkerPlan


@dataclass(frozen=True)
class ProfileJob:
    plan: WorkerPlan  # the experiment's workload; its layout and batch shape are replaced per point
    points: tuple[CandidateConfig, ...]  # in the order to measure them
    warmup_steps: int
    steps: int
    deadline: float  # time.time() after which no new point starts
    fail_at: str | None = None  # CandidateConfig.label() of a point at which rank 0 raises InjectedFault
    # "barrier": each step from a barrier to its end (the ranks' idle time between steps not
    # counted); "continuous": the timed steps back to back, as in training, each from its own
    # start to the next step's (data included, no barrier between them).
    timing: str = "barrier"
    # The first point of a fresh worker group warms up for at least this long: for the first
    # seconds the group's own start-up (Ray's workers and agents) still competes for the cores.
    settle_s: float = 3.0
