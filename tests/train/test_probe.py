"""A probe (copus.train.probe) continues the run from its branch checkpoint: at the run's own
GBS it reproduces the run's losses step for step (same weights, optimiser state, data order and
LR rule); at another GBS it reads the same samples in the same order. The controller's branch
request makes every rank checkpoint at that step boundary, with no change of configuration."""

from __future__ import annotations

import pytest

from copus.core.reconfiguration import BranchRequest
from copus.train.local import run_local, run_on_gloo_ranks
from copus.train.probe import run_probe
from copus.train.worker_plan import StopRule
from tests.train.loop_helpers import small_plan


def _steps(records: list[dict]) -> list[dict]:
    return [r for r in records if r["kind"] == "step"]


def test_a_probe_at_the_runs_gbs_reproduces_the_run_and_at_another_reads_the_same_samples(tmp_path):
    plan = small_plan(tmp_path / "cache", stop=StopRule(max_steps=9))
    records, _, _ = run_local(plan, tmp_path / "ckpt")
    run = {r["samples"]: r["train_loss"] for r in _steps(records)}

    same = run_probe(plan, tmp_path / "ckpt" / "step3", gbs=8, samples=48)
    assert same["start_samples"] == 24 and same["samples"] == [32, 40, 48, 56, 64, 72]
    assert same["train_loss"] == pytest.approx([run[s] for s in same["samples"]], rel=1e-5)

    larger = run_probe(plan, tmp_path / "ckpt" / "step3", gbs=16, samples=48)
    assert larger["samples"] == [40, 56, 72] and larger["mbs"] == 16
    # Its first step's batch is the run's steps 4 and 5 (samples 24-39): the loss at the branch
    # weights over those 16 samples, the mean of the run's step-4 loss (same weights) and of a
    # step it never took, so it only agrees in size; the curve goes down from there.
    assert abs(larger["train_loss"][0] - run[32]) < 0.5
    assert larger["train_loss"][-1] < larger["train_loss"][0]


def _branch_at_step_2(step, current):
    return BranchRequest("probe at GBS 16") if step == 2 else None


def _run_with_branch_request(plan, root):
    return run_local(plan, root, decide=_branch_at_step_2)


def test_a_branch_request_checkpoints_every_rank_at_that_boundary_and_changes_nothing(tmp_path):
    plan = small_plan(tmp_path / "cache", stop=StopRule(max_steps=4), checkpoint_every_steps=100)
    plan = plan.replaced(dp=2, gbs=8, mbs=2)
    ranks = run_on_gloo_ranks(2, _run_with_branch_request, plan, tmp_path / "ckpt")
    records = ranks[0][0]
    branches = [r for r in records if r["kind"] == "checkpoint" and r.get("branch")]
    assert [(r["step"], r["samples"]) for r in branches] == [(2, 16)]
    assert (tmp_path / "ckpt" / "step2").is_dir()
    assert {(r["gbs"], r["mbs"]) for r in _steps(records)} == {(8, 2)}
    assert not [r for r in records if r["kind"] == "reconfigure"]
