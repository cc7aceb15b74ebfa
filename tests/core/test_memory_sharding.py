"""The memory model's sharded data parallelism and recomputation: each knob moves the bytes it
should, by the amounts its definition says (copus.core.memory's docstring)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from copus.core.layout import CandidateConfig
from copus.core.memory import (
    ADAM_STATE_BYTES,
    FP32,
    bytes_per_rank,
    config_bytes,
    largest_shard_unit,
    layer_activation_bytes,
    stage_params_per_rank,
)
from workloads.flavours import FLAVOURS

SHAPE = FLAVOURS["llama-2-13b"].shape()


def test_optimizer_sharding_divides_adam_state_and_gradients_by_dp():
    none = bytes_per_rank(SHAPE, 8, 1, 4, 1, 8, 4096, dp_shard="none")
    opt = bytes_per_rank(SHAPE, 8, 1, 4, 1, 8, 4096, dp_shard="optimizer")
    assert opt.optimizer == pytest.approx(none.optimizer / 8)
    assert opt.params == pytest.approx(none.params * (1 + 1 / 8))  # the shard and the gathered copy
    # Eight micro-batches accumulate whole gradients until the step's reduce-scatter; one does not.
    assert opt.grads == pytest.approx(none.grads * (1 + 1 / 8))
    one = bytes_per_rank(SHAPE, 8, 1, 4, 1, 1, 4096, dp_shard="optimizer")
    unit = largest_shard_unit(SHAPE, 1, 4, one.stage)
    assert one.grads == pytest.approx(none.grads / 8 + unit * FP32)
    assert opt.total < none.total


def test_full_sharding_keeps_two_units_whole_and_the_rest_as_shards():
    full = bytes_per_rank(SHAPE, 8, 1, 4, 1, 8, 4096, dp_shard="full")
    n = stage_params_per_rank(SHAPE, 1, 4, full.stage)
    unit = largest_shard_unit(SHAPE, 1, 4, full.stage)
    assert full.params == pytest.approx((n / 8 + 2 * unit) * FP32)
    assert full.optimizer == pytest.approx(n / 8 * ADAM_STATE_BYTES)
    assert full.total < bytes_per_rank(SHAPE, 8, 1, 4, 1, 8, 4096, dp_shard="optimizer").total


def test_sharding_over_one_replica_changes_nothing():
    for mode in ("optimizer", "full"):
        assert bytes_per_rank(SHAPE, 1, 8, 4, 1, 8, 4096, dp_shard=mode) == bytes_per_rank(SHAPE, 1, 8, 4, 1, 8, 4096)


def test_recomputation_orders_activation_memory():
    acts = {
        mode: bytes_per_rank(SHAPE, 2, 8, 2, 2, 8, 4096, act_bytes=2, recompute=mode).activations
        for mode in ("none", "selective", "full")
    }
    assert acts["full"] < acts["selective"] < acts["none"]
    assert layer_activation_bytes(SHAPE, 1, "full", 2) == SHAPE.dim * 2  # one layer input per token


@given(
    dp=st.sampled_from([1, 2, 4, 8]),
    mbs=st.sampled_from([1, 2, 4]),
    shard=st.sampled_from(["none", "optimizer", "full"]),
    recompute=st.sampled_from(["none", "selective", "full"]),
)
def test_config_bytes_is_bytes_per_rank_of_the_candidate(dp, mbs, shard, recompute):
    cfg = CandidateConfig(dp, 2, 2, mbs, dp * mbs * 4, shard, recompute)
    assert config_bytes(SHAPE, cfg, 2048, act_bytes=2) == bytes_per_rank(
        SHAPE, dp, 2, 2, mbs, 4, 2048, act_bytes=2, dp_shard=shard, recompute=recompute
    )
