"""The GNS probe under 3D parallelism: accurate against per-example gradients, and the same
whatever the layout or micro-batch size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.func import functional_call, grad, vmap

from copus.train.checkpoint import load_checkpoint
from copus.train.engine import token_loss
from copus.train.gns import measure_gns
from copus.train.local import run_local
from copus.train.plan import StopRule
from copus.train.replica import build_replica
from tests.train.loop_helpers import small_plan, spawn

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(token_cache, tmp_path_factory):
    """The debug model after 30 steps (the gradient is no longer dominated by its init mean)."""
    plan = small_plan(token_cache, gbs=16, mbs=4, stop=StopRule(max_steps=30), checkpoint_every_steps=30)
    root = tmp_path_factory.mktemp("gns-ckpt")
    run_local(plan, root)
    return plan, root / "step30"


def brute_force_b_noise(plan, checkpoint: Path, n: int, seed: int) -> float:
    """tr(Σ)/|G|² from exact per-example gradients of n random training samples (the
    unbiased forms: sample covariance, and |mean|² less tr(Σ)/n)."""
    model, optimizer, stream = build_replica(plan)
    load_checkpoint(checkpoint, model.module, optimizer, 0)
    module = model.module
    params = {k: v.detach() for k, v in module.named_parameters()}

    def loss_of_one(p, x, y):
        return token_loss(functional_call(module, p, (x.unsqueeze(0),)), y.unsqueeze(0))

    indices = np.random.default_rng(seed).choice(stream.windows.num_samples, size=n, replace=False)
    per_example = []
    for chunk in np.array_split(indices, n // 128):
        x, y = stream.windows.batch(chunk)
        g = vmap(grad(loss_of_one), in_dims=(None, 0, 0))(params, x, y)
        per_example.append(torch.cat([v.reshape(len(chunk), -1) for v in g.values()], dim=1).double())
    G = torch.cat(per_example)
    mean = G.mean(0)
    tr_sigma = float(((G - mean) ** 2).sum(1).sum() / (n - 1))
    grad_sqr = float(mean @ mean) - tr_sigma / n
    return tr_sigma / grad_sqr


def test_estimate_is_within_15_percent_of_per_example_brute_force(trained):
    plan, ckpt = trained
    truth = brute_force_b_noise(plan, ckpt, n=2048, seed=0)
    measured = measure_gns(plan.replaced(gbs=32, mbs=8), steps=300, resume_from=ckpt)
    assert measured["steps"] == 300 and measured["skipped_nonfinite"] == 0
    assert measured["b_noise"] == pytest.approx(truth, rel=0.15), (measured, truth)


# GBS 32: with dp = 1 the small batch is the first micro-batch (B_small = MBS), with dp = 2 a
# replica's half of the batch (B_small = 16, whatever the MBS).
# (tp alone is covered by (2,2,2) against (2,1,1): sharding over tp and pp together changes nothing.)
LAYOUTS = [((1, 1, 1), 16), ((1, 1, 2), 16), ((2, 1, 1), 16), ((2, 1, 1), 4), ((2, 2, 2), 4), ((1, 1, 1), 8)]


def test_estimate_is_the_same_across_layouts_and_micro_batch_sizes(trained):
    plan, ckpt = trained
    estimates = {}
    for (dp, tp, pp), mbs in LAYOUTS:
        layout_plan = plan.replaced(dp=dp, tp=tp, pp=pp, gbs=32, mbs=mbs)
        estimates[(dp, tp, pp, mbs)] = spawn(dp * tp * pp, measure_gns, layout_plan, 200, ckpt)[0]["b_noise"]
    # Sharding changes no number: tp and pp give the single-process estimate itself, and with
    # dp = 2 the micro-batch size does not enter the estimate.
    assert estimates[(1, 1, 2, 16)] == pytest.approx(estimates[(1, 1, 1, 16)], rel=1e-3)
    assert estimates[(2, 1, 1, 4)] == pytest.approx(estimates[(2, 1, 1, 16)], rel=1e-3)
    assert estimates[(2, 2, 2, 4)] == pytest.approx(estimates[(2, 1, 1, 16)], rel=1e-3)
    # Other small-batch definitions (B_small = MBS, or GBS / dp) differ by sampling noise only.
    centre = float(np.mean(list(estimates.values())))
    for key, value in estimates.items():
        assert value == pytest.approx(centre, rel=0.10), (key, estimates)
