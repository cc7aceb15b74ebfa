"""Gradient collectives under 3D parallelism: data-parallel averaging, and squared norms that
count every parameter exactly once (tensor-parallel shards summed over tp, replicated
parameters taken from one tp rank, stages summed over pp, and, under sharded data parallelism,
dp shards summed over dp). The GNS probe builds on the same norm."""

from __future__ import annotations

from typing import Callable, Iterable

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed import ProcessGroup
from torch.distributed.tensor import DTensor


def local_grad(p: torch.nn.Parameter) -> torch.Tensor | None:
    g = p.grad
    if g is None:
        return None
    return g.to_local() if isinstance(g, DTensor) else g


def is_tp_sharded(t: torch.Tensor) -> bool:
    """Whether each tp rank holds its own part of `t` (count it on every tp rank) rather than a
    copy (count it on tp rank 0 only). Under sharded data parallelism a DTensor lives on a (dp, tp)
    or a dp-only mesh: only its placement on the tp dimension, when it has one, says."""
    if not isinstance(t, DTensor):
        return False
    names = t.device_mesh.mesh_dim_names
    if names and "tp" in names:
        return t.placements[names.index("tp")].is_shard()
    if names and "dp" in names:
        return False  # sharded over dp only: a copy on every tp rank
    return any(pl.is_shard() for pl in t.placements)


def align_grad_placement(p: torch.nn.Parameter) -> None:
    """Give a DTensor gradient its parameter's placement. A vocabulary-sharded embedding receives
    a replicated gradient from autograd; sharding it (a local slice, no communication) keeps each
    rank's gradient, norm share and optimiser update to its shard."""
    g = p.grad
    if isinstance(g, DTensor) and isinstance(p, DTensor) and g.placements != p.placements:
        p.grad = g.redistribute(device_mesh=p.device_mesh, placements=p.placements)


def align_grad_placements(params: Iterable[torch.nn.Parameter]) -> None:
    for p in params:
        align_grad_placement(p)


def all_reduce_mean(tensors: list[torch.Tensor], group: ProcessGroup | None, size: int) -> None:
    """Average tensors in place over `group` with one collective per dtype (a flat bucket)."""
    if size == 1 or not tensors:
        return
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    for bucket in by_dtype.values():
        flat = _flatten_dense_tensors(bucket)
        dist.all_reduce(flat, group=group)
        flat.div_(size)
        for t, reduced in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
            t.copy_(reduced)


def average_data_parallel_grads(params: Iterable[torch.nn.Parameter], dp_group: ProcessGroup | None, dp: int) -> None:
    all_reduce_mean([g for g in (local_grad(p) for p in params) if g is not None], dp_group, dp)


def sq_norm_local(tensors_and_sharded: Iterable[tuple[torch.Tensor, bool]], tp_rank: int) -> torch.Tensor:
    """This rank's share of a squared norm: shards always, replicated tensors on tp rank 0 only."""
    total = None
    for t, sharded in tensors_and_sharded:
        if sharded or tp_rank == 0:
            part = t.float().pow(2).sum()
            total = part if total is None else total + part
    return total if total is not None else torch.zeros(())


Preconditioner = Callable[[torch.nn.Parameter], "torch.Tensor | None"]


def grad_sq_norm_local(
    params: list[torch.nn.Parameter], tp_rank: int, precondition: Preconditioner | None = None
) -> torch.Tensor:
    """This rank's share of the squared gradient norm (see sq_norm_local). `precondition`
    gives, per parameter, a local tensor to divide the gradient by (Adam's sqrt(v_hat) + eps)."""
    pairs = []
    for p in params:
        g = local_grad(p)
        if g is None:
            continue
        divisor = precondition(p) if precondition is not None else None
        pairs.append((g / divisor if divisor is not None else g, is_tp_sharded(p.grad)))
    total = sq_norm_local(pairs, tp_rank)
    return total.to(pairs[0][0].device) if pairs else total


def sum_over(total: torch.Tensor, groups: list[ProcessGroup | None]) -> torch.Tensor:
    for group in groups:
        dist.all_reduce(total, group=group)
    return total


def grad_sq_norm(
    params: list[torch.nn.Parameter],
    tp_rank: int,
    groups: list[ProcessGroup | None],
    precondition: Preconditioner | None = None,
) -> torch.Tensor:
    """Squared L2 norm of the whole model's gradient, identical on every rank of a replica:
    summed over the tp and pp `groups` (pass the ones with more than one rank)."""
    return sum_over(grad_sq_norm_local(params, tp_rank, precondition), groups)


def clip_grads_(params: list[torch.nn.Parameter], max_norm: float, total_sq_norm: torch.Tensor) -> float:
    """Scale gradients so the global norm is at most max_norm (as torch's clip_grad_norm_)."""
    norm = total_sq_norm.sqrt()
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for p in params:
        g = local_grad(p)
        if g is not None:
            g.mul_(coef.to(g.device))
    return float(norm)
