"""A Llama-style decoder: RMSNorm, rotary embeddings, SwiGLU MLP, causal (grouped-query)
attention.

Layers live in a ModuleDict keyed "0".."n-1" so that a pipeline stage that keeps only some
layers (or drops the embedding / head by setting them to None) keeps the parameter names
of the full model, and checkpoints line up across layouts.
"""

from __future__ import annotations

import math
import zlib
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from copus.core.layout import stage_layer_ranges
from workloads.flavours import Llama3RopeScaling, ModelFlavour


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 for stability under bf16 autocast.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.type_as(x) * self.weight


def llama3_scaled(inv_freq: torch.Tensor, s: Llama3RopeScaling) -> torch.Tensor:
    """Llama 3's frequency scaling, computed as transformers' `_compute_llama3_parameters` does
    (same float32 operations), so that the logits match it."""
    low_freq_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_freq_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_tables(
    head_dim: int, seq_len: int, theta: float, scaling: Llama3RopeScaling | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    if scaling is not None:
        inv_freq = llama3_scaled(inv_freq, scaling)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def flavour_rope_tables(flavour: ModelFlavour, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    return rope_tables(flavour.head_dim, seq_len, flavour.rope_theta, flavour.rope_scaling)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (batch, seq, heads, head_dim); rotate pairs (even, odd).
    seq = x.shape[1]
    cos = cos[:seq].view(1, seq, 1, -1)
    sin = sin[:seq].view(1, seq, 1, -1)
    x_even, x_odd = x.float()[..., 0::2], x.float()[..., 1::2]
    out = torch.stack((x_even * cos - x_odd * sin, x_even * sin + x_odd * cos), dim=-1)
    return out.flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(self, f: ModelFlavour):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = f.n_heads, f.n_kv_heads, f.head_dim
        self.wq = nn.Linear(f.dim, f.n_heads * f.head_dim, bias=f.qkv_bias)
        self.wk = nn.Linear(f.dim, f.n_kv_heads * f.head_dim, bias=f.qkv_bias)
        self.wv = nn.Linear(f.dim, f.n_kv_heads * f.head_dim, bias=f.qkv_bias)
        self.wo = nn.Linear(f.n_heads * f.head_dim, f.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        bsz, seq, _ = x.shape
        # -1 for the head count: under tensor parallelism each rank holds a slice of heads.
        q = self.wq(x).view(bsz, seq, -1, self.head_dim)
        k = self.wk(x).view(bsz, seq, -1, self.head_dim)
        v = self.wv(x).view(bsz, seq, -1, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        repeat = q.shape[2] // k.shape[2]
        if repeat > 1:
            k = k.repeat_interleave(repeat, dim=2)
            v = v.repeat_interleave(repeat, dim=2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(bsz, seq, -1))


class FeedForward(nn.Module):
    def __init__(self, f: ModelFlavour):
        super().__init__()
        self.w1 = nn.Linear(f.dim, f.ffn_dim, bias=False)  # gate
        self.w3 = nn.Linear(f.dim, f.ffn_dim, bias=False)  # up
        self.w2 = nn.Linear(f.ffn_dim, f.dim, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, f: ModelFlavour):
        super().__init__()
        self.attention_norm = RMSNorm(f.dim, f.norm_eps)
        self.attention = Attention(f)
        self.ffn_norm = RMSNorm(f.dim, f.norm_eps)
        self.feed_forward = FeedForward(f)
        # Activation recomputation (copus.parallel.recompute): a function that runs the block's
        # computation keeping less for backward. An attribute, not a wrapping module, so that
        # parameter names stay the plain model's.
        self.recompute: Callable | None = None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.recompute is not None and torch.is_grad_enabled():
            return self.recompute(self.compute, x, cos, sin)
        return self.compute(x, cos, sin)

    def compute(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self, flavour: ModelFlavour, seq_len: int):
        super().__init__()
        self.flavour = flavour
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(flavour.vocab_size, flavour.dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(flavour) for i in range(flavour.n_layers)})
        self.norm: RMSNorm | None = RMSNorm(flavour.dim, flavour.norm_eps)
        self.output: nn.Linear | None = nn.Linear(flavour.dim, flavour.vocab_size, bias=False)
        self.seq_len = seq_len
        cos, sin = flavour_rope_tables(flavour, seq_len)
        # Buffers, not parameters: recomputed, never checkpointed.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        if flavour.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (batch, seq) int64 -> logits (batch, seq, vocab); a pipeline stage without an
        embedding takes hidden states instead, and one without a head returns them."""
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h, self.rope_cos, self.rope_sin)
        if self.norm is not None:
            h = self.norm(h)
        return self.output(h) if self.output is not None else h


@torch.no_grad()
def init_weights(model: Transformer, seed: int) -> None:
    """Deterministic initialisation from `seed` (the same on every rank and layout)."""
    n_layers = model.flavour.n_layers
    for name, param in model.named_parameters():
        # One generator per parameter, seeded from its name: a pipeline stage or a tensor-parallel
        # rank that builds only part of the model gets exactly the same values for that part.
        gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        elif name.endswith(".bias"):
            param.zero_()
        else:
            std = 0.02
            # Output projections of residual branches scaled down (GPT-2 / Llama practice).
            if name.endswith("wo.weight") or name.endswith("w2.weight"):
                std = 0.02 / math.sqrt(2 * n_layers)
            param.copy_(torch.randn(param.shape, generator=gen) * std)


def keep_stage(model: Transformer, stage: int, num_stages: int) -> Transformer:
    """Cut the model to one pipeline stage at layer boundaries: drop other stages' layers, the
    embedding unless first, the final norm and LM head unless last. Parameter names stay those
    of the unsplit model (layers are a ModuleDict keyed by layer index), so DCP checkpoints line
    up across layouts."""
    keep = stage_layer_ranges(len(model.layers), num_stages)[stage]
    for name in list(model.layers.keys()):
        if int(name) not in keep:
            del model.layers[name]
    if stage != 0:
        model.tok_embeddings = None
    if stage != num_stages - 1:
        model.norm = None
        model.output = None
    return model


def build_model(flavour: ModelFlavour, seq_len: int, seed: int) -> Transformer:
    """The whole model, initialised, on the CPU."""
    return materialize(skeleton(flavour, seq_len), seed)


def skeleton(flavour: ModelFlavour, seq_len: int) -> Transformer:
    """The model on the meta device: shapes only, no memory. Cut it to a pipeline stage first,
    then `materialize` only what this rank keeps (a 32 B model never exists whole on a rank)."""
    with torch.device("meta"):
        return Transformer(flavour, seq_len)


def materialize(model: Transformer, seed: int, initialize: bool = True) -> Transformer:
    """Allocate (on the CPU) and initialise the parameters a (possibly cut) skeleton still has.
    Values are seeded per parameter name, so they equal the whole model's. `initialize=False`
    leaves them unset, for a caller that overwrites every element (an in-place reshard)."""
    if not model.flavour.trainable_on_cpu and not torch.cuda.is_available():
        raise ValueError(f"workload.model: {model.flavour.name!r} is too large to instantiate without a GPU")
    model.to_empty(device="cpu")
    if model.flavour.tie_embeddings and model.tok_embeddings is not None and model.output is not None:
        model.output.weight = model.tok_embeddings.weight  # keep the tie through re-allocation
    cos, sin = flavour_rope_tables(model.flavour, model.seq_len)
    model.rope_cos, model.rope_sin = cos, sin
    if initialize:
        init_weights(model, seed)
    return model
