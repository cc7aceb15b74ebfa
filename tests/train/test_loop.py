"""The training loop without Ray: exact resume, and data parallelism with gradient
accumulation equal to the single-process reference."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from copus.train.plan import StopRule
from tests.train.loop_helpers import losses, run_distributed, run_local, small_plan


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
    plan = replace(reference, dp=2, mbs=mbs)
    dp_records, dp_final, dp_params = run_distributed(2, plan, tmp_path, tmp_path / "dp")
    ref, got = losses(ref_records), losses(dp_records)
    for step in ref:
        assert _close(got[step], ref[step], 1e-4), (step, got[step], ref[step])
    for name, value in ref_params.items():
        torch.testing.assert_close(dp_params[name], value, rtol=1e-3, atol=1e-5)
    assert _close(losses(dp_records, "eval", "val_loss")[4], losses(ref_records, "eval", "val_loss")[4], 1e-4)
