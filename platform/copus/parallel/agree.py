"""Every rank reaching the same answer: a value reduced over the default process group."""

from __future__ import annotations

import torch
import torch.distributed as dist


def agree(value: float, device: torch.device, op=dist.ReduceOp.MAX) -> float:
    """`value` reduced over all ranks (itself without a process group)."""
    if not (dist.is_available() and dist.is_initialized()):
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op)
    return float(t.item())


def all_ranks_ok(ok: bool, device: torch.device) -> bool:
    """True when `ok` holds on every rank."""
    return agree(1.0 if ok else 0.0, device, dist.ReduceOp.MIN) > 0
