"""The model families the engine can build, each registered as a `ModelSpec`: how to lay the
model out on the meta device, allocate and initialise it, split it for tensor parallelism, cut
it to a pipeline stage, and carry Hugging Face weights in and out. The engine
(copus.train.parallel_model) builds whatever spec a flavour's `family` names and never names a model;
a new family registers a spec here (or from its own module) and touches nothing in copus.train.

The contract a family's model keeps: `model(tokens) -> logits` on the first stage (hidden
states between stages: a stage's input is the previous stage's output), `model.layers` a
ModuleDict of the blocks by index (recomputation and sharding work block by block), and
parameter names that do not depend on the layout (checkpoints reshard by name).
"""

from __future__ import annotations

from collections.abc import Callable, Container
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.tensor.parallel import ParallelStyle

from workloads import hf_weights, llama, tp_plan
from workloads.flavours import ModelFlavour


@dataclass(frozen=True)
class HFWeights:
    """How a family's parameters map onto a Hugging Face checkpoint's tensors."""

    source_name: Callable[[str, Container[str]], str]  # our name -> the Hugging Face tensor that fills it
    to_ours: Callable[[str, torch.Tensor, ModelFlavour], torch.Tensor]  # (a slice of) it in our layout
    to_hf: Callable[[dict[str, torch.Tensor], ModelFlavour], dict[str, torch.Tensor]]  # export, whole tensors


@dataclass(frozen=True)
class ModelSpec:
    family: str
    skeleton: Callable[[ModelFlavour, int], nn.Module]  # (flavour, seq_len) -> the model on the meta device
    materialize: Callable[[nn.Module, int, bool], nn.Module]  # allocate on the CPU; seed-initialise unless False
    tp_plan: Callable[[nn.Module], dict[str, ParallelStyle]]  # parallelize_module's plan for a (cut) model
    keep_stage: Callable[[nn.Module, int, int], nn.Module]  # (model, stage, stages) -> the stage's part
    hf: HFWeights | None = None  # None: no Hugging Face weights in or out


_SPECS: dict[str, ModelSpec] = {}


def register_model(spec: ModelSpec) -> ModelSpec:
    """Make a family buildable by the engine (a second registration of a name replaces the first)."""
    _SPECS[spec.family] = spec
    return spec


def model_spec(family: str) -> ModelSpec:
    try:
        return _SPECS[family]
    except KeyError:
        raise ValueError(
            f"workload.model: unknown model family {family!r} (known: {', '.join(sorted(_SPECS))})"
        ) from None


LLAMA = register_model(
    ModelSpec(
        family="llama",  # Llama 2/3 and Qwen2 (q/k/v biases) shapes
        skeleton=llama.skeleton,
        materialize=llama.materialize,
        tp_plan=tp_plan.llama_tp_plan,
        keep_stage=llama.keep_stage,
        hf=HFWeights(hf_weights.source_name, hf_weights.to_ours, hf_weights.to_hf_tensors),
    )
)
