"""The simulator's Megatron-LM truth (copus.core.megatron): each piece against its plain-model
counterpart or its public figure."""

from __future__ import annotations

import math

import pytest

from copus.core.datasheets import NODES
from copus.core.layout import CandidateConfig, ModelShape
from copus.core.megatron import (
    MegatronFramework,
    exposed_dp_seconds,
    exposed_tp_seconds,
    interleaved_stages,
    matmul_flops_per_token,
    matmul_share,
    megatron_terms,
    stage_link_span,
)
from copus.core.memory import ENGINE, GIB, MEGATRON_BF16, config_bytes, layer_activation_bytes
from copus.core.simulator import Cluster, hardware_params, step_terms, training_flops_per_token
from copus.core.throughput import StepTimeModel
from workloads.flavours import FLAVOURS

SHAPE = FLAVOURS["llama-2-13b"].shape()
SEQ = 4096
H100x2 = Cluster(NODES["h100-sxm-8"], 2)
OFF = MegatronFramework(overlap_grad_reduce=False, overlap_param_gather=False)


def test_the_embedding_is_no_matmul_work_but_a_tied_head_is():
    assert training_flops_per_token(SHAPE, SEQ) - matmul_flops_per_token(SHAPE, SEQ) == 6.0 * SHAPE.embed_params()
    tied = ModelShape(4, 4, 4, 256, 1000, 64, tie_embeddings=True)
    assert matmul_flops_per_token(tied, 128) == training_flops_per_token(tied, 128)


@pytest.mark.parametrize(
    "dp,tp,pp,crosses",
    [(2, 2, 2, False), (2, 2, 4, True), (8, 1, 2, True), (1, 8, 2, True), (1, 4, 2, False), (1, 1, 8, False)],
)
def test_a_pipeline_over_two_nodes_sends_over_the_network(dp, tp, pp, crosses):
    cfg = CandidateConfig(dp, tp, pp, 1, 64)
    bandwidth, _ = H100x2.link(stage_link_span(cfg, 8))
    assert (bandwidth == NODES["h100-sxm-8"].inter_node_bandwidth) is crosses


def test_the_plain_model_priced_the_crossing_boundary_at_nvlink():
    """dp 2 x tp 2 x pp 4 over two nodes: the plain model's stage link is NVLink, Megatron's the network."""
    cfg = CandidateConfig(2, 2, 4, 1, 64)
    plain = hardware_params(H100x2, SHAPE, SEQ, cfg)
    megatron = hardware_params(Cluster(H100x2.node, 2, MegatronFramework()), SHAPE, SEQ, cfg)
    assert megatron.p1 / plain.p1 == pytest.approx(450 / 50)


def test_overlap_hides_what_fits_under_the_pass_and_no_more():
    cfg = CandidateConfig(4, 1, 1, 1, 64)
    fw, rank_params = MegatronFramework(), 4e8  # ten 40 M buckets: the last one's tenth stays exposed
    assert exposed_dp_seconds(cfg, 1.0, 30.0, rank_params, fw) == pytest.approx(0.1)
    assert exposed_dp_seconds(cfg, 1.0, 0.3, rank_params, fw) == pytest.approx(1.0 - 0.2)
    assert exposed_dp_seconds(cfg, 1.0, 30.0, rank_params, OFF) == 1.0
    assert exposed_dp_seconds(CandidateConfig(1, 1, 1, 1, 64), 1.0, 0.0, rank_params, OFF) == 0.0


