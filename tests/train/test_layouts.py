"""Every 3D layout trains the same model to the same numbers as one process, and a
checkpoint written in one layout continues in any other (gloo, CPU, fp32)."""

from __future__ import annotations

import pytest
import torch

from copus.train.local import run_local
from copus.train.plan import StopRule
from tests.train.loop_helpers import losses, run_distributed, small_plan

pytestmark = pytest.mark.slow

LAYOUTS = [(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 2, 1), (2, 1, 2), (1, 2, 2), (2, 2, 2)]


@pytest.fixture(scope="module")
def reference(token_cache, tmp_path_factory):
    """Single process, no process group: GBS 16 from micro-batches of 2 (m = 8)."""
    plan = small_plan(token_cache, gbs=16, mbs=2, stop=StopRule(max_steps=3))
    records, _, params = run_local(plan, tmp_path_factory.mktemp("ref"))
    return plan, records, params


def _assert_matches(reference_records, reference_params, records, params):
    ref, got = losses(reference_records), losses(records)
    assert sorted(got) == sorted(ref)
    for step in ref:
        assert got[step] == pytest.approx(ref[step], rel=1e-4), step
    ref_val, got_val = losses(reference_records, "eval", "val_loss"), losses(records, "eval", "val_loss")
    for step in ref_val:
        assert got_val[step] == pytest.approx(ref_val[step], rel=1e-4), step
    assert set(params) == set(reference_params)  # every stage's and shard's parameters came back
    for name, value in reference_params.items():
        torch.testing.assert_close(params[name], value, rtol=1e-3, atol=1e-6, msg=name)


# Every layout with 1F1B; GPipe on the plain pipeline and on the full 3D layout (the schedule
# is independent of dp and tp, which the 1F1B cases cover).
CASES = [(layout, "1f1b") for layout in LAYOUTS] + [((1, 1, 2), "gpipe"), ((2, 2, 2), "gpipe")]


@pytest.mark.parametrize("layout,schedule", CASES, ids=[f"dp{d}-tp{t}-pp{p}-{s}" for (d, t, p), s in CASES])
def test_layout_matches_single_process(reference, tmp_path, layout, schedule):
    dp, tp, pp = layout
    plan, ref_records, ref_params = reference
    # m = 16 / (dp x 2) micro-batches per replica: 4 or 8, always more than pp.
    records, final, params = run_distributed(
        dp * tp * pp, plan.replaced(dp=dp, tp=tp, pp=pp, pp_schedule=schedule), tmp_path, tmp_path / "ckpt"
    )
    _assert_matches(ref_records, ref_params, records, params)
    assert final["samples"] == 48


def test_the_loop_trains_sharded_and_recomputing_to_the_same_numbers(reference, tmp_path):
    """dp_shard and recompute reach the engine from the plan (tests/parallel/test_sharding.py
    covers every mode and its composition with tp and pp at the engine level)."""
    plan, ref_records, ref_params = reference
    sharded = plan.replaced(dp=2, dp_shard="full", recompute="selective")
    records, final, params = run_distributed(2, sharded, tmp_path, tmp_path / "ckpt")
    _assert_matches(ref_records, ref_params, records, params)
    assert final["samples"] == 48


RESHARD = [
    ((2, 2, 2), 2, (1, 1, 1), 4),
    ((1, 1, 1), 2, (2, 2, 2), 1),
    ((1, 2, 1), 4, (1, 1, 2), 2),
    ((2, 1, 2), 2, (1, 2, 2), 8),
    ((4, 1, 1), 1, (2, 2, 1), 4),
]


@pytest.mark.parametrize(
    "before,mbs_before,after,mbs_after", RESHARD, ids=[f"{b}mbs{mb}->{a}mbs{ma}" for b, mb, a, ma in RESHARD]
)
def test_checkpoint_reshards_across_layouts(reference, tmp_path, before, mbs_before, after, mbs_after):
    plan, ref_records, ref_params = reference
    ckpt = tmp_path / "ckpt"
    first = plan.replaced(
        dp=before[0],
        tp=before[1],
        pp=before[2],
        mbs=mbs_before,
        stop=StopRule(max_steps=2),
        checkpoint_every_steps=2,
    )
    run_distributed(first.dp * first.tp * first.pp, first, tmp_path, ckpt)
    second = plan.replaced(dp=after[0], tp=after[1], pp=after[2], mbs=mbs_after)
    records, final, params = run_distributed(second.dp * second.tp * second.pp, second, tmp_path, ckpt, resume_step=2)
    ref, got = losses(ref_records), losses(records)
    assert sorted(got) == [3]  # resumed at step 2, the next step's loss matches
    assert got[3] == pytest.approx(ref[3], rel=1e-4)
    for name, value in ref_params.items():  # model and AdamW state both moved
        torch.testing.assert_close(params[name], value, rtol=1e-3, atol=1e-6, msg=name)
    assert final["data"] == {"samples_consumed": 48, "seed": plan.seed, "num_samples": final["data"]["num_samples"]}


def test_batch_shape_changes_between_steps_within_a_layout(token_cache, tmp_path):
    """GBS and MBS change at step boundaries (no restart): (2,1,2) equals one process
    following the same sequence of batch shapes."""
    shapes = {0: (16, 2), 1: (8, 2), 2: (24, 4), 3: (16, 1)}  # m = 4, 2, 3, 8 per replica, always >= pp

    plan = small_plan(token_cache, gbs=16, mbs=2, stop=StopRule(max_steps=4), eval_every_steps=4)
    ref_records, _, ref_params = run_distributed(1, plan, tmp_path, tmp_path / "ref", shapes=shapes)
    records, final, params = run_distributed(4, plan.replaced(dp=2, pp=2), tmp_path, tmp_path / "ck", shapes=shapes)
    _assert_matches(ref_records, ref_params, records, params)
    assert final["samples"] == sum(g for g, _ in shapes.values())
    assert [r["gbs"] for r in records if r["kind"] == "step"] == [16, 8, 24, 16]
