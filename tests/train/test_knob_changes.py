"""The training loop changes only the sharding mode or the recomputation mode in place, as a
controller decision at a step boundary (the planner calls either a layout change): each step's
loss equals one process's, with the same data, and no change falls back to a restart."""

from __future__ import annotations

import pytest

from copus.core.layout import CandidateConfig
from copus.train.local import run_local
from copus.train.worker_plan import StopRule
from tests.train.loop_helpers import losses, small_plan, spawn
from tests.train.test_reconfigure import Scripted

pytestmark = pytest.mark.slow

# dp2 throughout; only dp_shard and recompute change.
KNOBS = {
    1: CandidateConfig(2, 1, 1, 2, 8, dp_shard="full"),
    2: CandidateConfig(2, 1, 1, 2, 8, dp_shard="optimizer", recompute="selective"),
    3: CandidateConfig(2, 1, 1, 2, 8, dp_shard="none", recompute="full"),
    4: CandidateConfig(2, 1, 1, 2, 8),
}


def _train_through(plan, root):
    return run_local(plan, root, decide=Scripted(KNOBS))[0]


def test_sharding_and_recomputation_change_in_place_and_train_as_one_process(token_cache, tmp_path):
    plan = small_plan(token_cache, dp=2, stop=StopRule(max_steps=6), checkpoint_every_steps=100, eval_every_steps=100)
    records = spawn(2, _train_through, plan, tmp_path / "knobs")[0]
    changes = [r for r in records if r["kind"] == "reconfigure"]
    assert [(r["step"], r["to"], r["in_place"]) for r in changes] == [(k, c.as_dict(), True) for k, c in KNOBS.items()]
    assert all("fell_back" not in r for r in changes)
    steps = {r["step"]: (r["dp_shard"], r["recompute"]) for r in records if r["kind"] == "step"}
    assert steps[2] == ("full", "none") and steps[3] == ("optimizer", "selective") and steps[4] == ("none", "full")

    reference = losses(run_local(plan.replaced(dp=1), tmp_path / "one")[0])
    got = losses(records)
    assert sorted(got) == list(range(1, 7))
    for step, loss in got.items():
        assert loss == pytest.approx(reference[step], rel=1e-4), step
