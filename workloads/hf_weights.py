"""Hugging Face weights in and out of the model, tensor by tensor.

In: every rank fills only the parameters it holds (its pipeline stage) and, under tensor
parallelism, only its shard of each: the box of the global tensor it holds is read with
safetensors' `get_slice`, so no rank ever reads the whole model. Out: named tensors of the
whole model become Hugging Face tensors for safetensors files.

Rotary layout: Hugging Face's Llama and Qwen2 rotate the two halves of each head
(rotate_half); our model rotates interleaved pairs (Meta's layout). The rows of q and k (and
their biases) are permuted per head when weights cross over, the permutation of transformers'
own Llama conversion script. A tensor-parallel shard holds whole heads, so the permutation
applies to a shard as it does to the whole tensor.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from copus.parallel.redistribute import global_box, local_tensor
from workloads.hf_config import hf_name
from workloads.hf_files import weight_map

ROTATED = ("attention.wq.weight", "attention.wq.bias", "attention.wk.weight", "attention.wk.bias")


def half_split_to_interleaved(rows: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Hugging Face's rows of a head (evens' partners first, then odds') -> Meta's (pairs)."""
    return rows.reshape(-1, 2, head_dim // 2, *rows.shape[1:]).transpose(1, 2).reshape(rows.shape)


def interleaved_to_half_split(rows: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Meta's rows of a head -> Hugging Face's (the inverse of half_split_to_interleaved)."""
    return rows.reshape(-1, head_dim // 2, 2, *rows.shape[1:]).transpose(1, 2).reshape(rows.shape)


def source_name(name: str, available: dict) -> str:
    """The Hugging Face tensor that fills our parameter `name`: a tied LM head without its own
    tensor reads the embedding."""
    hf = hf_name(name)
    return "model.embed_tokens.weight" if hf == "lm_head.weight" and hf not in available else hf


@torch.no_grad()
def load_hf_weights(module: nn.Module, model_dir: str | Path, head_dim: int) -> int:
    """Fill every parameter `module` holds (plain or a DTensor shard) from the directory's
    safetensors files, reading only this rank's box of each tensor. Returns the bytes read."""
    files = weight_map(model_dir)
    read = 0
    with ExitStack() as stack:
        opened: dict[Path, object] = {}
        for name, param in module.named_parameters():
            hf = source_name(name, files)
            path = files[hf]
            if path not in opened:
                opened[path] = stack.enter_context(safe_open(str(path), framework="pt"))
            box = global_box(param)
            piece = opened[path].get_slice(hf)[tuple(slice(o, o + n) for o, n in zip(box.offset, box.shape))]
            if name.endswith(ROTATED):
                piece = half_split_to_interleaved(piece, head_dim)
            local_tensor(param).copy_(piece)
            read += piece.numel() * piece.element_size()
    return read


def to_hf_tensors(named: dict[str, torch.Tensor], head_dim: int, tied: bool) -> dict[str, torch.Tensor]:
    """Whole tensors of our model (by our names) -> Hugging Face's names and rotary layout. A
    tied LM head is left out (transformers ties it to the embedding)."""
    out = {}
    for name, tensor in named.items():
        if tied and name == "output.weight":
            continue
        if name.endswith(ROTATED):
            tensor = interleaved_to_half_split(tensor, head_dim)
        out[hf_name(name)] = tensor.contiguous()
    return out
