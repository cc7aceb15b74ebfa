"""Measure the gradient noise scale at fixed weights: `copus gns`.

Runs `steps` forward/backward passes on consecutive global batches of the experiment's data
under its layout, without updating the weights, and folds each step's two-batch norms into a
GNS estimate. Starts from the experiment's initial weights, or from a checkpoint.
"""

from __future__ import annotations

from pathlib import Path

from copus.core.gns import b_noise_interval
from copus.train.checkpoint import load_checkpoint
from copus.train.data import replica_batch
from copus.train.replica import attach_gns, build_replica
from copus.train.worker_plan import WorkerPlan


def measure_gns(plan: WorkerPlan, steps: int, resume_from: Path | None = None) -> dict:
    """Collective over all ranks; returns the same dict on every rank."""
    model, optimizer, stream = build_replica(plan)
    if resume_from is not None:
        saved = load_checkpoint(resume_from, model.module, optimizer, 0)
        stream.load_state_dict(saved["data"])
    gns = attach_gns(model, optimizer, plan)
    if gns is None:
        raise ValueError("gns.enabled: must be true to measure the gradient noise scale")
    norms = []
    for _ in range(steps):
        batch = replica_batch(stream.next_global_batch(plan.gbs), model.dp_rank, plan.dp, plan.mbs)
        inputs, targets = stream.windows.batch(batch.sample_indices)
        model.forward_backward(inputs, targets, plan.mbs)
        model.reduce_and_clip(None)
        if model.last_norms is None:
            raise ValueError(
                f"batch.gbs: {plan.gbs} with dp {plan.dp} and mbs {plan.mbs} gives one batch size only; "
                "the GNS needs dp > 1 or at least 2 micro-batches"
            )
        n = model.last_norms
        gns.update(n.sq_small, n.b_small, n.sq_big, n.b_big)
        norms.append((n.sq_small, n.b_small, n.sq_big, n.b_big))
        for p in model.params:
            p.grad = None
    model.probe.close()
    low, high = b_noise_interval(norms)
    return {
        "b_noise": gns.b_noise,
        "b_noise_low": low,  # 95% bootstrap interval over the steps
        "b_noise_high": high,
        "grad_sqr": gns.grad_sqr,
        "grad_var": gns.grad_var,
        "steps": steps,
        "critical_batch_size": gns.critical_batch_size,
        "reference_gbs": plan.gbs,
        "statistical_efficiency_at_2x": gns.efficiency(2 * plan.gbs),
        "skipped_nonfinite": gns.state.skipped_nonfinite,
    }
