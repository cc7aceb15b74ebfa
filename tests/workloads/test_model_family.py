"""A second model family plugs into the engine without touching copus.train: this module
registers a toy causal language model (token embedding, residual MLP blocks that mix each
position with the one before it, a head) as a `ModelSpec`, and the engine trains it like the
Llama family: one process, and tensor plus pipeline parallel on gloo ranks with the same losses."""

from __future__ import annotations

import zlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from copus.core.layout import stage_layer_ranges
from copus.parallel.dims import ParallelDims
from copus.train.local import run_on_gloo_ranks
from copus.train.parallel_model import ParallelModel
from copus.train.replica import make_optimizer, train_step
from copus.train.worker_plan import OptimizerPlan
from workloads.flavours import ModelFlavour
from workloads.registry import ModelSpec, model_spec, register_model

SEQ = 16
TOY = ModelFlavour("toy-mlp", 32, 4, 1, 1, 64, 256, SEQ, family="toy-mlp")


class ShiftMLPBlock(nn.Module):
    """x + W2 relu(W1 [x_t, x_{t-1}]): causal, and enough structure to split over tp."""

    def __init__(self, f: ModelFlavour):
        super().__init__()
        self.w1 = nn.Linear(2 * f.dim, f.ffn_dim)
        self.w2 = nn.Linear(f.ffn_dim, f.dim)
        self.recompute = None  # the engine's recomputation hook (copus.parallel.recompute)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute is not None and torch.is_grad_enabled():
            return self.recompute(self.compute, x)
        return self.compute(x)

    def compute(self, x: torch.Tensor) -> torch.Tensor:
        previous = F.pad(x, (0, 0, 1, 0))[:, :-1]
        return x + self.w2(F.relu(self.w1(torch.cat([x, previous], dim=-1))))


class ToyLM(nn.Module):
    def __init__(self, f: ModelFlavour):
        super().__init__()
        self.flavour = f
        self.tok_embeddings: nn.Module | None = nn.Embedding(f.vocab_size, f.dim)
        self.layers = nn.ModuleDict({str(i): ShiftMLPBlock(f) for i in range(f.n_layers)})
        self.norm: nn.Module | None = nn.LayerNorm(f.dim)
        self.output: nn.Module | None = nn.Linear(f.dim, f.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for block in self.layers.values():
            h = block(h)
        if self.norm is not None:
            h = self.norm(h)
        return self.output(h) if self.output is not None else h


def skeleton(f: ModelFlavour, seq_len: int) -> ToyLM:
    with torch.device("meta"):
        return ToyLM(f)


@torch.no_grad()
def materialize(model: ToyLM, seed: int, initialize: bool = True) -> ToyLM:
    model.to_empty(device="cpu")
    if initialize:  # seeded per name: every layout's part equals the whole model's
        for name, p in model.named_parameters():
            gen = torch.Generator().manual_seed(seed * 7919 + zlib.crc32(name.encode()))
            p.copy_(torch.ones_like(p) if name.startswith("norm.weight") else torch.randn(p.shape, generator=gen) * 0.1)
    return model


def tp_plan(model: ToyLM) -> dict:
    plan = {f"layers.{n}.w1": ColwiseParallel() for n in model.layers}
    plan.update({f"layers.{n}.w2": RowwiseParallel() for n in model.layers})
    if model.output is not None:
        plan["output"] = ColwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    return plan


def keep_stage(model: ToyLM, stage: int, stages: int) -> ToyLM:
    keep = stage_layer_ranges(len(model.layers), stages)[stage]
    for name in [n for n in model.layers if int(n) not in keep]:
        del model.layers[name]
    if stage:
        model.tok_embeddings = None
    if stage != stages - 1:
        model.norm = model.output = None
    return model


register_model(ModelSpec("toy-mlp", skeleton, materialize, tp_plan, keep_stage))


def toy_losses(layout: tuple[int, int, int], steps: int = 3) -> list[float]:
    """Losses of `steps` AdamW steps on fixed random data under `layout` (a rank's view)."""
    model = ParallelModel(TOY, SEQ, 0, ParallelDims(*layout), torch.device("cpu"))
    optimizer = make_optimizer(model, OptimizerPlan(), 1e-2)
    data = torch.randint(0, TOY.vocab_size, (8, SEQ + 1), generator=torch.Generator().manual_seed(1))
    rows = data[model.dp_rank * 8 // layout[0] : (model.dp_rank + 1) * 8 // layout[0]]
    losses = [train_step(model, optimizer, rows[:, :-1], rows[:, 1:], 2, 1e-2, 1.0).loss for _ in range(steps)]
    model.close()
    return losses


def test_the_engine_builds_a_registered_family_it_does_not_name():
    model = ParallelModel(TOY, SEQ, 0, ParallelDims(1, 1, 1), torch.device("cpu"))
    assert model.spec is model_spec("toy-mlp") and isinstance(model.module, ToyLM)
    losses = toy_losses((1, 1, 1), steps=5)
    assert losses[-1] < losses[0]  # it trains
    with pytest.raises(ValueError, match="unknown model family 'nope'"):
        model_spec("nope")


@pytest.mark.slow
def test_a_registered_family_trains_the_same_under_tensor_and_pipeline_parallelism():
    reference = toy_losses((1, 1, 1))
    for layout in ((1, 2, 1), (1, 1, 2), (2, 1, 1)):
        ranks = run_on_gloo_ranks(2, toy_losses, layout)
        assert ranks[0] == pytest.approx(reference, rel=1e-4), layout
