"""The worker-side training loop: `run_training` reads from top to bottom, each part named.

It knows nothing about Ray: the cluster layer injects `LoopHooks` (where metrics go, how a
checkpoint directory reaches storage, where to resume from). A plain torch.multiprocessing
test can run the same loop.

Every step: each of the dp replicas takes its contiguous block of the step's GBS samples and
accumulates the gradient of its mean loss over m = GBS / (dp x MBS) micro-batches (through
the pipeline schedule when pp > 1, over DTensor shards when tp > 1); gradients are then
averaged over dp, so they are exactly the gradient of the mean loss over the global batch,
and clipped by the global norm. accelerate supplies the device and mixed precision.

At a step boundary a ramp run moves to its schedule's GBS (`follow_ramp`), and rank 0 may
bring a decision (the controller's): a new GBS or MBS is used from the next step on; a new
layout is built in place (`copus.train.reshard_in_place`) or, with `reconfigure: restart` or
when that fails under `auto`, the loop checkpoints and returns with stop_reason "reconfigure"
for the driver to relaunch the workers in the new layout.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

from copus.core.efficiency import adascale_gain
from copus.core.gns import GNSEstimator
from copus.core.layout import DP_SHARD_MODES, RECOMPUTE_MODES, REPLICA_FIELDS, CandidateConfig, bubble_fraction
from copus.core.planner import change_kind
from copus.core.ramp import ramp_order
from copus.core.reconfiguration import RESTART, WAYS, BranchRequest, Relaunch, SwitchOrder
from copus.core.schedule import Cadence
from copus.records import (
    CheckpointRecord,
    EndRecord,
    EvalRecord,
    LoopState,
    NonfiniteRecord,
    ReconfigureRecord,
    Record,
    StartRecord,
    StepRecord,
)
from copus.train.checkpoint import load_checkpoint, read_trainer_state, save_checkpoint
from copus.train.data import TokenWindows, TrainStream, replica_batch, validation_indices
from copus.train.faults import Faults
from copus.train.host import release_memory
from copus.train.parallel_model import ParallelModel
from copus.train.replica import (
    StepResult,
    attach_gns,
    attach_probe,
    build_replica,
    evaluate,
    make_optimizer,
    train_step,
    world_rank_size,
)
from copus.train.reshard_in_place import ReshardFailed, reshard_in_place
from copus.train.worker_plan import WorkerPlan
from workloads.flavours import ModelFlavour


class NonFiniteLossError(RuntimeError):
    pass


@dataclass
class LoopHooks:
    # Rank 0 hands every record to this, as the dict of a `copus.records` record (the driver
    # logs it to MLflow and records.jsonl).
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
    # order (a switch, or a request for a branch checkpoint), or None. Rank 0 broadcasts it; every
    # rank follows.
    decide: Callable[[int, CandidateConfig], SwitchOrder | BranchRequest | None] | None = None
    # Injected faults (copus.train.faults): a failing in-place change, NaN gradients, a killed worker.
    faults: Faults = field(default_factory=Faults)
    # Rank 0 adds the global batch's sample indices to every step record (tests of sample accounting).
    record_sample_ids: bool = False
    # Samples of the data order to skip after resuming (a calibration's second seed continues a
    # branch point on other data than the first).
    data_offset: int = 0


@dataclass
class Launch:
    """One launch of the loop on this rank: the plan it trains under (whose layout changes when
    the replica is resharded in place), the replica and its data, the run's progress, and the
    batch shape of the next step."""

    plan: WorkerPlan
    hooks: LoopHooks
    rank: int
    model: ParallelModel
    optimizer: torch.optim.Optimizer
    stream: TrainStream
    gns: GNSEstimator | None
    val_windows: TokenWindows
    flavour: ModelFlavour
    # A (re)launch starts from the plan's batch shape; a resumed checkpoint may have been
    # written under another layout and batch shape, which only the data position carries over.
    gbs: int
    mbs: int
    state: LoopState = field(default_factory=LoopState)
    stop_reason: str | None = None
    nonfinite_run: int = 0  # consecutive skipped steps
    last_checkpoint_at: float = 0.0  # time.time() of the last checkpoint (or of the start)

    def wall(self) -> float:
        """Seconds since the run started, across relaunches."""
        return time.time() - self.hooks.clock_origin

    def emit(self, record: Record) -> None:
        """Only rank 0 reports (every rank's figures are the same)."""
        if self.rank == 0:
            self.hooks.emit(record.as_dict())

    def validate_batch(self, gbs: int, mbs: int) -> None:
        self.model.dims.validate(self.flavour.shape(), gbs=gbs, mbs=mbs)


def _broadcast_flag(value: bool, device: torch.device) -> bool:
    """Rank 0 decides; everyone follows (wall-clock checks may differ across ranks)."""
    t = torch.tensor([1 if value else 0], device=device)
    if dist.is_available() and dist.is_initialized():
        dist.broadcast(t, src=0)
    return bool(t.item())


def _broadcast_target(
    order: SwitchOrder | BranchRequest | None, device: torch.device
) -> tuple[tuple[CandidateConfig, str] | None, bool]:
    """Rank 0's order on every rank: its target configuration and way (or None), and whether the
    controller asked for a branch checkpoint. One tensor: the target's five sizes; its sharding,
    recompute and way as indices into DP_SHARD_MODES, RECOMPUTE_MODES and WAYS; the branch flag."""
    values = [0] * 9
    if isinstance(order, SwitchOrder):
        cfg = order.config
        modes = [DP_SHARD_MODES.index(cfg.dp_shard), RECOMPUTE_MODES.index(cfg.recompute), WAYS.index(order.way)]
        values[:8] = [cfg.dp, cfg.tp, cfg.pp, cfg.mbs, cfg.gbs, *modes]
    values[8] = int(isinstance(order, BranchRequest))
    t = torch.tensor(values, dtype=torch.int64, device=device)
    if dist.is_available() and dist.is_initialized():
        dist.broadcast(t, src=0)
    values = [int(v) for v in t.tolist()]
    branch = bool(values[8])
    if not values[0]:
        return None, branch
    target = CandidateConfig(*values[:5], dp_shard=DP_SHARD_MODES[values[5]], recompute=RECOMPUTE_MODES[values[6]])
    return (target, WAYS[values[7]]), branch


def resume_plan(plan: WorkerPlan, saved: dict, world: int) -> WorkerPlan:
    """The plan a worker group resumes in. A checkpoint written to hand over to another layout
    (a restart reconfiguration) is loaded into the plan's layout; any other one (Ray Train
    restarting a failed group, which reuses the launch's plan) into the layout and batch shape
    it was written in, the configuration the run had reached by in-place changes."""
    layout = saved.get("layout")
    if saved.get("reconfigure") or not layout or layout["dp"] * layout["tp"] * layout["pp"] != world:
        return plan
    return plan.replaced(
        **{k: layout[k] for k in REPLICA_FIELDS if k in layout},
        gbs=saved.get("gbs") or plan.gbs,
        mbs=saved.get("mbs") or plan.mbs,
    )


def run_training(
    plan: WorkerPlan, hooks: LoopHooks, on_finish: Callable[[torch.nn.Module], None] | None = None
) -> dict:
    """Train until the stop rule fires. Returns the final state (identical on every rank).
    `on_finish` sees the trained model before the loop lets go of it (tests, exports)."""
    launch = open_launch(plan, hooks)
    # A fresh run records the loss at the initial weights, the start of every loss curve.
    if launch.state.step == 0:
        run_eval(launch)
    if launch.state.time_to_target_s is not None:
        launch.stop_reason = "target_val_loss"  # resumed a run that had already reached its target
    while launch.stop_reason is None:
        at_step_boundary(launch)
        if launch.stop_reason is None:
            train_one_step(launch)
    return close_launch(launch, on_finish)


def open_launch(plan: WorkerPlan, hooks: LoopHooks) -> Launch:
    """This rank's replica, fresh or resumed from hooks.resume_from; rank 0 reports the start
    (every start of a worker group, a fresh one or one resuming from a checkpoint)."""
    rank, world = world_rank_size()
    if hooks.resume_from is not None:
        plan = resume_plan(plan, read_trainer_state(hooks.resume_from), world)
    model, optimizer, stream = build_replica(plan, fresh=hooks.resume_from is None)
    gns = attach_gns(model, optimizer, plan)
    val_windows = TokenWindows(plan.val_tokens, plan.token_dtype, plan.seq_len)
    validation_indices(val_windows, plan.val_samples)  # fail fast on a too-small validation split
    launch = Launch(
        plan=plan,
        hooks=hooks,
        rank=rank,
        model=model,
        optimizer=optimizer,
        stream=stream,
        gns=gns,
        val_windows=val_windows,
        flavour=plan.flavour,
        gbs=plan.gbs,
        mbs=plan.mbs,
    )
    if hooks.resume_from is not None:
        restore(launch, hooks.resume_from)
    s = launch.state
    launch.emit(
        StartRecord(
            step=s.step,
            samples=s.samples,
            wall_clock_s=launch.wall(),
            layout=plan.config.replica(),
            gbs=plan.gbs,
            mbs=plan.mbs,
            resumed=hooks.resume_from is not None,
        )
    )
    launch.last_checkpoint_at = time.time()
    return launch


def restore(launch: Launch, path: Path) -> None:
    """Weights, optimiser state, data position, progress and noise-scale estimate from a checkpoint."""
    saved = load_checkpoint(path, launch.model.module, launch.optimizer, launch.rank)
    launch.stream.load_state_dict(saved["data"])
    launch.stream.samples_consumed += launch.hooks.data_offset
    launch.state = LoopState.from_saved(saved)
    launch.state.reconfigure = None  # done: this launch runs in the new configuration
    if launch.gns is not None and "gns" in saved:
        launch.gns.load_state_dict(saved["gns"])


def trainer_state(launch: Launch) -> dict:
    """What a checkpoint keeps besides weights and optimiser state (and the end record reports)."""
    extra = {"gns": launch.gns.state_dict()} if launch.gns is not None else {}
    # model_shape: what `copus export` needs to write a Hugging Face config.json.
    return {
        **launch.state.as_dict(),
        "data": launch.stream.state_dict(),
        "wall_clock_s": launch.wall(),
        "model_shape": launch.flavour.as_dict(),
        **extra,
    }


def checkpoint(launch: Launch, branch: bool = False) -> None:
    """Every rank saves its part and hands it to storage; rank 0 reports how long it took.
    `branch`: the controller asked for it (its record says so, and where a probe starts)."""
    t = time.perf_counter()
    local = Path(tempfile.mkdtemp(prefix=f"copus-ckpt-r{launch.rank}-"))
    s = launch.state
    try:
        save_checkpoint(local, launch.model.module, launch.optimizer, trainer_state(launch), launch.rank)
        launch.hooks.persist_checkpoint(local, {"step": s.step, "samples": s.samples})
    finally:
        shutil.rmtree(local, ignore_errors=True)
    spent = time.perf_counter() - t
    launch.emit(
        CheckpointRecord(
            step=s.step, wall_clock_s=launch.wall(), checkpoint_time_s=spent, samples=s.samples, branch=branch
        )
    )


def run_eval(launch: Launch) -> float:
    """The validation loss now, kept in the state (last, best, time to target) and reported."""
    t = time.perf_counter()
    plan, s = launch.plan, launch.state
    val = evaluate(launch.model, launch.val_windows, plan.val_samples, max(plan.mbs, 8))
    s.last_val_loss, s.last_val_step = val, s.step
    s.best_val_loss = val if s.best_val_loss is None else min(val, s.best_val_loss)
    spent = time.perf_counter() - t
    s.eval_time_s += spent
    target = plan.stop.target_val_loss
    if target is not None and val <= target and s.time_to_target_s is None:
        s.time_to_target_s = launch.wall()
        s.time_to_target_without_eval_s = s.time_to_target_s - s.eval_time_s
    launch.emit(EvalRecord(step=s.step, samples=s.samples, val_loss=val, wall_clock_s=launch.wall(), eval_time_s=spent))
    return val


def at_step_boundary(launch: Launch) -> None:
    """Before a step: stop when the budget is spent (rank 0's clock decides for all), else take
    the batch shape the hooks ask for, the ramp's GBS, and follow the controller's decision."""
    s, hooks, device = launch.state, launch.hooks, launch.model.device
    budget = launch.plan.stop.budget_reason(s.step, s.samples, launch.wall())
    if _broadcast_flag(budget is not None, device):
        launch.stop_reason = budget or "budget"
        return
    if hooks.batch_size is not None:
        launch.gbs, launch.mbs = hooks.batch_size(s.step, s.samples, launch.gbs, launch.mbs)
        launch.validate_batch(launch.gbs, launch.mbs)
    if launch.plan.ramp is not None:
        follow_ramp(launch)
    if hooks.decide is not None:
        current = replace(launch.plan.config, mbs=launch.mbs, gbs=launch.gbs)
        order = hooks.decide(s.step, current) if launch.rank == 0 else None
        target, branch = _broadcast_target(order, device)
        if branch:  # a probe branches from here at another GBS (copus.cluster.probes)
            checkpoint(launch, branch=True)
        elif target is not None and target[0] != current:
            apply_order(launch, current, *target, order)


def follow_ramp(launch: Launch) -> None:
    """A ramp run (copus.core.ramp) moves to its schedule's GBS for the samples seen, recorded as
    an ordered change is. Every rank has the samples seen, so each finds the same change without
    a broadcast or a controller; and a resumed or relaunched group, which has them from its
    checkpoint, continues the ramp at the right GBS."""
    current = replace(launch.plan.config, mbs=launch.mbs, gbs=launch.gbs)
    order = ramp_order(launch.plan.ramp, launch.state.samples, current)
    if order is not None:
        apply_order(launch, current, order.config, order.way, order)


def apply_order(
    launch: Launch, current: CandidateConfig, target: CandidateConfig, way: str, order: SwitchOrder | None
) -> None:
    """Move from `current` to the controller's `target`, the `way` it says (every rank has both;
    only rank 0 has the order's reasons). A new batch shape is used from the next step on and a
    new layout is built in place; by way of a restart, or when the in-place path failed under
    `auto`, the loop stops to checkpoint and hands the target to the driver, which relaunches in it."""
    s, at = launch.state, launch.wall()
    kind = change_kind(current, target)
    in_place = kind == "gbs" or way != RESTART
    reshard = fell_back = None
    if kind == "layout" and in_place:
        reshard, fell_back = reshard_to(launch, target, strict=way == "in_place")
        in_place = fell_back is None
    change = ReconfigureRecord(
        step=s.step,
        samples=s.samples,
        wall_clock_s=at,
        from_=current,
        to=target,
        order=order,
        reshard=reshard,
        fell_back=fell_back,
        in_place=in_place,
    )
    s.reconfigurations.append(change.reconfiguration())
    launch.emit(change)
    if not in_place:  # checkpoint and hand back to the driver, which relaunches
        launch.stop_reason = "reconfigure"
        s.reconfigure = Relaunch(target, fell_back=fell_back is not None)
        return
    launch.validate_batch(target.gbs, target.mbs)
    launch.gbs, launch.mbs = target.gbs, target.mbs


def reshard_to(launch: Launch, target: CandidateConfig, strict: bool) -> tuple[dict | None, str | None]:
    """Rebuild the replica in `target`'s layout in place: (the reshard's figures, None), or, when
    the in-place path failed and the run may fall back to a restart, (None, why); the old
    layout is then intact. `strict` (`reconfigure: in_place`): a failure is raised."""
    plan = launch.plan
    try:
        model, optimizer, stats = reshard_in_place(
            launch.model,
            launch.optimizer,
            plan,
            target,
            lambda m: make_optimizer(m, plan.optimizer, plan.lr.base_lr),
            fail=launch.hooks.faults.fail_reshard,
        )
    except ReshardFailed as err:
        if strict:
            raise
        return None, str(err)
    launch.model, launch.optimizer = model, optimizer
    # The new replica has the target's layout and its sharding and recomputation modes.
    launch.plan = plan.replaced(
        dp=target.dp, tp=target.tp, pp=target.pp, dp_shard=target.dp_shard, recompute=target.recompute
    )
    attach_probe(model, optimizer, launch.plan)
    release_memory(model.device)  # the old layout's tensors, now unreferenced
    return stats, None


def train_one_step(launch: Launch) -> None:
    """One optimiser step at the current batch shape, then its record, and evaluation and a
    checkpoint when due. A step with a non-finite loss or gradient is skipped."""
    plan, s, gns, model = launch.plan, launch.state, launch.gns, launch.model
    gbs, mbs = launch.gbs, launch.mbs
    t_step = time.perf_counter()
    gain = adascale_gain(gns.grad_sqr, gns.grad_var, gns.reference_gbs, gbs) if gns is not None and gns.ready else None
    lr = plan.lr.lr(s.samples, gbs, gain)
    global_batch = launch.stream.next_global_batch(gbs)
    batch = replica_batch(global_batch, model.dp_rank, plan.dp, mbs)
    inputs, targets = launch.stream.windows.batch(batch.sample_indices)
    faults = launch.hooks.faults
    faults.maybe_kill(s.step + 1, launch.rank)
    faults.maybe_hold(s.step + 1, launch.rank)
    poison = s.step + 1 in faults.poison_steps
    result = train_step(model, launch.optimizer, inputs, targets, mbs, lr, plan.optimizer.grad_clip, poison=poison)
    if result.skipped:
        skip_nonfinite_step(launch, result)
        return
    launch.nonfinite_run = 0
    if gns is not None and model.last_norms is not None:
        n = model.last_norms
        gns.update(n.sq_small, n.b_small, n.sq_big, n.b_big, s.samples + gbs)  # same numbers on every rank
    step_time = time.perf_counter() - t_step
    s.step += 1
    s.samples += gbs
    s.gbs, s.mbs = gbs, mbs
    s.layout = plan.config.replica()
    if launch.rank == 0 and s.step % plan.report_every_steps == 0:  # rank 0 only: sample ids can be many
        launch.emit(step_record(launch, result, lr, len(batch.microbatches), step_time, global_batch))
    after_step(launch)


def step_record(
    launch: Launch, result: StepResult, lr: float, m: int, step_time: float, global_batch: torch.Tensor
) -> StepRecord:
    plan, gbs, timing, gns = launch.plan, launch.gbs, launch.model.timing, launch.gns
    return StepRecord(
        step=launch.state.step,
        samples=launch.state.samples,
        train_loss=result.loss,
        lr=lr,
        gbs=gbs,
        mbs=launch.mbs,
        microbatches=m,
        dp=plan.dp,
        tp=plan.tp,
        pp=plan.pp,
        dp_shard=plan.config.dp_shard,
        recompute=plan.config.recompute,
        step_time_s=step_time,
        forward_backward_time_s=timing.forward_backward_s,
        dp_allreduce_time_s=timing.dp_allreduce_s,
        grad_norm_time_s=timing.grad_norm_s,
        optimizer_time_s=result.optimizer_time_s,
        grad_norm=result.grad_norm,
        pipeline_bubble_fraction=bubble_fraction(plan.pp, m),
        samples_per_s=gbs / step_time,
        tokens_per_s=gbs * plan.seq_len / step_time,
        wall_clock_s=launch.wall(),
        **(gns.summary(gbs) if gns is not None and gns.ready else {}),
        **_step_norms(launch),
        sample_ids=global_batch.tolist() if launch.hooks.record_sample_ids else None,
    )


def _step_norms(launch: Launch) -> dict:
    n = launch.model.last_norms
    if launch.gns is None or n is None:
        return {}
    return {"gns_sq_small": n.sq_small, "gns_b_small": n.b_small, "gns_sq_big": n.sq_big, "gns_b_big": n.b_big}


def after_step(launch: Launch) -> None:
    """Evaluate when due (stopping at the target loss), then checkpoint when due, by steps or
    by the clock (rank 0's decides for all)."""
    plan, s = launch.plan, launch.state
    if Cadence(plan.eval_every_steps, plan.eval_every_samples).due(s.step, s.samples, launch.gbs):
        val = run_eval(launch)
        if plan.stop.target_val_loss is not None and val <= plan.stop.target_val_loss:
            launch.stop_reason = "target_val_loss"
    due = Cadence(plan.checkpoint_every_steps, plan.checkpoint_every_samples).due(s.step, s.samples, launch.gbs)
    if plan.checkpoint_every_s is not None:
        late = time.time() - launch.last_checkpoint_at >= plan.checkpoint_every_s
        due = _broadcast_flag(due or late, launch.model.device)
    if launch.stop_reason is None and due:
        checkpoint(launch)
        launch.last_checkpoint_at = time.time()


def skip_nonfinite_step(launch: Launch, result: StepResult) -> None:
    """A step whose loss or gradient norm was not finite made no update and left the noise
    scale alone. Its samples were consumed (the data position moves on, as a resumed run's
    would) and are counted as skipped. Too many in a row stop the run, with a checkpoint of the
    last finite weights."""
    s, gbs = launch.state, launch.gbs
    s.step += 1
    s.samples += gbs
    s.nonfinite_steps += 1
    s.skipped_samples += gbs
    launch.nonfinite_run += 1
    launch.emit(
        NonfiniteRecord(
            step=s.step,
            samples=s.samples,
            train_loss=result.loss,
            grad_norm=result.grad_norm,
            wall_clock_s=launch.wall(),
            consecutive=launch.nonfinite_run,
            nonfinite_steps=s.nonfinite_steps,
        )
    )
    if launch.nonfinite_run > launch.plan.stop.max_nonfinite_steps:
        checkpoint(launch)  # the weights are the last finite ones: a usable checkpoint
        raise NonFiniteLossError(
            f"stop.max_nonfinite_steps: {launch.nonfinite_run} consecutive steps with a non-finite loss or gradient "
            f"(last at step {s.step}, loss {result.loss}, gradient norm {result.grad_norm}); the "
            f"checkpoint at step {s.step} holds the last finite weights"
        )


def close_launch(launch: Launch, on_finish: Callable[[torch.nn.Module], None] | None) -> dict:
    """The final model's validation loss (always measured, but not when only the layout
    changes), a last checkpoint, and the end record; returns the final state."""
    s = launch.state
    if s.last_val_step != s.step and launch.stop_reason != "reconfigure":
        run_eval(launch)
    checkpoint(launch)
    if on_finish is not None:
        on_finish(launch.model.module)
    launch.model.close()  # a worker may train again in this process (tests, profiling): free the groups
    end = EndRecord.from_dict({**trainer_state(launch), "stop_reason": launch.stop_reason})
    launch.emit(end)
    return end.payload()
