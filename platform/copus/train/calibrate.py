"""The training side of `copus calibrate`: a reference run that leaves checkpoints at the
branch points, the noise scale measured at each, and continuations from a branch point at a
given GBS until the validation loss has dropped by the decrement.

All of it runs in one process on one layout (1, 1, 1): every layout gives the same losses
(the engine's equivalence tests), and the statistics of a batch size do not depend on how it
is spread over ranks. The cluster layer (`copus.cluster.calibrate`) runs these functions as
Ray Tune trials. No Ray here.
"""

from __future__ import annotations

import math
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

from copus.core.calibration import crossing_unresolved, finer_evaluation, smoothed_crossing
from copus.train.gns import measure_gns
from copus.train.loop import LoopHooks, run_training
from copus.train.worker_plan import GNSPlan, StopRule, WorkerPlan

# Samples of the data order between seeds: seed k of a continuation reads the data that
# follows the branch point shifted by k blocks, so the seeds see independent samples.
SEED_DATA_STRIDE = 100_003


def single_process_plan(
    plan: WorkerPlan, gbs: int, mbs: int, eval_every_samples: int, val_samples: int, stop: StopRule, gns_enabled: bool
) -> WorkerPlan:
    return plan.replaced(
        dp=1,
        tp=1,
        pp=1,
        gbs=gbs,
        mbs=mbs,
        eval_every_steps=max(1, eval_every_samples // gbs),
        eval_every_samples=None,  # the cadence above, not the experiment's (which would win over it)
        val_samples=val_samples,
        stop=stop,
        checkpoint_every_steps=10**9,
        checkpoint_every_samples=None,
        checkpoint_every_s=None,
        ramp=None,
        report_every_steps=1,
        gns=replace(plan.gns, enabled=gns_enabled),
    )


def continuation_mbs(gbs: int, needs_two_microbatches: bool) -> int:
    """The micro-batch of a continuation: one micro-batch per step (fastest on one process),
    two when the LR rule needs the noise scale (adascale), which needs two batch sizes."""
    if needs_two_microbatches and gbs >= 2 and gbs % 2 == 0:
        return gbs // 2
    return gbs


def reference_run(
    plan: WorkerPlan, branch_samples: list[int], out_dir: Path, val_samples: int, records: list[dict] | None = None
) -> list[dict]:
    """Train at the plan's reference GBS from scratch, keeping a checkpoint and the validation
    loss at every branch point (sample counts, multiples of the reference GBS). Returns, per
    branch point: step, samples, val_loss, b_noise_run (the run's smoothed noise scale there),
    checkpoint path. `records` (optional) receives the run's records."""
    b0 = plan.gns.reference_gbs or plan.gbs
    steps = [s // b0 for s in branch_samples]
    every = math.gcd(*steps)
    ref = single_process_plan(
        plan, b0, max(1, b0 // 4), every * b0, val_samples, StopRule(max_samples=max(branch_samples)), gns_enabled=True
    )
    ref = replace(ref, eval_every_steps=every, checkpoint_every_steps=every)
    records = [] if records is None else records
    wanted = set(steps)

    def persist(path: Path, metrics: dict) -> None:
        if metrics["step"] in wanted:
            shutil.copytree(path, out_dir / f"step{metrics['step']}", dirs_exist_ok=True)

    out_dir.mkdir(parents=True, exist_ok=True)
    run_training(ref, LoopHooks(emit=records.append, persist_checkpoint=persist))
    evals = {r["step"]: r["val_loss"] for r in records if r["kind"] == "eval"}
    noise = {r["step"]: r.get("b_noise", float("nan")) for r in records if r["kind"] == "step"}
    return [
        {
            "step": s,
            "samples": s * b0,
            "val_loss": evals[s],
            "b_noise_run": noise.get(s, float("nan")),
            "checkpoint": str(out_dir / f"step{s}"),
        }
        for s in steps
    ]


def branch_noise_scales(plan: WorkerPlan, checkpoint: Path, steps: int) -> dict:
    """B_noise at the branch point's weights (no update), raw and Adam-preconditioned, over
    `steps` batches of the reference GBS in 4 micro-batches; each with its 95% interval over
    the batches (`b_noise_low`, `b_noise_high`, ...)."""
    b0 = plan.gns.reference_gbs or plan.gbs
    out = {}
    for name, precondition in (("b_noise", "none"), ("b_noise_adam", "adam")):
        p = plan.replaced(
            dp=1,
            tp=1,
            pp=1,
            gbs=b0,
            mbs=max(1, b0 // 4),
            gns=GNSPlan(True, plan.gns.smoothing, plan.gns.critical_factor, precondition, b0),
        )
        measured = measure_gns(p, steps, resume_from=checkpoint)
        out |= {
            name: measured["b_noise"],
            f"{name}_low": measured["b_noise_low"],
            f"{name}_high": measured["b_noise_high"],
        }
    return out


def continue_branch(
    plan: WorkerPlan,
    checkpoint: Path,
    start: dict,
    gbs: int,
    seed_index: int,
    decrement: float,
    max_samples: int,
    eval_every_samples: int,
    val_samples: int,
    lr_factor: float = 1.0,
) -> dict:
    """From the branch checkpoint, train at `gbs` (the plan's LR rule, times `lr_factor`) until the validation loss's
    trend is `decrement` below the branch point's; samples and steps that took (NaN when
    `max_samples` ran out first), and the validation curve. The run goes on to a third of the
    decrement further, so the trend is seen on both sides of the crossing
    (`copus.core.calibration.smoothed_crossing`).

    A crossing at or before the first evaluation is not resolved by the evaluations (it would be
    read off the branch point and one evaluation): the continuation runs again with evaluations
    closer together (`finer_evaluation`, down to every step; `refined` says so). Still unresolved
    with an evaluation every step, it is recorded as not measurable: samples NaN, and the reason
    in `unmeasurable`."""
    run = _Continuation(plan, checkpoint, start, gbs, seed_index, decrement, max_samples, val_samples, lr_factor)
    every, spent, refined = eval_every_samples, 0.0, False
    while True:
        result = run.once(every)
        spent += result["wall_clock_s"]
        unresolved = crossing_unresolved(result["curve_samples"], result["samples"])
        finer = finer_evaluation(every, gbs) if unresolved else None
        if finer is None:
            break
        every, refined = finer, True
    reason = None
    if unresolved:
        reason = f"the decrement was reached within the first evaluation, {result['curve_samples'][1]:.0f} samples"
        result.update(samples=float("nan"), steps=float("nan"))
    return {**result, "wall_clock_s": spent, "eval_every_samples": every, "refined": refined, "unmeasurable": reason}


@dataclass(frozen=True)
class _Continuation:
    """One continuation of `continue_branch`, to run at a given evaluation interval."""

    plan: WorkerPlan
    checkpoint: Path
    start: dict
    gbs: int
    seed_index: int
    decrement: float
    max_samples: int
    val_samples: int
    lr_factor: float = 1.0  # the LR probe's: times the rule's LR at this GBS

    def once(self, eval_every_samples: int) -> dict:
        """One continuation run of `continue_branch`, its crossing as read off its evaluations."""
        target = self.start["val_loss"] - self.decrement
        overshoot = self.decrement / 3
        adascale = self.plan.lr.scaling == "adascale"
        mbs = continuation_mbs(self.gbs, adascale)
        stop = StopRule(target_val_loss=target - overshoot, max_samples=self.start["samples"] + self.max_samples)
        run_plan = single_process_plan(
            self.plan, self.gbs, mbs, eval_every_samples, self.val_samples, stop, gns_enabled=adascale
        )
        if self.lr_factor != 1.0:
            run_plan = replace(run_plan, lr=replace(run_plan.lr, base_lr=run_plan.lr.base_lr * self.lr_factor))
        records: list[dict] = []
        t = time.perf_counter()
        hooks = LoopHooks(
            emit=records.append,
            resume_from=self.checkpoint,
            batch_size=lambda *_: (self.gbs, mbs),
            data_offset=self.seed_index * SEED_DATA_STRIDE,
        )
        run_training(run_plan, hooks)  # its checkpoints go nowhere: the default persist hook drops them
        curve = [(self.start["samples"], self.start["val_loss"])] + [
            (r["samples"], r["val_loss"]) for r in records if r["kind"] == "eval"
        ]
        crossed = smoothed_crossing([s for s, _ in curve], [v for _, v in curve], target, overshoot)
        used = crossed - self.start["samples"] if math.isfinite(crossed) else float("nan")
        return {
            "gbs": self.gbs,
            "seed": self.seed_index,
            "samples": used,
            "steps": used / self.gbs if math.isfinite(used) else float("nan"),
            "reached": math.isfinite(used),
            "target_val_loss": target,
            "wall_clock_s": time.perf_counter() - t,
            "curve_samples": [s - self.start["samples"] for s, _ in curve],
            "curve_val_loss": [v for _, v in curve],
        }
