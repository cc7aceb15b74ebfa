"""Hugging Face weights in and out of the Llama-style model, tensor by tensor: which Hugging
Face tensor fills each of our parameters, and how its layout differs (the engine reads each
rank's box of it: copus.train.weights). Out: named tensors of the whole model become Hugging
Face tensors for safetensors files.

Rotary layout: Hugging Face's Llama and Qwen2 rotate the two halves of each head
(rotate_half); our model rotates interleaved pairs (Meta's layout). The rows of q and k (and
their biases) are permuted per head when weights cross over, the permutation of transformers'
own Llama conversion script. A tensor-parallel shard holds whole heads, so the permutation
applies to a shard as it does to the whole tensor.
"""

from __future__ import annotations

import torch

from workloads.flavours import ModelFlavour
from workloads.hf_config import hf_name

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


def to_ours(name: str, piece: torch.Tensor, flavour: ModelFlavour) -> torch.Tensor:
    """A (slice of a) Hugging Face tensor in our layout: q and k rows permuted per head. A
    tensor-parallel shard holds whole heads, so this applies to a shard as to the whole."""
    return half_split_to_interleaved(piece, flavour.head_dim) if name.endswith(ROTATED) else piece


def to_hf_tensors(named: dict[str, torch.Tensor], flavour: ModelFlavour) -> dict[str, torch.Tensor]:
    """Whole tensors of our model (by our names) -> Hugging Face's names and rotary layout. A
    tied LM head is left out (transformers ties it to the embedding)."""
    out = {}
    for name, tensor in named.items():
        if flavour.tie_embeddings and name == "output.weight":
            continue
        if name.endswith(ROTATED):
            tensor = interleaved_to_half_split(tensor, flavour.head_dim)
        out[hf_name(name)] = tensor.contiguous()
    return out
