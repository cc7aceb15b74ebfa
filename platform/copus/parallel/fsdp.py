"""Sharded data parallelism (`dp_shard`) with FSDP2, `torch.distributed.fsdp.fully_shard`, over
the dp sub-mesh, composed with tensor and pipeline parallelism as torchtitan does: tensor-parallel
parameters (DTensors on the tp mesh) become 2-D (dp, tp) DTensors; a pipeline stage is sharded
like a whole model, and torch.distributed.pipelining drives FSDP's gradient sync itself.

Units: each transformer block, the embedding, the final norm with the LM head (one unit with the
embedding when the two share a weight: a parameter belongs to one unit), then the root.

Two modes, one mechanism:
- "full" (ZeRO-3): parameters, gradients and AdamW state sharded over dp. A unit is all-gathered
  before its forward and again before its backward, and freed after each.
- "optimizer": AdamW state and gradients sharded, parameters all-gathered once per step and kept
  whole through every micro-batch's forward and backward (`reshard_after_forward=False`, and no
  reshard after a backward but the step's last): ZeRO-2 semantics, which include ZeRO-1's saving.
  Why FSDP2 and not torch's ZeroRedundancyOptimizer: ZeRO assigns whole parameters to ranks, holds
  plain tensors and must consolidate its state on one rank to save it, so neither DCP's
  get_state_dict/set_state_dict (state keyed by parameter name, resharded on load) nor the in-place
  reshard (boxes of DTensor shards) can use it, and it does not take tensor-parallel DTensors. Under
  FSDP2 every mode's state is DTensors keyed by parameter name: checkpoints and in-place reshards
  move between modes and layouts with no special case.

FSDP2 averages gradients over dp in its reduce-scatter, so the sharded gradients are the
replica-averaged ones: the optimiser and the norm see them as in the unsharded modes.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard

SHARDED_MODES = ("optimizer", "full")


def apply_fsdp(model: nn.Module, dp_mesh: DeviceMesh, mode: str) -> nn.Module:
    """Shard a (possibly cut, possibly tensor-parallel) Llama stage over `dp_mesh` in place."""
    if mode not in SHARDED_MODES:
        raise ValueError(f"parallel.dp_shard: {mode!r} is not a sharded mode ({', '.join(SHARDED_MODES)})")
    reshard = mode == "full"

    def shard(modules) -> None:
        fully_shard(modules, mesh=dp_mesh, reshard_after_forward=reshard)

    embed, norm, head = model.tok_embeddings, model.norm, model.output
    if embed is not None and head is not None and head.weight is embed.weight:
        shard([embed, norm, head])  # tied weights: one unit, or the weight would belong to two
    else:
        if embed is not None:
            shard(embed)
        if head is not None:
            shard([norm, head])
    for block in model.layers.values():
        shard(block)
    shard(model)  # the root: it owns no parameter left, and finishes each backward's reductions
    return model


def units(model: nn.Module) -> list[FSDPModule]:
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def set_microbatch_sync(model: nn.Module, last: bool, keep_unsharded: bool) -> None:
    """Before a micro-batch's backward outside a pipeline schedule (the schedule does this itself):
    gradients accumulate unsharded and are reduce-scattered once, in the step's last backward.
    `keep_unsharded` (optimizer mode) also keeps the parameters whole until then, so a step
    all-gathers each unit once."""
    assert isinstance(model, FSDPModule)
    model.set_requires_gradient_sync(last)
    model.set_is_last_backward(last)
    model.set_reshard_after_backward(last or not keep_unsharded)


def reshard_all(model: nn.Module) -> None:
    """Free every unit's whole parameters. A forward without gradients (evaluation) leaves them
    gathered in optimizer mode; they would go stale once the sharded ones change (an optimiser
    step, a checkpoint load, an in-place reshard)."""
    for unit in units(model):
        unit.reshard()


def unsharded_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The whole parameters FSDP computes with (one Parameter object per parameter, kept by FSDP
    from one all-gather to the next): their gradients are this replica's own, before the
    reduce-scatter averages them over dp. Collective over the dp group (each unit is gathered once)."""
    fsdp_units = units(model)
    for unit in fsdp_units:
        unit.unshard()
    params = [p for p in model.parameters() if p.requires_grad]
    for unit in fsdp_units:
        unit.reshard()
    return params
