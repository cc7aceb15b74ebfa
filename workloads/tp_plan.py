"""The tensor-parallel plan of the Llama-style model (Megatron style, no sequence parallel):

- attention q/k/v: column-wise (each rank owns a slice of heads); output: row-wise
- MLP gate/up (w1, w3): column-wise; down (w2): row-wise
- token embedding: row-wise over the vocabulary, output all-reduced (replicated)
- LM head: column-wise over the vocabulary, logits gathered (replicated) for the loss
- RMSNorm weights: replicated (plain tensors, computed identically on every tp rank)

Only modules present on this pipeline stage get an entry.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel


def llama_tp_plan(model: nn.Module) -> dict[str, ParallelStyle]:
    plan: dict[str, ParallelStyle] = {}
    if getattr(model, "tok_embeddings", None) is not None:
        plan["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    for name in model.layers:
        prefix = f"layers.{name}"
        for proj in ("wq", "wk", "wv"):
            plan[f"{prefix}.attention.{proj}"] = ColwiseParallel()
        plan[f"{prefix}.attention.wo"] = RowwiseParallel()
        plan[f"{prefix}.feed_forward.w1"] = ColwiseParallel()
        plan[f"{prefix}.feed_forward.w3"] = ColwiseParallel()
        plan[f"{prefix}.feed_forward.w2"] = RowwiseParallel()
    if getattr(model, "output", None) is not None:
        plan["output"] = ColwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    return plan
