"""The worker-side training loop: one function a reader can follow from top to bottom.

It knows nothing about Ray: the cluster layer injects `LoopHooks` (where metrics go, how a
checkpoint directory reaches storage, where to resume from). A plain torch.multiprocessing
test can run the same loop.

Every step: each of the dp replicas takes its contiguous block of the step's GBS samples and
accumulates the gradient of its mean loss over m = GBS / (dp x MBS) micro-batches (through
the pipeline schedule when pp > 1, over DTensor shards when tp > 1); gradients are then
averaged over dp, so they are exactly the gradient of the mean loss over the global batch,
and clipped by the global norm. accelerate supplies the device and mixed precision.

At a step boundary rank 0 may bring a decision (the controller's): a new GBS or MBS is used
from the next step on; a new layout is built in place (`copus.train.reshard_in_place`) or, with
`reconfigure: restart` or when that fails under `auto`, the loop checkpoints and returns with
stop_reason "reconfigure" for the driver to relaunch the workers in the new layout.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

from copus.core.efficiency import adascale_gain
from copus.core.gns import GNSEstimator
from copus.core.layout import CandidateConfig, bubble_fraction
from copus.core.planner import change_kind
from copus.parallel.dims import ParallelDims
from copus.parallel.gns_probe import adam_preconditioner
from copus.parallel.grads import local_grad
from copus.train.checkpoint import load_checkpoint, read_trainer_state, save_checkpoint
from copus.train.data import TokenWindows, TrainStream, replica_batch, validation_indices
from copus.train.engine import ParallelModel
from copus.train.faults import Faults
from copus.train.host import release_memory
from copus.train.plan import OptimizerPlan, WorkerPlan
from copus.train.reshard_in_place import ReshardFailed, reshard_in_place


class NonFiniteLossError(RuntimeError):
    pass


@dataclass
class LoopHooks:
    # Rank 0 hands every metrics record to this (the driver logs it to MLflow).
    emit: Callable[[dict], None] = lambda record: None
    # Every rank hands its local checkpoint directory and rank-0 metrics to storage; the
    # directory may be deleted after the call returns.
    persist_checkpoint: Callable[[Path, dict], None] = lambda path, metrics: None
    # A checkpoint directory to resume from (every rank sees the same one), or None.
    resume_from: Path | None = None
    # Wall-clock origin of the run (time.time() units), so relaunches keep counting.
    clock_origin: float = field(default_factory=time.time)
    # Called on every rank before each step with (step, samples, gbs, mbs); returns the (gbs,
    # mbs) to use, which must be the same on every rank. A change within the layout needs no
    # restart: only the number of micro-batches (and the schedule) changes.
    batch_size: Callable[[int, int, int, int], tuple[int, int]] | None = None
    # Asked on rank 0 at every step boundary with (step, current CandidateConfig): the controller's
    # decision as {"config": {...}, ...} or None. Rank 0 broadcasts it; every rank follows.
    decide: Callable[[int, CandidateConfig], dict | None] | None = None
    # Injected faults (copus.train.faults): a failing in-place change, NaN gradients, a killed worker.
    faults: Faults = field(default_factory=Faults)
    # Rank 0 adds the global batch's sample indices to every step record (tests of sample accounting).
    record_sample_ids: bool = False
    # Samples of the data order to skip after resuming (a calibration's second seed continues a
    # branch point on other data than the first).
    data_offset: int = 0


def world_rank_size() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _all_reduce(t: torch.Tensor, group=None, size: int = 1) -> torch.Tensor:
    if size > 1:
        dist.all_reduce(t, group=group)
    return t


def _broadcast_flag(value: bool, device: torch.device) -> bool:
    """Rank 0 decides; everyone follows (wall-clock checks may differ across ranks)."""
    t = torch.tensor([1 if value else 0], device=device)
    if dist.is_available() and dist.is_initialized():
        dist.broadcast(t, src=0)
    return bool(t.item())


def _broadcast_config(cfg: CandidateConfig | None, device: torch.device) -> CandidateConfig | None:
    """Rank 0's configuration (or None) on every rank."""
    t = torch.tensor([cfg.dp, cfg.tp, cfg.pp, cfg.mbs, cfg.gbs] if cfg else [0] * 5, dtype=torch.int64, device=device)
    if dist.is_available() and dist.is_initialized():
        dist.broadcast(t, src=0)
    values = [int(v) for v in t.tolist()]
    return CandidateConfig(*values) if values[0] else None


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
    return GNSEstimator(plan.gns.reference_gbs or plan.gbs, plan.gns.smoothing, plan.gns.critical_factor)


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
    )
    optimizer = make_optimizer(model, plan.optimizer, plan.lr.base_lr)
    stream = TrainStream(TokenWindows(plan.train_tokens, plan.token_dtype, plan.seq_len), plan.seed)
    return model, optimizer, stream


