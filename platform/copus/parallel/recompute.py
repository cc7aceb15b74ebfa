"""Activation recomputation (`recompute`) per transformer block, with torch.utils.checkpoint.

- "full": a block keeps only its input for backward and reruns its whole forward there
  (non-reentrant checkpointing of each block).
- "selective": torch's selective activation checkpointing over each block, with one rule: the
  outputs of matrix multiplies (every linear projection: q, k, v, attention output, gate, up,
  down) and of collectives are kept, everything else is rebuilt in backward: the attention core
  (rotary embedding, scaled dot-product attention), the SwiGLU activation (SiLU and product),
  the RMSNorms and the residual sums. This is Megatron's selective recomputation (rebuild what
  is cheap to compute and large to keep, never a matmul) stated as an operator rule, as
  torchtitan's "op" policy does; no collective is ever repeated in backward.

The wrapper is handed to each block (`TransformerBlock.recompute`) instead of wrapping the
block in a module (torch's checkpoint_wrapper): parameter names stay those of the plain model,
which checkpoints, pipeline cuts and tensor-parallel plans are keyed by. It sits inside the
block's forward, below FSDP's hooks, so a recomputation uses the parameters FSDP gathered for
backward and gathers nothing itself.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

RECOMPUTE_MODES = ("none", "selective", "full")

_KEEP = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops._c10d_functional.all_reduce.default,
    torch.ops._c10d_functional.all_gather_into_tensor.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
}


def _keep_matmuls(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in _KEEP else CheckpointPolicy.PREFER_RECOMPUTE


def full_recompute(fn: Callable, *args):
    return checkpoint(fn, *args, use_reentrant=False)


def selective_recompute(fn: Callable, *args):
    return checkpoint(
        fn, *args, use_reentrant=False, context_fn=partial(create_selective_checkpoint_contexts, _keep_matmuls)
    )


WRAPPERS: dict[str, Callable | None] = {"none": None, "selective": selective_recompute, "full": full_recompute}


def apply_recompute(model: nn.Module, mode: str) -> nn.Module:
    """Set every transformer block of a (possibly cut) model to recompute per `mode`."""
    if mode not in WRAPPERS:
        raise ValueError(f"parallel.recompute: unknown mode {mode!r} (known: {', '.join(RECOMPUTE_MODES)})")
    for block in model.layers.values():
        block.recompute = WRAPPERS[mode]
    return model
