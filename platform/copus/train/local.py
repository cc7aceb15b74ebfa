"""Running the training loop without Ray: one process (or one rank of a process group the
caller set up), checkpoints kept in plain directories. Used by tests and benchmarks, and handy
for debugging a workload before putting it on a cluster."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

import torch
from torch.distributed.tensor import DTensor

from copus.core.throughput import Config
from copus.train.faults import Faults
from copus.train.loop import LoopHooks, run_training
from copus.train.plan import WorkerPlan


def persist_into(root: Path) -> Callable[[Path, dict], None]:
    """A persist hook that keeps each checkpoint in root/step<N> (all ranks' files merged, as
    Ray Train does in its storage)."""
    def persist(path: Path, metrics: dict) -> None:
        shutil.copytree(path, root / f"step{metrics['step']}", dirs_exist_ok=True)
    return persist


def run_local(plan: WorkerPlan, ckpt_root: Path, resume_step: int | None = None,
              batch_size: Callable[[int, int, int, int], tuple[int, int]] | None = None,
              decide: Callable[[int, Config], dict | None] | None = None,
              faults: Faults = Faults()) -> tuple[list[dict], dict, dict]:
    """Train; return (rank 0's metrics records, final state, final parameters on the CPU).
    `decide` stands in for the controller (asked on rank 0 at every step boundary)."""
    records: list[dict] = []
    params: dict[str, torch.Tensor] = {}

    def keep_params(model: torch.nn.Module) -> None:
        # Full tensors (a collective for tensor-parallel shards); a pipeline stage has only its own.
        for name, p in model.named_parameters():
            full = p.full_tensor() if isinstance(p, DTensor) else p
            params[name] = full.detach().cpu().clone()

    hooks = LoopHooks(emit=records.append, persist_checkpoint=persist_into(ckpt_root),
                      resume_from=ckpt_root / f"step{resume_step}" if resume_step is not None else None,
                      batch_size=batch_size, decide=decide, faults=faults)
    final = run_training(plan, hooks, on_finish=keep_params)
    return records, final, params
