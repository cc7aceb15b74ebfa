"""In-place reconfiguration: the running ranks switch to another 3D layout without leaving
their processes.

At a step boundary every rank (having agreed on the target through rank 0's broadcast) builds
the new layout next to the old one: a new DeviceMesh and its process groups, this rank's new
pipeline stage and tensor-parallel shards (and dp shards, under `dp_shard`) allocated but not
initialised, a fresh optimiser. Model and AdamW state then move from the old layout to the new
one (`copus.parallel.redistribute`: only the slices each rank's new shard needs, point to point)
and are applied with the same `set_state_dict` a checkpoint load uses, which is what makes the
continuation numerically the one a restart from checkpoint gives. Sharded data parallelism
(FSDP2) needs nothing special: its state is DTensors on a (dp, tp) mesh, whose boxes the transfer
plan reads like any other, so a change may also switch `dp_shard` (and `recompute`) either way.
Only then is the old layout let go (its process groups destroyed), so a failure on any rank
leaves the old model intact: every rank learns of it through one all-reduce and the caller can
fall back to checkpoint-and-restart.
"""

from __future__ import annotations

import gc
import time

import torch
import torch.distributed as dist

from copus.core.layout import CandidateConfig
from copus.parallel.agree import all_ranks_ok
from copus.parallel.dims import ParallelDims, clear_mesh_caches
from copus.parallel.redistribute import redistribute
from copus.train.checkpoint import apply_layout_free_state, layout_free_state
from copus.train.host import process_memory
from copus.train.parallel_model import ParallelModel
from copus.train.worker_plan import WorkerPlan


class ReshardFailed(RuntimeError):
    """The in-place path failed on at least one rank; the old layout is intact on all."""


class InjectedReshardFault(RuntimeError):
    """Raised on purpose (COPUS_INJECT_RESHARD_FAILURE) to exercise the fallback."""


def _flat(state: dict) -> dict:
    """{"model": {...}, "optim": {...}} as one dict of the same tensor objects."""
    return {f"{part}/{key}": value for part, values in state.items() for key, value in values.items()}


def reshard_in_place(
    model: ParallelModel,
    optimizer: torch.optim.Optimizer,
    plan: WorkerPlan,
    target: CandidateConfig,
    make_optimizer,
    fail: bool = False,
) -> tuple[ParallelModel, torch.optim.Optimizer, dict]:
    """Move this rank's part of the model and optimiser from `model`'s layout to `target`'s.
    Collective over the world group. Returns the new model and optimiser (the old ones are
    closed) and figures: bytes moved, copied locally, rounds, seconds, this process's memory
    (with the old layout still alive). Raises ReshardFailed on
    every rank when it failed on any; `fail` makes rank 0 fail after the state has moved."""
    t = time.perf_counter()
    dims = ParallelDims(target.dp, target.tp, target.pp)
    dims.validate(plan.flavour.shape(), world_size=dist.get_world_size(), gbs=target.gbs, mbs=target.mbs)
    new_model = new_optimizer = None
    error: BaseException | None = None
    try:
        old_state = _flat(layout_free_state(model.module, optimizer))
        clear_mesh_caches()  # from here on, DTensor ops of the new layout only (see clear_mesh_caches)
        new_model = ParallelModel(
            plan.flavour,
            plan.seq_len,
            plan.seed,
            dims,
            model.device,
            plan.pp_schedule,
            model.autocast_factory,
            initialize=False,
            dp_shard=target.dp_shard,
            recompute=target.recompute,
        )
        new_optimizer = make_optimizer(new_model)
        new_state = layout_free_state(new_model.module, new_optimizer)
        stats = redistribute(old_state, _flat(new_state), model.device)
        if fail and dist.get_rank() == 0:
            raise InjectedReshardFault("injected failure after the state moved (COPUS_INJECT_RESHARD_FAILURE)")
        apply_layout_free_state(new_model.module, new_optimizer, new_state)
    except Exception as err:  # reported to every rank below, then raised as ReshardFailed
        error = err
    if not all_ranks_ok(error is None, model.device):
        if new_model is not None:
            new_model.close()
        new_model = new_optimizer = None
        gc.collect()
        raise ReshardFailed(f"{type(error).__name__}: {error}" if error else "another rank failed") from error
    model.close()
    return new_model, new_optimizer, {**stats, "reshard_s": time.perf_counter() - t, **process_memory()}
