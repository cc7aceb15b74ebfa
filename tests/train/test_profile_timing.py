"""How `copus profile` times a step (copus.train.profile): "continuous" counts what a training run
pays between one step's start and the next (its data, the ranks' waits on one another), "barrier"
only a step's own work after a barrier. On 2 gloo ranks a pipeline of the debug model is profiled
both ways while one rank's data arrives late by a fixed delay: the continuous figure holds the
delay in every step, the barrier figure none of it."""

from __future__ import annotations

import time

from copus.core.layout import CandidateConfig
from copus.train import profile
from copus.train.local import run_on_gloo_ranks
from copus.train.profile_job import ProfileJob
from tests.train.loop_helpers import small_plan

DELAY_S = 0.25  # far above the debug model's step, so the two readings cannot be confused


def _profile_with_late_data(plan, timing: str) -> list[float]:
    """Profile one point with rank 1's data fetched DELAY_S late; rank 0 returns the timed steps."""
    import torch.distributed as dist

    from copus.train.data import TokenWindows

    batch = TokenWindows.batch

    def late_batch(self, indices):
        if dist.get_rank() == 1:
            time.sleep(DELAY_S)
        return batch(self, indices)

    TokenWindows.batch = late_batch
    cfg = CandidateConfig(dp=1, tp=1, pp=2, mbs=2, gbs=4)
    job = ProfileJob(plan, (cfg,), warmup_steps=1, steps=3, deadline=time.time() + 600, settle_s=0.0, timing=timing)
    points = []
    profile.measure_points(job, points.append)
    return [p["step_times"] for p in points if p.get("kind") == "profile_point"]


def test_continuous_timing_counts_what_a_run_pays_between_steps_and_barrier_timing_does_not(tmp_path):
    plan = small_plan(tmp_path / "tokens", dp=1, tp=1, pp=2, mbs=2, gbs=4)
    continuous = run_on_gloo_ranks(2, _profile_with_late_data, plan, "continuous")[0]
    barrier = run_on_gloo_ranks(2, _profile_with_late_data, plan, "barrier")[0]
    (steps,) = continuous
    assert len(steps) == 3 and min(steps) >= DELAY_S  # every step waits for rank 1's data
    (steps,) = barrier
    assert len(steps) == 3 and max(steps) < DELAY_S  # the fetch happens before the barrier
