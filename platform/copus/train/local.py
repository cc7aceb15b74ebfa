"""Running the training loop without Ray: one process (or one rank of a process group the
caller set up), checkpoints kept in plain directories. Used by tests and benchmarks, and handy
for debugging a workload before putting it on a cluster."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor

from copus.core.layout import CandidateConfig
from copus.train.faults import Faults
from copus.train.loop import LoopHooks, run_training
from copus.train.plan import WorkerPlan


def persist_into(root: Path) -> Callable[[Path, dict], None]:
    """A persist hook that keeps each checkpoint in root/step<N> (all ranks' files merged, as
    Ray Train does in its storage)."""

    def persist(path: Path, metrics: dict) -> None:
        shutil.copytree(path, root / f"step{metrics['step']}", dirs_exist_ok=True)

    return persist


def run_local(
    plan: WorkerPlan,
    ckpt_root: Path,
    resume_step: int | None = None,
    batch_size: Callable[[int, int, int, int], tuple[int, int]] | None = None,
    decide: Callable[[int, CandidateConfig], dict | None] | None = None,
    faults: Faults = Faults(),
    data_offset: int = 0,
) -> tuple[list[dict], dict, dict]:
    """Train; return (rank 0's metrics records, final state, final parameters on the CPU).
    `decide` stands in for the controller (asked on rank 0 at every step boundary)."""
    records: list[dict] = []
    params: dict[str, torch.Tensor] = {}

    def keep_params(model: torch.nn.Module) -> None:
        # Full tensors (a collective for tensor-parallel shards); a pipeline stage has only its own.
        for name, p in model.named_parameters():
            full = p.full_tensor() if isinstance(p, DTensor) else p
            params[name] = full.detach().cpu().clone()

    hooks = LoopHooks(
        emit=records.append,
        persist_checkpoint=persist_into(ckpt_root),
        resume_from=ckpt_root / f"step{resume_step}" if resume_step is not None else None,
        batch_size=batch_size,
        decide=decide,
        faults=faults,
        data_offset=data_offset,
    )
    final = run_training(plan, hooks, on_finish=keep_params)
    return records, final, params


def _rank_main(rank: int, world: int, init_file: str, out_file: str, fn: Callable, args: tuple) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    # accelerate reads the process layout from the environment, as under torchrun or Ray.
    os.environ.update(
        {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world)}
    )
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.save(fn(*args), f"{out_file}.{rank}")
        dist.barrier()  # nobody tears down while a peer still talks
    finally:
        dist.destroy_process_group()
    # Skip interpreter teardown: once in CI a finished rank aborted there ("terminate called
    # without an active exception", gloo threads at exit) after its result was saved.
    os._exit(0)


def run_on_gloo_ranks(world: int, fn: Callable, *args) -> list:
    """Run fn(*args) on `world` local gloo processes (fn must be importable); return every
    rank's result. With world 1 it runs here, without a process group. Tests and benchmarks."""
    if world == 1:
        return [fn(*args)]
    tmp = tempfile.mkdtemp(prefix="copus-spawn-")
    out = os.path.join(tmp, "out")
    mp.spawn(_rank_main, args=(world, os.path.join(tmp, "init"), out, fn, args), nprocs=world, join=True)
    return [torch.load(f"{out}.{r}", weights_only=False) for r in range(world)]
