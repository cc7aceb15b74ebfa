"""Running the training loop without Ray: one process (or one rank of a process group the
caller set up), checkpoints kept in plain directories. Used by tests and benchmarks, and handy
for debugging a workload before putting it on a cluster."""

from __future__ import annotations

import multiprocessing
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
from copus.core.reconfiguration import BranchRequest, SwitchOrder
from copus.train.faults import Faults
from copus.train.loop import LoopHooks, run_training
from copus.train.worker_plan import WorkerPlan


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
    decide: Callable[[int, CandidateConfig], SwitchOrder | BranchRequest | None] | None = None,
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


# What every rank imports anyway (torch, torch.distributed.checkpoint, the training code): loaded
# once by multiprocessing's fork server, from which every rank is then forked. 8 ranks started as
# fresh interpreters on 2 cores spent ~25 s importing torch and copus before their first step.
FORKSERVER_PRELOAD = ["copus.train.local", "copus.train.gns", "copus.train.reshard_in_place"]
_FINISHED, _ALL_FINISHED = "copus/ranks_finished", "copus/all_finished"


def _rank_main(rank: int, world: int, store_file: str, out_file: str, fn: Callable, args: tuple) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    # accelerate reads the process layout from the environment, as under torchrun or Ray.
    os.environ.update(
        {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world)}
    )
    store = dist.FileStore(store_file, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    torch.save(fn(*args), f"{out_file}.{rank}")
    wait_for_every_rank(store, world)
    # Leave without tearing anything down: every rank is past its last collective, so no peer
    # waits on this one's sockets; gloo's and the interpreter's teardown only add risk (once in
    # CI a finished rank aborted there, "terminate called without an active exception").
    os._exit(0)


def wait_for_every_rank(store: dist.Store, world: int) -> None:
    """Block until all `world` ranks have called this, through the store, not the process
    group. A gloo barrier here is itself a collective in flight when the first rank to leave it
    exits and closes its connections: a peer still inside it then failed with "Connection closed
    by peer" (tests/workloads/test_hf_layouts.py on 8 ranks, a few runs in a hundred)."""
    if store.add(_FINISHED, 1) == world:
        store.set(_ALL_FINISHED, "1")
    store.wait([_ALL_FINISHED])


def run_on_gloo_ranks(world: int, fn: Callable, *args) -> list:
    """Run fn(*args) on `world` local gloo processes (fn must be importable); return every
    rank's result. With world 1 it runs here, without a process group. Tests and benchmarks.
    Each call gets new processes (forked from a fork server that has the training code
    imported) and a new process group."""
    if world == 1:
        return [fn(*args)]
    multiprocessing.set_forkserver_preload(FORKSERVER_PRELOAD)  # effective when the server starts
    tmp = tempfile.mkdtemp(prefix="copus-spawn-")
    try:
        out = os.path.join(tmp, "out")
        rank_args = (world, os.path.join(tmp, "store"), out, fn, args)
        mp.start_processes(_rank_main, args=rank_args, nprocs=world, join=True, start_method="forkserver")
        return [torch.load(f"{out}.{r}", weights_only=False) for r in range(world)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
