"""One rank's replica of the model under a layout, and what is done with it: build it (model
part, AdamW, data stream), take an optimiser step, evaluate, probe gradient norms for the noise
scale. The training loop (`copus.train.loop`), the noise-scale measurement (`copus.train.gns`),
profiling (`copus.train.profile`) and the benchmarks share these.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from copus.core.gns import GNSEstimator
from copus.parallel.dims import ParallelDims
from copus.parallel.gns_probe import adam_preconditioner
from copus.parallel.grads import local_grad
from copus.train.data import TokenWindows, TrainStream, validation_indices
from copus.train.parallel_model import ParallelModel
from copus.train.worker_plan import OptimizerPlan, WorkerPlan


def world_rank_size() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _all_reduce(t: torch.Tensor, group=None, size: int = 1) -> torch.Tensor:
    if size > 1:
        dist.all_reduce(t, group=group)
    return t


def make_optimizer(model: ParallelModel, o: OptimizerPlan, lr: float) -> torch.optim.Optimizer:
    """AdamW; norms and biases get no weight decay."""
    decay = [p for p in model.params if p.ndim >= 2]
    no_decay = [p for p in model.params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": o.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # foreach=False under tp: the parameter list mixes DTensor shards and plain (replicated) tensors.
    return torch.optim.AdamW(groups, lr=lr, betas=o.betas, eps=o.eps, foreach=False if model.dims.tp > 1 else None)


def eval_chunk(samples: int, pp: int, limit: int) -> int:
    """Evaluation micro-batch size: the largest divisor of the replica's validation samples
    that is at most `limit` and still leaves at least pp micro-batches for the pipeline."""
    return max(d for d in range(1, min(samples, limit) + 1) if samples % d == 0 and samples // d >= pp)


def evaluate(model: ParallelModel, windows: TokenWindows, count: int, chunk_limit: int) -> float:
    """Mean token loss over the fixed validation set, sharded over the dp replicas."""
    mine = validation_indices(windows, count)[model.dp_rank :: model.dims.dp]
    inputs, targets = windows.batch(mine)
    total = torch.zeros(2, dtype=torch.float64, device=model.device)
    total[0] = model.loss_sum(inputs, targets, eval_chunk(len(mine), model.dims.pp, chunk_limit)).double()
    total[1] = targets.numel()
    _all_reduce(total, model.dp_group, model.dims.dp)
    return float(total[0] / total[1])


@dataclass(frozen=True)
class StepResult:
    loss: float  # mean loss of the global batch (the same on every rank)
    grad_norm: float  # global gradient norm before clipping
    optimizer_time_s: float
    skipped: bool = False  # the loss or the gradient was not finite: no update was made


def train_step(
    model: ParallelModel,
    optimizer: torch.optim.Optimizer,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    mbs: int,
    lr: float,
    grad_clip: float | None,
    poison: bool = False,
) -> StepResult:
    """One optimiser step on this replica's samples (m x mbs of them); collective over all ranks.
    A non-finite loss or gradient norm (both the same on every rank: the loss is averaged over
    dp, the norm is global) skips the update on every rank. `poison` (fault injection) makes
    this rank's first gradient NaN."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    micro_losses = model.forward_backward(inputs, targets, mbs)
    if poison and model.params and local_grad(model.params[0]) is not None:
        local_grad(model.params[0]).fill_(float("nan"))
    loss = float(_all_reduce(micro_losses.mean(), model.dp_group, model.dims.dp) / model.dims.dp)
    grad_norm = model.reduce_and_clip(grad_clip)
    if not (math.isfinite(loss) and math.isfinite(grad_norm)):
        optimizer.zero_grad(set_to_none=True)
        return StepResult(loss, grad_norm, 0.0, skipped=True)
    t = time.perf_counter()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return StepResult(loss, grad_norm, time.perf_counter() - t)


def attach_probe(model: ParallelModel, optimizer: torch.optim.Optimizer, plan: WorkerPlan) -> None:
    if plan.gns.enabled:
        model.attach_probe(adam_preconditioner(optimizer) if plan.gns.precondition == "adam" else None)


def attach_gns(model: ParallelModel, optimizer: torch.optim.Optimizer, plan: WorkerPlan) -> GNSEstimator | None:
    """Probe gradient norms every step and smooth them into a GNS estimate (B0 = the plan's GBS)."""
    if not plan.gns.enabled:
        return None
    attach_probe(model, optimizer, plan)
    return estimator_of(plan)


def estimator_of(plan: WorkerPlan) -> GNSEstimator:
    """A fresh noise estimate as the plan configures it (B0 = the plan's GBS unless given)."""
    g = plan.gns
    b0 = g.reference_gbs or plan.gbs
    return GNSEstimator(b0, critical_factor=g.critical_factor, horizon=g.horizon(b0), outlier_ratio=g.outlier_ratio)


def fresh_accelerator(use_gpu: bool, mixed_precision: str):
    """An Accelerator for this run. accelerate keeps process-wide singletons and refuses a
    second Accelerator with other settings; a worker that trains several runs (tests, and later
    in-place reconfiguration) resets them. The process-group part (PartialState) is kept."""
    from accelerate import Accelerator  # heavy import, kept off the module import path
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    return Accelerator(cpu=not use_gpu, mixed_precision=mixed_precision)


def build_replica(plan: WorkerPlan, fresh: bool = True) -> tuple[ParallelModel, torch.optim.Optimizer, TrainStream]:
    """This rank's part of the model under the plan's layout, its optimiser, and the data stream
    at position 0. Collective: every rank calls it. `fresh=False`: a checkpoint will overwrite
    the weights, so a Hugging Face directory (plan.init_from) is not read."""
    _, world = world_rank_size()
    dims = ParallelDims(plan.dp, plan.tp, plan.pp)
    flavour = plan.flavour
    dims.validate(flavour.shape(), world_size=world, gbs=plan.gbs, mbs=plan.mbs)
    accelerator = fresh_accelerator(plan.use_gpu, plan.mixed_precision)
    torch.manual_seed(plan.seed)
    model = ParallelModel(
        flavour,
        plan.seq_len,
        plan.seed,
        dims,
        accelerator.device,
        plan.pp_schedule,
        accelerator.autocast,
        init_from=plan.init_from if fresh else None,
        dp_shard=plan.config.dp_shard,
        recompute=plan.config.recompute,
    )
    optimizer = make_optimizer(model, plan.optimizer, plan.lr.base_lr)
    stream = TrainStream(TokenWindows(plan.train_tokens, plan.token_dtype, plan.seq_len), plan.seed)
    return model, optimizer, stream
