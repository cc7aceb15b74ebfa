"""Every 3D layout trains the same model to the same numbers as one process, and a
checkpoint written in one layout continues in any other (gloo, CPU, fp32)."""

from __future__ import annotations

import pytest
import torch

from copus.train.local import run_local
from copus.train.worker_plan import StopRule
from tests.train.loop_helpers import RunsByWorld, losses, run_distributed_each, small_plan

pytestmark = pytest.mark.slow

LAYOUTS = [(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 2, 1), (2, 1, 2), (1, 2, 2), (2, 2, 2)]
SHAPES = {0: (16, 2), 1: (8, 2), 2: (24, 4), 3: (16, 1)}  # m = 4, 2, 3, 8 per replica, always >= pp

# Every layout with 1F1B; GPipe on the plain pipeline and on the full 3D layout (the schedule
# is independent of dp and tp, which the 1F1B cases cover).
CASES = [(layout, "1f1b") for layout in LAYOUTS] + [((1, 1, 2), "gpipe"), ((2, 2, 2), "gpipe")]

RESHARD = [
    ((2, 2, 2), 2, (1, 1, 1), 4),
    ((1, 1, 1), 2, (2, 2, 2), 1),
    ((1, 2, 1), 4, (1, 1, 2), 2),
    ((2, 1, 2), 2, (1, 2, 2), 8),
    ((4, 1, 1), 1, (2, 2, 1), 4),
]


@pytest.fixture(scope="module")
def reference(token_cache, tmp_path_factory):
    """Single process, no process group: GBS 16 from micro-batches of 2 (m = 8)."""
    plan = small_plan(token_cache, gbs=16, mbs=2, stop=StopRule(max_steps=3))
    records, _, params = run_local(plan, tmp_path_factory.mktemp("ref"))
    return plan, records, params


@pytest.fixture(scope="module")
def runs(reference, tmp_path_factory) -> RunsByWorld:
    """Every distributed run of this module, by what it is for; each run its own checkpoint
    root, a resume its source's."""
    plan, root = reference[0], tmp_path_factory.mktemp("runs")
    runs, ckpt = RunsByWorld(run_distributed_each), {}

    def add(key, run_plan, source=None, resume_step=None, shapes=None):
        ckpt[key] = ckpt[source] if source is not None else root / str(len(ckpt))
        world = run_plan.dp * run_plan.tp * run_plan.pp
        runs.add(key, world, (run_plan, ckpt[key], resume_step, shapes), source)

    for (dp, tp, pp), schedule in CASES:
        add(("layout", dp, tp, pp, schedule), plan.replaced(dp=dp, tp=tp, pp=pp, pp_schedule=schedule))
    add("sharded", plan.replaced(dp=2, dp_shard="full", recompute="selective"))
    shapes = plan.replaced(stop=StopRule(max_steps=4), eval_every_steps=4)
    add("shapes-reference", shapes, shapes=SHAPES)
    add("shapes", shapes.replaced(dp=2, pp=2), shapes=SHAPES)
    for i, ((d0, t0, p0), mbs0, (d1, t1, p1), mbs1) in enumerate(RESHARD):
        first = plan.replaced(dp=d0, tp=t0, pp=p0, mbs=mbs0, stop=StopRule(max_steps=2), checkpoint_every_steps=2)
        add(("reshard-before", i), first)
        add(("reshard-after", i), plan.replaced(dp=d1, tp=t1, pp=p1, mbs=mbs1), ("reshard-before", i), 2)
    return runs


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


@pytest.mark.parametrize("layout,schedule", CASES, ids=[f"dp{d}-tp{t}-pp{p}-{s}" for (d, t, p), s in CASES])
def test_layout_matches_single_process(reference, runs, layout, schedule):
    _, ref_records, ref_params = reference
    # m = 16 / (dp x 2) micro-batches per replica: 4 or 8, always more than pp.
    records, final, params = runs[("layout", *layout, schedule)]
    _assert_matches(ref_records, ref_params, records, params)
    assert final["samples"] == 48


def test_the_loop_trains_sharded_and_recomputing_to_the_same_numbers(reference, runs):
    """dp_shard and recompute reach the engine from the plan (tests/parallel/test_sharding.py
    covers every mode and its composition with tp and pp at the engine level)."""
    _, ref_records, ref_params = reference
    records, final, params = runs["sharded"]
    _assert_matches(ref_records, ref_params, records, params)
    assert final["samples"] == 48


@pytest.mark.parametrize("case", range(len(RESHARD)), ids=[f"{b}mbs{mb}->{a}mbs{ma}" for b, mb, a, ma in RESHARD])
def test_checkpoint_reshards_across_layouts(reference, runs, case):
    plan, ref_records, ref_params = reference
    assert runs[("reshard-before", case)][1]["step"] == 2
    records, final, params = runs[("reshard-after", case)]
    ref, got = losses(ref_records), losses(records)
    assert sorted(got) == [3]  # resumed at step 2, the next step's loss matches
    assert got[3] == pytest.approx(ref[3], rel=1e-4)
    for name, value in ref_params.items():  # model and AdamW state both moved
        torch.testing.assert_close(params[name], value, rtol=1e-3, atol=1e-6, msg=name)
    assert final["data"] == {"samples_consumed": 48, "seed": plan.seed, "num_samples": final["data"]["num_samples"]}


def test_batch_shape_changes_between_steps_within_a_layout(runs):
    """GBS and MBS change at step boundaries (no restart): (2,1,2) equals one process
    following the same sequence of batch shapes."""
    ref_records, _, ref_params = runs["shapes-reference"]
    records, final, params = runs["shapes"]
    _assert_matches(ref_records, ref_params, records, params)
    assert final["samples"] == sum(g for g, _ in SHAPES.values())
    assert [r["gbs"] for r in records if r["kind"] == "step"] == [16, 8, 24, 16]
