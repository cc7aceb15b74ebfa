"""A calibration continuation (copus.train.calibrate) in this process: what its evaluation
cadence changes, and what it must not."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from copus.train.calibrate import continue_branch, reference_run
from tests.train.loop_helpers import small_plan


@pytest.fixture(scope="module")
def branch(token_cache, tmp_path_factory):
    plan = small_plan(token_cache)
    points = reference_run(plan, [16, 48], tmp_path_factory.mktemp("ref"), val_samples=8)
    return plan, points[1]


def test_a_growing_evaluation_interval_reads_the_same_trajectory_less_often(branch):
    plan, start = branch
    run = dict(gbs=2, seed_index=0, decrement=1.0, max_samples=200, eval_every_samples=4, val_samples=8)
    fixed = continue_branch(plan, Path(start["checkpoint"]), start, **run)
    growing = continue_branch(plan, Path(start["checkpoint"]), start, **run, eval_growth=0.5)

    assert fixed["curve_samples"][:4] == [0, 4, 8, 12]
    gaps = [b - a for a, b in zip(growing["curve_samples"], growing["curve_samples"][1:])]
    assert gaps[:2] == [4, 4] and all(later >= earlier for earlier, later in zip(gaps, gaps[1:]))
    assert max(gaps) > 4 and len(growing["curve_samples"]) < len(fixed["curve_samples"])
    # The evaluations do not touch the training: where both evaluated, the losses are the same.
    fixed_at = dict(zip(fixed["curve_samples"], fixed["curve_val_loss"]))
    shared = [(s, v) for s, v in zip(growing["curve_samples"], growing["curve_val_loss"]) if s in fixed_at]
    assert len(shared) >= 4 and all(v == fixed_at[s] for s, v in shared)
    assert math.isfinite(fixed["samples"]) and math.isfinite(growing["samples"])
