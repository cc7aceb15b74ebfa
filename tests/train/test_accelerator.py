"""One process may train several runs with different precision settings (accelerate keeps
process-wide state that would otherwise refuse the second)."""

from __future__ import annotations

from dataclasses import replace

from copus.train.local import run_local
from copus.train.worker_plan import StopRule
from tests.train.loop_helpers import small_plan


def test_runs_with_different_mixed_precision_in_one_process(token_cache, tmp_path):
    plan = small_plan(token_cache, stop=StopRule(max_steps=2))
    _, fp32, _ = run_local(plan, tmp_path / "a")
    _, bf16, _ = run_local(replace(plan, mixed_precision="bf16"), tmp_path / "b")
    assert fp32["step"] == bf16["step"] == 2
    # bf16 autocast changes the numbers a little, not the training.
    assert abs(fp32["last_val_loss"] - bf16["last_val_loss"]) < 0.05
