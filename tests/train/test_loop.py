"""The training loop without Ray: exact resume, data parallelism with gradient accumulation
equal to the single-process reference, and non-finite steps skipped without harm."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from copus.train.faults import Faults
from copus.train.loop import NonFiniteLossError
from copus.train.worker_plan import StopRule
from tests.train.loop_helpers import losses, run_distributed, run_local, shapes_hook, small_plan


def _close(a: float, b: float, rel: float) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-12)


def test_training_lowers_the_loss_and_reports_every_step(token_cache, tmp_path):
    plan = small_plan(token_cache, stop=StopRule(max_steps=12), eval_every_steps=6)
    records, final, _ = run_local(plan, tmp_path / "ckpt")
    steps = losses(records)
    assert sorted(steps) == list(range(1, 13))
    vals = losses(records, "eval", "val_loss")
    assert sorted(vals) == [0, 6, 12]
    assert vals[12] < vals[0] - 0.5  # from ln(256) = 5.55 towards byte statistics
    assert final["step"] == 12 and final["samples"] == 96 and final["stop_reason"] == "max_steps"
    step = next(r for r in records if r["kind"] == "step")
    for key in ("samples_per_s", "tokens_per_s", "step_time_s", "lr", "gbs", "mbs", "samples", "wall_clock_s"):
        assert key in step


def test_resume_from_checkpoint_continues_exactly(token_cache, tmp_path):
    plan = small_plan(token_cache)
    ref_records, ref_final, ref_params = run_local(plan, tmp_path / "ref")
    # Interrupted: stop at step 3 (a checkpoint), then resume in a fresh model to step 6.
    run_local(replace(plan, stop=StopRule(max_steps=3)), tmp_path / "cut")
    res_records, res_final, res_params = run_local(plan, tmp_path / "cut", resume_step=3)
    ref, res = losses(ref_records), losses(res_records)
    assert sorted(res) == [4, 5, 6]
    for step in (4, 5, 6):
        assert _close(res[step], ref[step], 1e-6), (step, res[step], ref[step])
    assert res_final["samples"] == ref_final["samples"] == 48
    assert res_final["data"] == ref_final["data"]
    for name, value in ref_params.items():
        torch.testing.assert_close(res_params[name], value, rtol=1e-6, atol=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("mbs", [1, 4])
def test_two_data_parallel_workers_match_one_process(token_cache, tmp_path, mbs):
    """dp=2 with m = 8 / (2 x mbs) micro-batches equals one process taking the whole batch."""
    reference = small_plan(token_cache, mbs=8, stop=StopRule(max_steps=4))
    ref_records, _, ref_params = run_local(reference, tmp_path / "ref")
    plan = reference.replaced(dp=2, mbs=mbs)
    dp_records, dp_final, dp_params = run_distributed(2, plan, tmp_path, tmp_path / "dp")
    ref, got = losses(ref_records), losses(dp_records)
    for step in ref:
        assert _close(got[step], ref[step], 1e-4), (step, got[step], ref[step])
    for name, value in ref_params.items():
        torch.testing.assert_close(dp_params[name], value, rtol=1e-3, atol=1e-5)
    assert _close(losses(dp_records, "eval", "val_loss")[4], losses(ref_records, "eval", "val_loss")[4], 1e-4)


def test_a_non_finite_step_is_skipped_counted_and_leaves_weights_and_gns_alone(token_cache, tmp_path):
    plan = small_plan(token_cache, stop=StopRule(max_steps=3), checkpoint_every_steps=100)
    skipped_records, skipped, skipped_params = run_local(
        plan, tmp_path / "a", faults=Faults(poison_steps=frozenset({3}))
    )
    _, two, two_params = run_local(replace(plan, stop=StopRule(max_steps=2)), tmp_path / "b")
    assert [r["step"] for r in skipped_records if r["kind"] == "nonfinite"] == [3]
    assert (
        skipped["nonfinite_steps"] == 1
        and skipped["skipped_samples"] == plan.gbs
        and skipped["samples"] == 3 * plan.gbs
    )
    for name, value in two_params.items():  # step 3 changed nothing
        torch.testing.assert_close(skipped_params[name], value, rtol=0, atol=0, msg=name)
    assert skipped["gns"] == two["gns"]


def test_repeated_non_finite_steps_stop_with_a_usable_checkpoint(token_cache, tmp_path):
    plan = small_plan(token_cache, stop=StopRule(max_steps=8, max_nonfinite_steps=2), checkpoint_every_steps=100)
    with pytest.raises(
        NonFiniteLossError, match=r"stop.max_nonfinite_steps: 3 consecutive steps .* checkpoint at step 5"
    ):
        run_local(plan, tmp_path / "ck", faults=Faults(poison_steps=frozenset({3, 4, 5})))
    records, final, _ = run_local(plan, tmp_path / "ck", resume_step=5)
    assert final["step"] == 8 and all(math.isfinite(r["train_loss"]) for r in records if r["kind"] == "step")


def test_a_restarted_group_resumes_in_the_configuration_its_checkpoint_was_written_in(token_cache):
    from copus.train.loop import resume_plan

    plan = small_plan(token_cache, dp=1, pp=2, gbs=8, mbs=2)  # the launch's plan
    reached = {"layout": {"dp": 2, "tp": 1, "pp": 1}, "gbs": 16, "mbs": 4, "reconfigure": None}
    moved = resume_plan(plan, reached, world=2)  # Ray Train restarted a group after in-place changes
    assert (moved.dp, moved.tp, moved.pp, moved.gbs, moved.mbs) == (2, 1, 1, 16, 4)
    handover = {**reached, "reconfigure": {"dp": 1, "tp": 1, "pp": 2, "mbs": 2, "gbs": 8}}
    assert resume_plan(plan, handover, world=2) == plan  # the driver relaunched into the plan's layout
    assert resume_plan(plan, reached, world=4) == plan  # another world size: the driver chose the layout
    assert resume_plan(plan, {"step": 3}, world=2) == plan  # an older checkpoint without a layout


def test_checkpoints_also_follow_the_wall_clock(token_cache, tmp_path):
    plan = small_plan(token_cache, stop=StopRule(max_steps=3), checkpoint_every_steps=100, checkpoint_every_s=1e-6)
    run_local(plan, tmp_path / "ck")
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["step1", "step2", "step3"]


def test_evaluation_and_checkpoints_follow_a_cadence_in_samples(token_cache, tmp_path):
    """eval.every_samples / checkpoint.every_samples: the same data between evaluations at any
    GBS, across a GBS change; the validation time is counted and taken out of time to target."""
    plan = small_plan(token_cache, stop=StopRule(max_steps=8), eval_every_samples=24, checkpoint_every_samples=48)
    records, final, _ = run_local(plan, tmp_path / "ck", batch_size=shapes_hook({4: (16, 2)}))
    # Steps of 8 samples to 32, then of 16: 48, 64, 80, 96. Due where a multiple is reached or crossed.
    assert [r["samples"] for r in records if r["kind"] == "eval"] == [0, 24, 48, 80, 96]
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["step5", "step8"]
    assert final["eval_time_s"] == pytest.approx(sum(r["eval_time_s"] for r in records if r["kind"] == "eval"))
    reached, _, _ = run_local(plan.replaced(stop=StopRule(max_steps=8, target_val_loss=100.0)), tmp_path / "t")
    end = [r for r in reached if r["kind"] == "end"][-1]
    assert end["time_to_target_without_eval_s"] == pytest.approx(end["time_to_target_s"] - end["eval_time_s"])
    assert 0 < end["time_to_target_without_eval_s"] < end["time_to_target_s"]
