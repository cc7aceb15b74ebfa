"""What each rank runs in tests/workloads/test_hf_layouts.py. Its own module with few imports:
every spawned rank imports it, and 8 ranks on 2 cores pay for each import 8 times."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from copus.parallel.dims import ParallelDims
from copus.train.checkpoint import save_checkpoint
from copus.train.parallel_model import ParallelModel
from tests.workloads.hf_helpers import SEQ
from workloads.hf_config import flavour_from_config


@torch.no_grad()
def chained_logits(model: ParallelModel, tokens: torch.Tensor) -> torch.Tensor:
    """The whole model's logits on every rank: each stage runs on the previous stage's output,
    broadcast over the pipeline group."""
    module = model.module.eval()
    if model.dims.pp == 1:
        return module(tokens)
    h = tokens
    for stage in range(model.dims.pp):
        last = stage == model.dims.pp - 1
        out = (
            module(h)
            if model.pp_rank == stage
            else torch.empty(*tokens.shape, module.flavour.vocab_size if last else module.flavour.dim)
        )
        dist.broadcast(out, src=dist.get_global_rank(model.pp_group, stage), group=model.pp_group)
        h = out
    return h


def logits_per_layout(layouts: list, dirs: dict, tokens: torch.Tensor, checkpoint: str | None) -> dict:
    results = {}
    for layout in layouts:
        for arch, directory in dirs.items():
            flavour = flavour_from_config(directory)
            model = ParallelModel(flavour, SEQ, 0, ParallelDims(*layout), torch.device("cpu"), init_from=str(directory))
            results[(tuple(layout), arch)] = chained_logits(model, tokens)
            if checkpoint and arch == "qwen2":
                optimizer = torch.optim.AdamW(model.params, foreach=False)
                rank = dist.get_rank() if dist.is_initialized() else 0
                save_checkpoint(
                    Path(checkpoint), model.module, optimizer, {"step": 0, "model_shape": flavour.as_dict()}, rank
                )
            model.close()
    return results
