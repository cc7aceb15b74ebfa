"""Hugging Face weights into a replica: every rank fills only the parameters it holds (its
pipeline stage) and, under tensor parallelism, only its shard of each. The box of the global
tensor it holds is read with safetensors' `get_slice`, so no rank ever reads the whole model.
Which tensor fills which parameter, and in what layout, is the model family's (`HFWeights`)."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from copus.parallel.redistribute import global_box, local_tensor
from workloads.flavours import ModelFlavour
from workloads.hf_files import weight_map
from workloads.registry import HFWeights


@torch.no_grad()
def load_hf_weights(module: nn.Module, model_dir: str | Path, flavour: ModelFlavour, hf: HFWeights) -> int:
    """Fill every parameter `module` holds (plain or a DTensor shard) from the directory's
    safetensors files, reading only this rank's box of each tensor. Returns the bytes read."""
    files = weight_map(model_dir)
    read = 0
    with ExitStack() as stack:
        opened: dict[Path, object] = {}
        for name, param in module.named_parameters():
            source = hf.source_name(name, files)
            path = files[source]
            if path not in opened:
                opened[path] = stack.enter_context(safe_open(str(path), framework="pt"))
            box = global_box(param)
            piece = opened[path].get_slice(source)[tuple(slice(o, o + n) for o, n in zip(box.offset, box.shape))]
            piece = hf.to_ours(name, piece, flavour)
            local_tensor(param).copy_(piece)
            read += piece.numel() * piece.element_size()
    return read
