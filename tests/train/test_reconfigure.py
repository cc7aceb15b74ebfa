"""In-place reconfiguration on gloo ranks: the running processes change 3D layout (and MBS) at
step boundaries, and the next step's loss is the one a restart from checkpoint gives, which is
the one a single process gives. A failure in the in-place path leaves the old layout intact
and falls back to checkpoint-and-restart; memory stays flat over many changes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch.distributed as dist

from copus.core.layout import CandidateConfig
from copus.core.planner import change_kind
from copus.core.reconfiguration import SwitchOrder
from copus.train.data import replica_batch
from copus.train.faults import Faults
from copus.train.host import release_memory
from copus.train.local import run_local
from copus.train.replica import build_replica, make_optimizer, train_step
from copus.train.reshard_in_place import ReshardFailed, reshard_in_place
from copus.train.worker_plan import StopRule
from tests.train.loop_helpers import losses, small_plan, spawn

pytestmark = pytest.mark.slow

# From (2,2,2) MBS 2 through every layout of the issue on 8 ranks and back, at GBS 16.
CHAIN = {
    1: CandidateConfig(4, 2, 1, 2, 16),
    2: CandidateConfig(2, 1, 4, 2, 16),
    3: CandidateConfig(8, 1, 1, 1, 16),
    4: CandidateConfig(1, 1, 8, 2, 16),
    5: CandidateConfig(2, 2, 2, 4, 16),
}


class Scripted:
    """A stand-in for the controller: {step: CandidateConfig} ordered at that step boundary, the
    `way` given (picklable)."""

    def __init__(self, script: dict[int, CandidateConfig], way: str = "auto"):
        self.script, self.way = script, way

    def __call__(self, step: int, current: CandidateConfig) -> SwitchOrder | None:
        if step not in self.script:
            return None
        target = self.script[step]
        return SwitchOrder(
            config=target, change=change_kind(current, target), cost_s=0.0, reason="scripted", way=self.way
        )


def _in_place_then_restarts(plan, root: Path) -> dict:
    """Train through CHAIN in place (checkpointing every step); then, for each change at step
    k, restart from the step-k checkpoint in the target configuration and take step k + 1."""
    records, final, _ = run_local(plan, root / "in-place", decide=Scripted(CHAIN))
    restarted = {}
    for k, target in CHAIN.items():
        if dist.get_rank() == 0:
            shutil.copytree(root / "in-place" / f"step{k}", root / f"restart{k}" / f"step{k}")
        dist.barrier()
        again = plan.replaced(dp=target.dp, tp=target.tp, pp=target.pp, mbs=target.mbs, stop=StopRule(max_steps=k + 1))
        restarted[k + 1] = losses(run_local(again, root / f"restart{k}", resume_step=k)[0]).get(k + 1)
    return {"records": records, "final": final, "restarted": restarted}


def test_in_place_changes_on_8_ranks_continue_exactly_as_a_restart_would(token_cache, tmp_path):
    plan = small_plan(
        token_cache,
        model="debug-deep",
        gbs=16,
        mbs=2,
        dp=2,
        tp=2,
        pp=2,
        stop=StopRule(max_steps=7),
        checkpoint_every_steps=1,
        eval_every_steps=100,
    )
    out = spawn(8, _in_place_then_restarts, plan, tmp_path)[0]
    in_place = losses(out["records"])
    changes = [r for r in out["records"] if r["kind"] == "reconfigure"]
    assert [(r["step"], r["to"], r["in_place"]) for r in changes] == [(k, c.__dict__, True) for k, c in CHAIN.items()]
    assert all("fell_back" not in r for r in changes)
    for step, loss in out["restarted"].items():
        assert in_place[step] == pytest.approx(loss, rel=1e-4), step
    # (8,1,1) -> (1,1,8): every rank already holds its new stage, nothing crosses the wire.
    assert [r["reshard"]["bytes_moved"] == 0 for r in changes] == [False, False, False, True, False]
    # The same numbers as one process (the layout never changes the mathematics).
    reference, _, _ = run_local(plan.replaced(dp=1, tp=1, pp=1, checkpoint_every_steps=100), tmp_path / "ref")
    for step, loss in losses(reference).items():
        assert in_place[step] == pytest.approx(loss, rel=1e-4), step
    assert out["final"]["samples"] == 7 * 16
    assert out["final"]["layout"] == {"dp": 2, "tp": 2, "pp": 2, "dp_shard": "none", "recompute": "none"}
    assert out["final"]["mbs"] == 4


def _fail_then_resume(plan, root: Path) -> dict:
    to_pipeline = Scripted({2: CandidateConfig(1, 1, 2, 2, 8)})
    _, final, _ = run_local(plan, root / "auto", decide=to_pipeline, faults=Faults(fail_reshard=True))
    strictly = Scripted(to_pipeline.script, way="in_place")
    try:
        run_local(plan, root / "strict", decide=strictly, faults=Faults(fail_reshard=True))
        strict = "no error"
    except ReshardFailed as err:
        strict = str(err)
    # What the driver does after the fallback: relaunch in the target layout from the checkpoint.
    target = plan.replaced(dp=1, pp=2, stop=StopRule(max_steps=4))
    records, _, _ = run_local(target, root / "auto", resume_step=final["step"])
    return {"final": final, "strict": strict, "resumed": losses(records)}


def test_a_failed_in_place_change_falls_back_to_a_restart_with_the_old_state_intact(token_cache, tmp_path):
    plan = small_plan(token_cache, gbs=8, mbs=2, dp=2, stop=StopRule(max_steps=4), checkpoint_every_steps=100)
    out = spawn(2, _fail_then_resume, plan, tmp_path)[0]
    assert out["final"]["stop_reason"] == "reconfigure" and out["final"]["step"] == 2
    assert out["final"]["reconfigure"] == {**CandidateConfig(1, 1, 2, 2, 8).as_dict(), "fell_back": True}
    assert "InjectedReshardFault" in out["strict"]  # reconfigure: in_place does not fall back
    reference, _, _ = run_local(plan.replaced(dp=1), tmp_path / "ref")
    for step in (3, 4):
        assert out["resumed"][step] == pytest.approx(losses(reference)[step], rel=1e-4)


CYCLE = [(2, 1, 2), (1, 2, 2), (4, 1, 1), (2, 2, 1), (1, 1, 4)]


def _memory_over_changes(plan, changes: int) -> list[dict]:
    """Train a few steps, then change layout in place (cycling through CYCLE) with a step after
    each change; each change's memory figures, taken while both layouts' states are alive (the
    change's peak)."""
    model, optimizer, stream = build_replica(plan)
    current, seen = plan, []
    for i in range(changes + 1):
        for _ in range(5 if i == 0 else 1):  # a run changes layout only after some training
            batch = replica_batch(stream.next_global_batch(plan.gbs), model.dp_rank, current.dp, plan.mbs)
            inputs, targets = stream.windows.batch(batch.sample_indices)
            train_step(model, optimizer, inputs, targets, plan.mbs, 1e-3, 1.0)
        if i == changes:
            break
        dp, tp, pp = CYCLE[(i + 1) % len(CYCLE)]
        model, optimizer, stats = reshard_in_place(
            model,
            optimizer,
            current,
            CandidateConfig(dp, tp, pp, plan.mbs, plan.gbs),
            lambda m: make_optimizer(m, plan.optimizer, 1e-3),
        )
        current = current.replaced(dp=dp, tp=tp, pp=pp)
        release_memory(model.device)  # as the training loop does after a change
        seen.append(stats)
    return seen


def test_memory_stays_flat_over_20_in_place_changes(token_cache):
    plan = small_plan(token_cache, model="tiny", seq_len=64, gbs=16, mbs=2, dp=2, tp=1, pp=2)
    for rank, seen in enumerate(spawn(4, _memory_over_changes, plan, 20)):
        # Each change against the first change between the same two layouts (what a rank holds
        # differs between layouts), and the process's peak against its peak after one cycle.
        for k, s in enumerate(seen):
            first = seen[k % len(CYCLE)]
            assert s["rss_bytes"] <= 1.10 * first["rss_bytes"], (rank, k, [x["rss_bytes"] for x in seen])
            if "heap_in_use_bytes" in s:  # glibc: what malloc has handed out, the leak detector (a
                # leaked layout would add its whole state, several MiB, at every change)
                assert s["heap_in_use_bytes"] <= 1.05 * first["heap_in_use_bytes"], (rank, k, seen)
        assert seen[-1]["peak_rss_bytes"] <= 1.10 * seen[len(CYCLE) - 1]["peak_rss_bytes"], (rank, seen)
