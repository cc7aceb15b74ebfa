"""Tensor parallelism with DTensor: apply a per-model plan on the tp mesh."""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ParallelStyle, parallelize_module


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh, plan: dict[str, ParallelStyle]) -> nn.Module:
    """Shard `model` in place over `tp_mesh` following `plan` (module FQN -> style)."""
    if tp_mesh.size() == 1:
        return model
    return parallelize_module(model, tp_mesh, plan)