def test_tensor_parallel_overlap_hides_what_fits_under_the_matmuls_and_needs_sequence_parallelism():
    """`--tp-comm-overlap`: off by default (Megatron's); on, what outlasts the matmuls beside it is
    exposed and at least one of its tp chunks; without sequence parallelism it does not apply."""
    tp4, tp1 = CandidateConfig(2, 4, 1, 1, 64), CandidateConfig(8, 1, 1, 1, 64)
    on = MegatronFramework(tp_comm_overlap=True)
    assert not MegatronFramework().tp_comm_overlap and exposed_tp_seconds(tp4, 1.0, 30.0, MegatronFramework()) == 1.0
    assert exposed_tp_seconds(tp4, 1.0, 30.0, on) == pytest.approx(0.25)  # one chunk of four
    assert exposed_tp_seconds(tp4, 1.0, 0.5, on) == pytest.approx(0.5)  # what outlasts the matmuls
    assert exposed_tp_seconds(tp4, 1.0, 30.0, MegatronFramework(tp_comm_overlap=True, sequence_parallel=False)) == 1.0
    assert exposed_tp_seconds(tp1, 0.0, 30.0, on) == 0.0
    # attention's scores and values are not beside a tensor-parallel collective: a 13B layer at
    # 4096 tokens does 12 L d s of them against 6 per matmul parameter
    assert 0.8 < matmul_share(SHAPE, SEQ) < 0.9
    plain = step_terms(Cluster(H100x2.node, 2, MegatronFramework()), SHAPE, SEQ, tp4)
    overlapped = step_terms(Cluster(H100x2.node, 2, on), SHAPE, SEQ, tp4)
    assert overlapped.compute == plain.compute and overlapped.tp_comm < plain.tp_comm
    assert plain.step - overlapped.step == pytest.approx(tp4.microbatches * (plain.tp_comm - overlapped.tp_comm))


def test_the_distributed_optimizer_moves_three_quarters_of_an_fp32_all_reduce():
    """Reduce-scatter of fp32 gradients (half an all-reduce) and all-gather of bf16 parameters
    (a quarter); full sharding gathers for every micro-batch's forward and backward and
    reduce-scatters every micro-batch's gradients."""
    none, opt = CandidateConfig(4, 1, 1, 1, 64), CandidateConfig(4, 1, 1, 1, 64, "optimizer")
    full = CandidateConfig(4, 1, 1, 1, 64, "full")
    assert exposed_dp_seconds(none, 1.0, 0.0, 1e9, OFF) == 1.0
    assert exposed_dp_seconds(opt, 1.0, 0.0, 1e9, OFF) == 0.75
    assert full.microbatches == 16 and exposed_dp_seconds(full, 1.0, 0.0, 1e9, OFF) == pytest.approx(16 * 1.0)


def test_interleaving_divides_the_bubble_where_megatron_allows_it():
    fw = MegatronFramework(virtual_stages=2)
    ok, odd = CandidateConfig(1, 1, 4, 1, 8), CandidateConfig(1, 1, 4, 1, 6)
    assert interleaved_stages(ok, SHAPE, fw) == 2 and interleaved_stages(odd, SHAPE, fw) == 1
    plain = megatron_terms(hardware_params(H100x2, SHAPE, SEQ, ok), SHAPE, SEQ, ok, MegatronFramework(), 0.0)
    inter = megatron_terms(hardware_params(H100x2, SHAPE, SEQ, ok), SHAPE, SEQ, ok, fw, 0.0)
    per_mb = plain.compute + plain.tp_comm
    assert inter.bubble == pytest.approx(3 * (per_mb + 2 * plain.p2p) / 2)
    assert inter.step < plain.step


def test_without_overlap_or_interleaving_it_is_the_plain_form_with_fp32_on_the_wire():
    """The same compute, tp, p2p and optimizer terms as the plain model with no overlap and the
    whole bubble; only the wire bytes (fp32, not bf16), the FLOP count and the stage link differ."""
    cfg = CandidateConfig(2, 2, 2, 1, 64)
    cluster = Cluster(H100x2.node, 2, OFF)
    t = step_terms(cluster, SHAPE, SEQ, cfg)
    params = hardware_params(cluster, SHAPE, SEQ, cfg)
    plain = StepTimeModel(params, SHAPE).terms(cfg)  # bf16 on the wire: half the fp32 ring
    assert t.pipeline == pytest.approx(plain.pipeline) and t.bubble == pytest.approx(plain.bubble)
    assert t.dp_allreduce - params.d0 == pytest.approx(2 * (plain.dp_allreduce - params.d0))
    assert t.step == pytest.approx(t.pipeline + t.bubble + t.dp_allreduce + t.fixed)


