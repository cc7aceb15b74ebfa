"""A ramp run (`policy.name: ramp`) in the loop, without Ray: the GBS follows the schedule by
samples seen, each change is a reconfigure record, the LR rule applies at each GBS, and a run
resumed from a mid-ramp checkpoint continues the ramp exactly."""

from __future__ import annotations

import math

import torch

from copus.core.ramp import BatchRamp
from copus.train.worker_plan import StopRule
from tests.train.loop_helpers import losses, run_local, small_plan

# GBS 4 to 16 by 4 over 24 samples: 8, 12 and 16 from 8, 16 and 24 samples on (dp 1, mbs 2).
RAMP = BatchRamp.linear(4, 4, 24, 16)
# Steps start at 0, 4, 8, 16, 28, 44, 60, 76 samples: GBS 4, 4, 8, 12, 16, 16, 16, 16.
EXPECTED_GBS = {1: 4, 2: 4, 3: 8, 4: 12, 5: 16, 6: 16, 7: 16, 8: 16}
# (steps done, samples seen, from GBS, to GBS) of each change: at the first boundary at or past
# its scheduled sample count.
EXPECTED_CHANGES = [(2, 8, 4, 8), (3, 16, 8, 12), (4, 28, 12, 16)]


def _ramp_plan(token_cache, **changes):
    return small_plan(token_cache, gbs=RAMP.start_gbs, ramp=RAMP, stop=StopRule(max_steps=8), **changes)


def _changes(records: list[dict]) -> list[tuple[int, int, int, int]]:
    """(step, samples, from GBS, to GBS) of each reconfigure record, or of each entry of a final
    state's reconfigurations list."""
    return [
        (r["step"], r["samples"], r["from"]["gbs"], r["to"]["gbs"])
        for r in records
        if r.get("kind", "reconfigure") == "reconfigure"
    ]


def test_the_gbs_follows_the_ramp_with_a_reconfigure_record_per_change_and_the_lr_rule_at_each_gbs(
    token_cache, tmp_path
):
    plan = _ramp_plan(token_cache)
    records, final, _ = run_local(plan, tmp_path / "ckpt")
    steps = [r for r in records if r["kind"] == "step"]
    assert {r["step"]: r["gbs"] for r in steps} == EXPECTED_GBS
    assert all(r["microbatches"] == r["gbs"] // plan.mbs and r["mbs"] == plan.mbs for r in steps)
    assert _changes(records) == EXPECTED_CHANGES
    for change in (r for r in records if r["kind"] == "reconfigure"):
        assert change["in_place"] and change["change"] == "gbs"
        assert change["reason"] == f"ramp: {change['samples']} samples seen, schedule says GBS {change['to']['gbs']}"
        assert {k: v for k, v in change["to"].items() if k != "gbs"} == {
            k: v for k, v in change["from"].items() if k != "gbs"
        }  # the layout and MBS stay
    # The workers' own list (checkpoints, the end record: what summary.json falls back on).
    assert _changes(final["reconfigurations"]) == EXPECTED_CHANGES
    assert final["samples"] == sum(EXPECTED_GBS.values()) == 92 and final["gbs"] == 16
    # The experiment's LR rule at each GBS: sqrt(gbs / reference_gbs), warm-up over 16 samples.
    for r in steps:
        before = r["samples"] - r["gbs"]
        warmup = min(1.0, (before + 1) / 16) if before < 16 else 1.0
        assert math.isclose(r["lr"], 3e-3 * math.sqrt(r["gbs"] / 8) * warmup, rel_tol=1e-12), r
        assert r["lr"] == plan.lr.lr(before, r["gbs"])


def test_a_run_resumed_mid_ramp_continues_at_the_scheduled_gbs_with_the_same_losses(token_cache, tmp_path):
    plan = _ramp_plan(token_cache)
    ref_records, ref_final, ref_params = run_local(plan, tmp_path / "ref")
    # Interrupted after step 3 (16 samples at GBS 8; the schedule says 12 from here), then resumed
    # by a fresh group whose plan starts at the ramp's first GBS, as a relaunch's does.
    run_local(plan.replaced(stop=StopRule(max_steps=3)), tmp_path / "cut")
    res_records, res_final, res_params = run_local(plan, tmp_path / "cut", resume_step=3)
    assert {r["step"]: r["gbs"] for r in res_records if r["kind"] == "step"} == {
        s: g for s, g in EXPECTED_GBS.items() if s > 3
    }
    assert _changes(res_records) == EXPECTED_CHANGES[1:]
    ref, res = losses(ref_records), losses(res_records)
    for step in range(4, 9):
        assert math.isclose(res[step], ref[step], rel_tol=1e-6), (step, res[step], ref[step])
    assert res_final["samples"] == ref_final["samples"] and res_final["data"] == ref_final["data"]
    assert _changes(res_final["reconfigurations"]) == _changes(ref_final["reconfigurations"]) == EXPECTED_CHANGES
    for name, value in ref_params.items():
        torch.testing.assert_close(res_params[name], value, rtol=1e-6, atol=1e-7)


def test_a_table_ramp_and_a_plain_plan_train_the_same_when_the_table_holds_one_gbs(token_cache, tmp_path):
    """A one-entry table is a fixed GBS: no change, the same losses as a run without a ramp."""
    plan = small_plan(token_cache, stop=StopRule(max_steps=4))
    plain, _, _ = run_local(plan, tmp_path / "plain")
    ramped, _, _ = run_local(plan.replaced(ramp=BatchRamp.from_table([[0, plan.gbs]])), tmp_path / "table")
    assert _changes(ramped) == [] and losses(ramped) == losses(plain)
