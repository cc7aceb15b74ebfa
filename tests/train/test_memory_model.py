"""The memory model (copus.core.memory) against the tensors torch actually allocates for the
CPU flavours: parameters, gradients and AdamW state exactly, activations saved for backward
closely, per pipeline stage and under tensor parallelism."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor

from copus.core.memory import (
    ADAM_STATE_BYTES,
    FP32,
    GIB,
    activation_bytes_per_token,
    bytes_per_rank,
    fits,
    microbatches_in_flight,
    stage_params_per_rank,
)
from copus.parallel.dims import ParallelDims
from copus.train.parallel_model import ParallelModel, token_loss
from copus.train.replica import make_optimizer
from copus.train.worker_plan import OptimizerPlan
from tests.train.loop_helpers import spawn
from workloads.flavours import FLAVOURS
from workloads.llama import keep_stage, materialize, skeleton


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def saved_activation_bytes(module: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor | None) -> int:
    """Bytes of the distinct storages autograd saves for backward in one forward pass,
    parameters and buffers left out (they are counted as parameters)."""
    skip = {_local(t).untyped_storage().data_ptr() for t in (*module.parameters(), *module.buffers())}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        local = _local(t)
        try:
            storage = local.untyped_storage()
            key, nbytes = storage.data_ptr(), storage.nbytes()
        except RuntimeError:  # a wrapper without storage (an in-flight collective's result)
            key, nbytes = id(local), local.numel() * local.element_size()
        if key not in skip:
            seen[key] = nbytes
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(inputs)
        if targets is not None:
            token_loss(out, targets)
    return sum(seen.values())


def stage_module(name: str, seq: int, pp: int, stage: int) -> torch.nn.Module:
    model = skeleton(FLAVOURS[name], seq)
    if pp > 1:
        keep_stage(model, stage, pp)
    return materialize(model, 0)


@pytest.mark.parametrize(
    "name,pp", [(n, pp) for n in ("debug", "tiny", "small") for pp in (1, 2, 4) if pp <= FLAVOURS[n].n_layers]
)
def test_parameters_per_stage_are_exact(name, pp):
    shape = FLAVOURS[name].shape()
    for stage in range(pp):
        module = stage_module(name, 32, pp, stage)
        assert sum(p.numel() for p in module.parameters()) == stage_params_per_rank(shape, 1, pp, stage)


def test_gradients_and_adamw_state_are_exact():
    flavour = FLAVOURS["tiny"]
    model = ParallelModel(flavour, 32, 0, ParallelDims(1, 1, 1), torch.device("cpu"))
    optimizer = make_optimizer(model, OptimizerPlan(), 1e-3)
    tokens = torch.randint(0, flavour.vocab_size, (2, 32))
    model.forward_backward(tokens, tokens, 2)
    optimizer.step()
    n = stage_params_per_rank(flavour.shape(), 1, 1, 0)
    assert sum(p.grad.numel() * p.grad.element_size() for p in model.params) == n * FP32
    state = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values() if t.dim() > 0)
    assert state == n * ADAM_STATE_BYTES


@pytest.mark.parametrize("name,seq,mbs", [("debug", 32, 2), ("tiny", 128, 4), ("small", 64, 2)])
@pytest.mark.parametrize("pp", [1, 2])
def test_activations_per_stage_match_saved_tensors(name, seq, mbs, pp):
    flavour = FLAVOURS[name]
    tokens = torch.randint(0, flavour.vocab_size, (mbs, seq))
    hidden = torch.randn(mbs, seq, flavour.dim, requires_grad=True)
    for stage in range(pp):
        module = stage_module(name, seq, pp, stage)
        measured = saved_activation_bytes(module, tokens if stage == 0 else hidden, tokens if stage == pp - 1 else None)
        predicted = mbs * seq * activation_bytes_per_token(flavour.shape(), 1, pp, stage)
        assert predicted == pytest.approx(measured, rel=0.05), (stage, measured, predicted)


def _tp_rank(name: str, seq: int, mbs: int) -> tuple[int, int, int]:
    flavour = FLAVOURS[name]
    model = ParallelModel(flavour, seq, 0, ParallelDims(1, 2, 1), torch.device("cpu"))
    params = sum(_local(p).numel() for p in model.params)
    tokens = torch.randint(0, flavour.vocab_size, (mbs, seq), generator=torch.Generator().manual_seed(0))
    return params, saved_activation_bytes(model.module, tokens, tokens), 0


@pytest.mark.slow
def test_tensor_parallel_shards_match_the_model():
    name, seq, mbs = "tiny", 64, 2
    shape = FLAVOURS[name].shape()
    for params, acts, _ in spawn(2, _tp_rank, name, seq, mbs):
        assert params == stage_params_per_rank(shape, 2, 1, 0)
        assert mbs * seq * activation_bytes_per_token(shape, 2, 1, 0) == pytest.approx(acts, rel=0.15)


def test_microbatches_in_flight_follow_the_schedule():
    assert [microbatches_in_flight(4, s, 8, "1f1b") for s in range(4)] == [4, 3, 2, 1]
    assert [microbatches_in_flight(4, s, 2, "1f1b") for s in range(4)] == [2, 2, 2, 1]
    assert microbatches_in_flight(4, 3, 8, "gpipe") == 8
    assert microbatches_in_flight(1, 0, 8, "1f1b") == 1


def test_layouts_divide_memory_and_the_limit_gives_a_reason():
    shape = FLAVOURS["llama-2-7b"].shape()
    whole = bytes_per_rank(shape, 1, 1, 1, 1, 8, 2048, act_bytes=2)
    split = bytes_per_rank(shape, 1, 2, 4, 1, 8, 2048, act_bytes=2)
    assert split.params < whole.params / 6 and split.activations < whole.activations
    ok, reason = fits(whole, 80 * GIB, 0.1)
    assert not ok and "memory model" in reason and "GiB" in reason  # 7B with AdamW on one 80 GB GPU: no
    assert fits(split, 80 * GIB, 0.1)[0]
    assert bytes_per_rank(shape, 8, 1, 1, 1, 8, 2048, dp_shard="optimizer").optimizer == pytest.approx(
        whole.optimizer / 8
    )


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_recomputation_keeps_what_the_model_says(recompute):
    # Bytes alive after the forward pass beyond the model's own (torch's memory tracker): what
    # backward will use, recomputed parts excluded.
    from torch.distributed._tools.mem_tracker import MemTracker

    flavour, seq, mbs = FLAVOURS["tiny"], 64, 2
    model = ParallelModel(flavour, seq, 0, ParallelDims(1, 1, 1), torch.device("cpu"), recompute=recompute)
    tokens = torch.randint(0, flavour.vocab_size, (mbs, seq + 1), generator=torch.Generator().manual_seed(0))
    tracker = MemTracker()
    tracker.track_external(model.module)
    with tracker:
        before = tracker.get_tracker_snapshot("current")[torch.device("cpu")]["Total"]
        loss = token_loss(model.module(tokens[:, :-1]), tokens[:, 1:])
        kept = tracker.get_tracker_snapshot("current")[torch.device("cpu")]["Total"] - before
        loss.backward()
    predicted = mbs * seq * activation_bytes_per_token(flavour.shape(), 1, 1, 0, FP32, recompute)
    assert predicted == pytest.approx(kept, rel=0.02)


def _sharded_state_bytes(dp_shard: str) -> tuple[int, int, int]:
    flavour = FLAVOURS["tiny"]
    model = ParallelModel(flavour, 32, 0, ParallelDims(2, 1, 1), torch.device("cpu"), dp_shard=dp_shard)
    optimizer = make_optimizer(model, OptimizerPlan(), 1e-3)
    tokens = torch.randint(0, flavour.vocab_size, (4, 33), generator=torch.Generator().manual_seed(model.dp_rank))
    model.forward_backward(tokens[:, :-1], tokens[:, 1:], 2)
    model.reduce_and_clip(1.0)
    optimizer.step()

    def local_bytes(tensors) -> int:
        return sum(_local(t).numel() * _local(t).element_size() for t in tensors)

    state = [t for s in optimizer.state.values() for t in s.values() if t.dim() > 0]
    return local_bytes(model.params), local_bytes(p.grad for p in model.params), local_bytes(state)


@pytest.mark.slow
@pytest.mark.parametrize("dp_shard", ["optimizer", "full"])
def test_sharded_state_is_the_models_shard(dp_shard):
    # After the step: parameters, reduced gradients and AdamW state are 1/dp of the replica's.
    n = stage_params_per_rank(FLAVOURS["tiny"].shape(), 1, 1, 0)
    for params, grads, state in spawn(2, _sharded_state_bytes, dp_shard):
        assert (params, grads, state) == (n / 2 * FP32, n / 2 * FP32, n / 2 * ADAM_STATE_BYTES)
