"""The GNS probe under 3D parallelism: accurate against per-example gradients, and the same
whatever the layout or micro-batch size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.func import functional_call, grad, vmap

from copus.config import config_from_mapping
from copus.train.checkpoint import load_checkpoint
from copus.train.gns import measure_gns
from copus.train.local import run_local
from copus.train.parallel_model import token_loss
from copus.train.replica import build_replica, estimator_of
from copus.train.worker_plan import StopRule, plan_from_config
from tests.train.loop_helpers import small_plan, spawn

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(token_cache, tmp_path_factory):
    """The debug model after 30 steps (the gradient is no longer dominated by its init mean)."""
    plan = small_plan(token_cache, gbs=16, mbs=4, stop=StopRule(max_steps=30), checkpoint_every_steps=30)
    root = tmp_path_factory.mktemp("gns-ckpt")
    run_local(plan, root)
    return plan, root / "step30"


def brute_force_b_noise(plan, checkpoint: Path, steps: int) -> float:
    """tr(Σ)/|G|² from exact per-example gradients of the samples that `steps` global batches
    of plan.gbs from the checkpoint's data position hold, the ones measure_gns sees (the
    unbiased forms: sample covariance, and |mean|² less tr(Σ)/n)."""
    model, optimizer, stream = build_replica(plan)
    saved = load_checkpoint(checkpoint, model.module, optimizer, 0)
    stream.load_state_dict(saved["data"])
    module = model.module
    params = {k: v.detach() for k, v in module.named_parameters()}

    def loss_of_one(p, x, y):
        return token_loss(functional_call(module, p, (x.unsqueeze(0),)), y.unsqueeze(0))

    indices = np.concatenate([stream.next_global_batch(plan.gbs) for _ in range(steps)])
    n, total, sq_sum = len(indices), 0.0, 0.0
    for chunk in np.array_split(indices, n // 128):
        x, y = stream.windows.batch(chunk)
        g = vmap(grad(loss_of_one), in_dims=(None, 0, 0))(params, x, y)
        g = torch.cat([v.reshape(len(chunk), -1) for v in g.values()], dim=1).double()
        total, sq_sum = total + g.sum(0), sq_sum + float((g * g).sum())
    mean = total / n
    tr_sigma = (sq_sum - n * float(mean @ mean)) / (n - 1)
    grad_sqr = float(mean @ mean) - tr_sigma / n
    return tr_sigma / grad_sqr


def test_estimate_is_within_15_percent_of_per_example_brute_force(trained):
    # The reference is computed from the very samples the probe measures (300 global batches of
    # 32), so the data's own sampling noise, which is no property of the probe, is common to
    # both. What is left is the two-batch estimator's noise: on a 600-step pilot run from this
    # checkpoint, log(measured / reference) over 300 steps had a standard deviation of 3.5-5%
    # (disjoint 100-step windows, jackknife over blocks), so 15% is 3 or more of them. (The
    # former reference, 2048 random samples, had a relative SE near 8% on its own: 15% was
    # then about 1.6 standard deviations of the difference.)
    plan, ckpt = trained
    measured_plan = plan.replaced(gbs=32, mbs=8)
    truth = brute_force_b_noise(measured_plan, ckpt, steps=300)
    measured = measure_gns(measured_plan, steps=300, resume_from=ckpt)
    assert measured["steps"] == 300 and measured["skipped_nonfinite"] == 0
    assert measured["b_noise"] == pytest.approx(truth, rel=0.15), (measured, truth)


def _measure_each(jobs: list[tuple]) -> list[dict]:
    """measure_gns(plan, steps, checkpoint) for each job, on the same ranks."""
    return [measure_gns(*job) for job in jobs]


# GBS 32: with dp = 1 the small batch is a micro-batch (B_small = MBS), with dp = 2 a replica's
# half of the batch (B_small = 16, whatever the MBS).
# (tp alone is covered by (2,2,2) against (2,1,1): sharding over tp and pp together changes nothing.)
EXACT_STEPS = 20  # the same numbers step by step: a few steps show any difference
NOISE_STEPS = 200
SHARDED = {(1, 1, 2, 16): (1, 1, 1, 16), (2, 1, 1, 4): (2, 1, 1, 16), (2, 2, 2, 4): (2, 1, 1, 16)}  # -> equal to


def test_estimate_is_the_same_across_layouts_and_micro_batch_sizes(trained):
    plan, ckpt = trained
    keys = {(*layout, EXACT_STEPS) for layout in [*SHARDED, *SHARDED.values()]}
    keys |= {(*layout, NOISE_STEPS) for layout in [(1, 1, 1, 16), (1, 1, 1, 8), (2, 1, 1, 16)]}
    estimates = {}
    for world in (1, 2, 8):  # the runs of one world size on one set of ranks (one spawn)
        keys_of_world = sorted(k for k in keys if k[0] * k[1] * k[2] == world)
        runs = [(plan.replaced(dp=d, tp=t, pp=p, gbs=32, mbs=m), steps, ckpt) for d, t, p, m, steps in keys_of_world]
        estimates.update(zip(keys_of_world, spawn(world, _measure_each, runs)[0]))
    # Sharding changes no number: tp and pp give the single-process estimate itself, and with
    # dp = 2 the micro-batch size does not enter the estimate.
    for sharded, unsharded in SHARDED.items():
        got, want = estimates[(*sharded, EXACT_STEPS)], estimates[(*unsharded, EXACT_STEPS)]
        assert 0 < want["b_noise"] < float("inf"), want  # |G|² > 0 already: nothing compares as inf = inf
        for key in ("grad_sqr", "grad_var", "b_noise"):
            assert got[key] == pytest.approx(want[key], rel=1e-3), (sharded, key, got, want)
    # Other small-batch definitions (B_small = MBS 16 or 8, or GBS / dp) see the same samples,
    # split otherwise, and differ by the estimator's noise only: B_small 8 within 12% of each
    # B_small 16 estimate, the two B_small 16 ones within 10% of each other (at least what the
    # former check, all six layouts within 10% of their mean, demanded of these three, whose
    # sharded variants are equal above). A pilot run from this checkpoint gave 7% for the
    # standard deviation of B_small 8 against 16 over 200 steps: 12% is 1.7 of them, as
    # before; 3 would take 600 steps.
    b16_mbs, b16_dp, b8 = (
        estimates[k]["b_noise"]
        for k in [(1, 1, 1, 16, NOISE_STEPS), (2, 1, 1, 16, NOISE_STEPS), (1, 1, 1, 8, NOISE_STEPS)]
    )
    assert b16_dp == pytest.approx(b16_mbs, rel=0.10), estimates
    assert b8 == pytest.approx(b16_mbs, rel=0.12) and b8 == pytest.approx(b16_dp, rel=0.12), estimates


def test_the_configured_outlier_weighting_reaches_the_runs_estimator(base_mapping):
    weighted = config_from_mapping(base_mapping, ["gns.outlier_ratio=6"])
    assert estimator_of(plan_from_config(weighted, "train.bin", "val.bin", "uint16")).outlier_ratio == 6.0
    plain = config_from_mapping(base_mapping, [])
    assert estimator_of(plan_from_config(plain, "train.bin", "val.bin", "uint16")).outlier_ratio is None