def test_megatron_model_state_is_18_bytes_a_parameter_and_6_plus_12_over_d_distributed():
    """Megatron Core docs, "Distributed Optimizer": bf16 parameters, fp32 gradients."""
    cfg = CandidateConfig(8, 1, 1, 1, 64)
    n = SHAPE.param_count()
    b = config_bytes(SHAPE, cfg, SEQ, precision=MEGATRON_BF16)
    assert (b.params + b.grads + b.optimizer) / n == pytest.approx(18.0)
    d = config_bytes(SHAPE, CandidateConfig(8, 1, 1, 1, 64, "optimizer"), SEQ, precision=MEGATRON_BF16)
    assert (d.params + d.grads + d.optimizer) / n == pytest.approx(6.0 + 12.0 / 8) and d.buffers == 0.0


def test_sequence_parallel_shards_the_norms_in_bf16():
    no_sp = layer_activation_bytes(SHAPE, 8, act_bytes=2, precision=ENGINE)
    sp = layer_activation_bytes(SHAPE, 8, act_bytes=2, precision=MEGATRON_BF16)
    assert no_sp - sp == pytest.approx((6 * SHAPE.dim + 2) * (4 - 2 / 8))


def test_the_engine_precision_is_what_it_was():
    """The real planner's memory model is unchanged by the Megatron option (ENGINE is the default)."""
    cfg = CandidateConfig(2, 2, 2, 2, 64, "optimizer", "selective")
    assert config_bytes(SHAPE, cfg, SEQ).total == config_bytes(SHAPE, cfg, SEQ, precision=ENGINE).total
    assert math.isclose(config_bytes(SHAPE, cfg, SEQ).total / GIB, 106.646, rel_tol=1e-5)  # before the option


def test_a_simulation_names_its_framework_and_bad_fields_are_named():
    from copus.config import ConfigError
    from copus.sim.config import load_sim_config, setting_from

    path = "experiments/sim/paper_llama-2-13b_2x8-h100.yaml"
    assert setting_from(load_sim_config(path)).cluster.framework is None  # plain by default, as before
    sets = ["cluster.framework=megatron", "cluster.megatron.virtual_stages=2", "cluster.megatron.tp_comm_overlap=true"]
    cfg = load_sim_config(path, sets)
    assert setting_from(cfg).cluster.framework == MegatronFramework(virtual_stages=2, tp_comm_overlap=True)
    bad = [["cluster.framework=deepspeed"], ["cluster.megatron.virtual_stages=0"], ["cluster.megatron.overlap=1"]]
    for overrides in bad:
        with pytest.raises(ConfigError, match="cluster"):
            load_sim_config(path, overrides)
    emulated = "experiments/sim/emulated_layout.yaml"  # a measured profile is its step-time truth
    assert load_sim_config(emulated).cluster.profile is not None
    with pytest.raises(ConfigError, match="framework: megatron models the cluster's step times"):
        load_sim_config(emulated, ["cluster.framework=megatron"])


def test_full_sharding_holds_no_whole_gradients_under_megatron():
    """Every micro-batch's gradients are reduce-scattered into the shard: with many micro-batches a
    rank holds a unit's gradients and its shard, not its stage's whole gradients as the engine does."""
    cfg = CandidateConfig(16, 1, 1, 1, 64, "full")
    engine = config_bytes(SHAPE, cfg, SEQ)
    megatron = config_bytes(SHAPE, cfg, SEQ, precision=MEGATRON_BF16)
    n = SHAPE.param_count()
    assert engine.grads > n * 4 and megatron.grads < n * 4 / 4