def resume_plan(plan: WorkerPlan, saved: dict, world: int) -> WorkerPlan:
    """The plan a worker group resumes in. A checkpoint written to hand over to another layout
    (a restart reconfiguration) is loaded into the plan's layout; any other one (Ray Train
    restarting a failed group, which reuses the launch's plan) into the layout and batch shape
    it was written in, the configuration the run had reached by in-place changes."""
    layout = saved.get("layout")
    if saved.get("reconfigure") or not layout or layout["dp"] * layout["tp"] * layout["pp"] != world:
        return plan
    return plan.replaced(
        dp=layout["dp"],
        tp=layout["tp"],
        pp=layout["pp"],
        gbs=saved.get("gbs") or plan.gbs,
        mbs=saved.get("mbs") or plan.mbs,
    )


def run_training(
    plan: WorkerPlan, hooks: LoopHooks, on_finish: Callable[[torch.nn.Module], None] | None = None
) -> dict:
    """Train until the stop rule fires. Returns the final state (identical on every rank).
    `on_finish` sees the trained model before the loop lets go of it (tests, exports)."""
    rank, world = world_rank_size()
    if hooks.resume_from is not None:
        plan = resume_plan(plan, read_trainer_state(hooks.resume_from), world)
    model, optimizer, stream = build_replica(plan, fresh=hooks.resume_from is None)
    dims, flavour, device, o = model.dims, plan.flavour, model.device, plan.optimizer
    gns = attach_gns(model, optimizer, plan)
    train_windows = stream.windows
    val_windows = TokenWindows(plan.val_tokens, plan.token_dtype, plan.seq_len)
    validation_indices(val_windows, plan.val_samples)  # fail fast on a too-small validation split

    state = {
        "step": 0,
        "samples": 0,
        "gbs": None,
        "mbs": None,
        "time_to_target_s": None,
        "best_val_loss": None,
        "last_val_loss": None,
        "last_val_step": None,
        "reconfigure": None,
        "layout": None,
        "nonfinite_steps": 0,
        "skipped_samples": 0,
        "reconfigurations": [],
    }
    if hooks.resume_from is not None:
        saved = load_checkpoint(hooks.resume_from, model.module, optimizer, rank)
        stream.load_state_dict(saved["data"])
        stream.samples_consumed += hooks.data_offset
        state.update({k: saved[k] for k in state if k in saved})
        state["reconfigure"] = None  # done: this launch runs in the new configuration
        if gns is not None and "gns" in saved:
            gns.load_state_dict(saved["gns"])

    def wall() -> float:
        return time.time() - hooks.clock_origin

    def trainer_state() -> dict:
        extra = {"gns": gns.state_dict()} if gns is not None else {}
        # model_shape: what `copus export` needs to write a Hugging Face config.json.
        return {**state, "data": stream.state_dict(), "wall_clock_s": wall(), "model_shape": flavour.as_dict(), **extra}

    def checkpoint() -> None:
        t = time.perf_counter()
        local = Path(tempfile.mkdtemp(prefix=f"copus-ckpt-r{rank}-"))
        try:
            save_checkpoint(local, model.module, optimizer, trainer_state(), rank)
            hooks.persist_checkpoint(local, {"step": state["step"], "samples": state["samples"]})
        finally:
            shutil.rmtree(local, ignore_errors=True)
        if rank == 0:
            hooks.emit(
                {
                    "kind": "checkpoint",
                    "step": state["step"],
                    "wall_clock_s": wall(),
                    "checkpoint_time_s": time.perf_counter() - t,
                }
            )

    def run_eval() -> float:
        t = time.perf_counter()
        val = evaluate(model, val_windows, plan.val_samples, max(plan.mbs, 8))
        state["last_val_loss"], state["last_val_step"] = val, state["step"]
        state["best_val_loss"] = val if state["best_val_loss"] is None else min(val, state["best_val_loss"])
        target = plan.stop.target_val_loss
        reached = target is not None and val <= target
        if reached and state["time_to_target_s"] is None:
            state["time_to_target_s"] = wall()
        if rank == 0:
            hooks.emit(
                {
                    "kind": "eval",
                    "step": state["step"],
                    "samples": state["samples"],
                    "val_loss": val,
                    "wall_clock_s": wall(),
                    "eval_time_s": time.perf_counter() - t,
                }
            )
        return val

    if rank == 0:  # every start of a worker group, a fresh one or one resuming from a checkpoint
        hooks.emit(
            {
                "kind": "start",
                "step": state["step"],
                "samples": state["samples"],
                "wall_clock_s": wall(),
                "layout": {"dp": plan.dp, "tp": plan.tp, "pp": plan.pp},
                "gbs": plan.gbs,
                "mbs": plan.mbs,
                "resumed": hooks.resume_from is not None,
            }
        )
    last_checkpoint_at = time.time()

    # A fresh run records the loss at the initial weights, the start of every loss curve.
    if state["step"] == 0:
        run_eval()

    # A (re)launch starts from the plan's batch shape; a resumed checkpoint may have been
    # written under another layout and batch shape, which only the data position carries over.
    gbs, mbs = plan.gbs, plan.mbs
    stop_reason = None
    nonfinite_run = 0  # consecutive skipped steps
    if state["time_to_target_s"] is not None:
        stop_reason = "target_val_loss"  # resumed a run that had already reached its target
    while stop_reason is None:
        budget = plan.stop.budget_reason(state["step"], state["samples"], wall())
        if _broadcast_flag(budget is not None, device):
            stop_reason = budget or "budget"
            break
        if hooks.batch_size is not None:
            gbs, mbs = hooks.batch_size(state["step"], state["samples"], gbs, mbs)
            dims.validate(flavour.shape(), gbs=gbs, mbs=mbs)
        if hooks.decide is not None:
            current = CandidateConfig(plan.dp, plan.tp, plan.pp, mbs, gbs)
            decision = hooks.decide(state["step"], current) if rank == 0 else None
            target = _broadcast_config(CandidateConfig.from_dict(decision["config"]) if decision else None, device)
            if target is not None and target != current:
                record = {
                    "kind": "reconfigure",
                    "step": state["step"],
                    "samples": state["samples"],
                    "wall_clock_s": wall(),
                    "from": current.as_dict(),
                    "to": target.as_dict(),
                    **{k: v for k, v in (decision or {}).items() if k != "config"},
                }
                kind = change_kind(current, target)
                in_place = kind == "gbs" or plan.reconfigure != "restart"
                if kind == "layout" and in_place:
                    try:
                        model, optimizer, record["reshard"] = reshard_in_place(
                            model,
                            optimizer,
                            plan,
                            target,
                            lambda m: make_optimizer(m, o, plan.lr.base_lr),  # noqa: B023 - called at once
                            fail=hooks.faults.fail_reshard,
                        )
                    except ReshardFailed as err:
                        if plan.reconfigure == "in_place":
                            raise
                        in_place, record["fell_back"] = False, str(err)  # the old layout is intact: restart
                    else:
                        dims = model.dims
                        plan = plan.replaced(dp=target.dp, tp=target.tp, pp=target.pp)
                        attach_probe(model, optimizer, plan)
                        release_memory(device)  # the old layout's tensors, now unreferenced
                state["reconfigurations"].append(
                    {
                        "step": state["step"],
                        "samples": state["samples"],
                        "from": current.as_dict(),
                        "to": target.as_dict(),
                        "in_place": in_place,
                    }
                )
                if rank == 0:
                    hooks.emit({**record, "in_place": in_place})
                if not in_place:  # checkpoint and hand back to the driver, which relaunches
                    stop_reason = "reconfigure"
                    state["reconfigure"] = {**target.as_dict(), "fell_back": "fell_back" in record}
                    break
                dims.validate(flavour.shape(), gbs=target.gbs, mbs=target.mbs)
                gbs, mbs = target.gbs, target.mbs
        t_step = time.perf_counter()
        gain = (
            adascale_gain(gns.grad_sqr, gns.grad_var, gns.reference_gbs, gbs) if gns is not None and gns.ready else None
        )
        lr = plan.lr.lr(state["samples"], gbs, gain)
        global_batch = stream.next_global_batch(gbs)
        batch = replica_batch(global_batch, model.dp_rank, plan.dp, mbs)
        m = len(batch.microbatches)
        inputs, targets = train_windows.batch(batch.sample_indices)
        hooks.faults.maybe_kill(state["step"] + 1, rank)
        result = train_step(
            model,
            optimizer,
            inputs,
            targets,
            mbs,
            lr,
            o.grad_clip,
            poison=state["step"] + 1 in hooks.faults.poison_steps,
        )
        if result.skipped:
            # No update, GNS untouched; the samples were consumed (the data position moves on,
            # as a resumed run would) and are counted as skipped.
            state["step"] += 1
            state["samples"] += gbs
            state["nonfinite_steps"] += 1
            state["skipped_samples"] += gbs
            nonfinite_run += 1
            if rank == 0:
                hooks.emit(
                    {
                        "kind": "nonfinite",
                        "step": state["step"],
                        "samples": state["samples"],
                        "train_loss": result.loss,
                        "grad_norm": result.grad_norm,
                        "wall_clock_s": wall(),
                        "consecutive": nonfinite_run,
                        "nonfinite_steps": state["nonfinite_steps"],
                    }
                )
            if nonfinite_run > plan.stop.max_nonfinite_steps:
                checkpoint()  # the weights are the last finite ones: a usable checkpoint
                raise NonFiniteLossError(
                    f"stop.max_nonfinite_steps: {nonfinite_run} consecutive steps with a non-finite loss or gradient "
                    f"(last at step {state['step']}, loss {result.loss}, gradient norm {result.grad_norm}); the "
                    f"checkpoint at step {state['step']} holds the last finite weights"
                )
            continue
        nonfinite_run = 0
        if gns is not None and model.last_norms is not None:
            n = model.last_norms
            gns.update(n.sq_small, n.b_small, n.sq_big, n.b_big)  # same numbers on every rank
        step_time = time.perf_counter() - t_step
        state["step"] += 1
        state["samples"] += gbs
        state["gbs"], state["mbs"] = gbs, mbs
        state["layout"] = {"dp": plan.dp, "tp": plan.tp, "pp": plan.pp}

        if rank == 0 and state["step"] % plan.report_every_steps == 0:
            hooks.emit(
                {
                    "kind": "step",
                    "step": state["step"],
                    "samples": state["samples"],
                    "train_loss": result.loss,
                    "lr": lr,
                    "gbs": gbs,
                    "mbs": mbs,
                    "microbatches": m,
                    "dp": plan.dp,
                    "tp": plan.tp,
                    "pp": plan.pp,
                    "step_time_s": step_time,
                    "forward_backward_time_s": model.timing.forward_backward_s,
                    "dp_allreduce_time_s": model.timing.dp_allreduce_s,
                    "grad_norm_time_s": model.timing.grad_norm_s,
                    "optimizer_time_s": result.optimizer_time_s,
                    "grad_norm": result.grad_norm,
                    "pipeline_bubble_fraction": bubble_fraction(plan.pp, m),
                    "samples_per_s": gbs / step_time,
                    "tokens_per_s": gbs * plan.seq_len / step_time,
                    "wall_clock_s": wall(),
                    **(gns.summary(gbs) if gns is not None and gns.ready else {}),
                    **({"sample_ids": global_batch.tolist()} if hooks.record_sample_ids else {}),
                }
            )
        if state["step"] % plan.eval_every_steps == 0:
            val = run_eval()
            if plan.stop.target_val_loss is not None and val <= plan.stop.target_val_loss:
                stop_reason = "target_val_loss"
        due = state["step"] % plan.checkpoint_every_steps == 0
        if plan.checkpoint_every_s is not None:  # rank 0's clock decides for all
            due = _broadcast_flag(due or time.time() - last_checkpoint_at >= plan.checkpoint_every_s, device)
        if stop_reason is None and due:
            checkpoint()
            last_checkpoint_at = time.time()

    if state["last_val_step"] != state["step"] and stop_reason != "reconfigure":
        run_eval()  # the final model's validation loss, always measured (not when only the layout changes)
    checkpoint()
    if on_finish is not None:
        on_finish(model.module)
    model.close()  # a worker may train again in this process (tests, profiling): free the groups
    result = {**trainer_state(), "stop_reason": stop_reason}
    if rank == 0:
        hooks.emit({"kind": "end", **result})
    return result
