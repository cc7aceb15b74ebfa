"""A probe: the run's training continued from one of its checkpoints at another GBS, in one
process, while the run itself goes on. The controller (`copus.cluster.probes`) sets the
probe's per-step training losses against the run's own from the same checkpoint
(`copus.core.counterfactual`): the gain in samples to a matched loss of the larger GBS over the
smaller one, which is what the critical batch predicts.

The probe reads the run's data from the checkpoint's position on (the same samples in the same
order), trains under the run's LR rule at its GBS, and neither evaluates nor checkpoints: its
per-step losses are the measurement. One process, layout (1, 1, 1): every layout gives the
same losses (the engine's equivalence tests). No Ray here.
"""

from __future__ import annotations

from pathlib import Path

from copus.train.calibrate import continuation_mbs, single_process_plan
from copus.train.checkpoint import read_trainer_state
from copus.train.loop import LoopHooks, run_training
from copus.train.worker_plan import StopRule, WorkerPlan

NO_EVALUATION = 10**12  # samples between evaluations: none within a probe


def run_probe(plan: WorkerPlan, checkpoint: Path, gbs: int, samples: int) -> dict:
    """Train `samples` samples at `gbs` from `checkpoint`. Returns where it started
    (`start_samples`, `start_step`), its GBS and micro-batch, and its curve: per step, the
    samples seen (counted as the run counts them) and the training loss."""
    start = read_trainer_state(checkpoint)
    adascale = plan.lr.scaling == "adascale"
    mbs = continuation_mbs(gbs, adascale)  # one micro-batch per step (two for AdaScale's gain)
    stop = StopRule(max_samples=int(start["samples"]) + samples)
    probe_plan = single_process_plan(plan, gbs, mbs, NO_EVALUATION, plan.val_samples, stop, gns_enabled=adascale)
    records: list[dict] = []
    hooks = LoopHooks(emit=records.append, resume_from=checkpoint, batch_size=lambda *_: (gbs, mbs))
    run_training(probe_plan, hooks)  # its checkpoints go nowhere: the default persist hook drops them
    steps = [r for r in records if r["kind"] == "step"]
    return {
        "start_samples": int(start["samples"]),
        "start_step": int(start["step"]),
        "gbs": gbs,
        "mbs": mbs,
        "samples": [int(r["samples"]) for r in steps],
        "train_loss": [float(r["train_loss"]) for r in steps],
    }
