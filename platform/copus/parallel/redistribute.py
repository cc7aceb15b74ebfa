"""Move model and optimiser state from one 3D layout to another inside the running ranks.

Both layouts live in the same process group (the world group): the old model and optimiser
are still intact, the new ones are allocated but unset. Each rank describes the boxes of the
global tensors it holds (old) and needs (new); an all-gather of those small descriptions lets
every rank compute the same transfer plan (`copus.core.transfer_plan`); then each round of the plan
is one batch of point-to-point sends and receives, one packed byte buffer per pair of ranks,
and the pieces a rank already holds are copied locally.

Why point-to-point pieces rather than DCP through storage or gathering whole tensors: a rank
receives only the slices its new shard needs (the bytes on the wire are the state that really
moves, never whole replicas), nothing touches storage, and it is the same code on gloo and
NCCL. `bench/reconfigure.py` measures it against checkpoint-and-restart.
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from copus.core.transfer_plan import Box, Holdings, ReshardError, plan_transfers, traffic

# State dicts here are flat: key -> tensor (plain or DTensor); non-tensor entries are ignored.
StateDict = dict[str, object]


def local_tensor(value: torch.Tensor) -> torch.Tensor:
    return value.to_local() if isinstance(value, DTensor) else value


def global_box(value: torch.Tensor) -> Box:
    """The part of the global (unsharded) tensor this rank holds: a DTensor's local shard, or
    the whole of a plain tensor."""
    if isinstance(value, DTensor):
        shape, offset = compute_local_shape_and_global_offset(value.shape, value.device_mesh, value.placements)
        return Box(tuple(offset), tuple(shape))
    return Box((0,) * value.dim(), tuple(value.shape))


def describe(state: StateDict) -> tuple[Holdings, dict[str, tuple[str, int]]]:
    """The box of each tensor this rank holds, and each tensor's (dtype, bytes per element)."""
    boxes, dtypes = {}, {}
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            boxes[key] = global_box(value)
            dtypes[key] = (str(value.dtype), value.element_size())
    return boxes, dtypes


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def redistribute(old: StateDict, new: StateDict, device: torch.device, round_bytes: int = 64 << 20) -> dict:
    """Fill every tensor of `new` (this rank's state in the new layout) from the tensors of
    `old` held across the world group. Collective over the default group. Returns traffic
    figures (bytes moved between ranks, copied locally, rounds)."""
    held, held_types = describe(old)
    needed, needed_types = describe(new)
    world = dist.get_world_size()
    gathered: list = [None] * world
    dist.all_gather_object(gathered, (held, held_types, needed, needed_types))
    itemsize: dict[str, int] = {}
    for _, types, _, new_types in gathered:
        for key, (dtype, size) in new_types.items():
            if key in types and types[key][0] != dtype:
                raise ReshardError(f"{key}: dtype {types[key][0]} in the old layout, {dtype} in the new one")
            itemsize[key] = size
        for key, (_, size) in types.items():
            itemsize.setdefault(key, size)
    rounds = plan_transfers([g[0] for g in gathered], [g[2] for g in gathered], itemsize, round_bytes)
    rank = dist.get_rank()
    with torch.no_grad():
        for transfers in rounds:
            _run_round(rank, transfers, old, new, device)
    return {**traffic(rounds, itemsize), "rounds": len(rounds)}


def _run_round(rank: int, transfers: list, old: StateDict, new: StateDict, device: torch.device) -> None:
    outgoing: dict[int, list] = defaultdict(list)
    incoming: dict[int, list] = defaultdict(list)
    for t in transfers:
        if t.src == rank and t.dst == rank:
            local_tensor(new[t.key])[t.piece.relative_to(t.needed)].copy_(
                local_tensor(old[t.key])[t.piece.relative_to(t.held)]
            )
        elif t.src == rank:
            outgoing[t.dst].append(t)
        elif t.dst == rank:
            incoming[t.src].append(t)
    ops, received = [], {}
    for dst in sorted(outgoing):
        buf = torch.cat([_as_bytes(local_tensor(old[t.key])[t.piece.relative_to(t.held)]) for t in outgoing[dst]])
        ops.append(dist.P2POp(dist.isend, buf.to(device), dst))
    for src in sorted(incoming):
        size = sum(t.piece.numel * local_tensor(new[t.key]).element_size() for t in incoming[src])
        received[src] = torch.empty(size, dtype=torch.uint8, device=device)
        ops.append(dist.P2POp(dist.irecv, received[src], src))
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    for src, buf in received.items():
        at = 0
        for t in incoming[src]:
            target = local_tensor(new[t.key])
            n = t.piece.numel * target.element_size()
            target[t.piece.relative_to(t.needed)].copy_(buf[at : at + n].view(target.dtype).reshape(t.piece.shape))
            at += n
