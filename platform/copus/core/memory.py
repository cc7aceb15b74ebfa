"""Bytes per rank for a (dp, tp, pp, mbs, m) configuration, and whether it fits a device.

Pure math (no torch): the planner and the simulator call it for thousands of candidates.
The counts follow what this implementation allocates (`workloads/llama.py` under
`copus.parallel`), checked against the tensors torch actually allocates for the CPU flavours
(tests/core/test_memory.py):

- parameters and gradients in fp32 (mixed precision autocasts activations, the master weights
  stay fp32); AdamW keeps two fp32 moments per parameter. Tensor parallelism shards the
  attention and MLP weights, the embedding and the LM head; RMSNorm weights are replicated.
- sharded data parallelism (`dp_shard`, FSDP2 units of one transformer block, the embedding and
  the head): `optimizer` keeps AdamW state and gradients as 1/dp shards and all-gathers the
  parameters once per step, keeping them whole through forward and backward (sharded copy plus
  unsharded copy); `full` keeps parameters sharded too and holds at most two units whole at a time
  (the one computing and the one prefetched). Gradients accumulate whole over the micro-batches
  of a step (no communication until its last backward reduce-scatters them), so with m > 1 a
  rank holds its stage's whole gradients besides their shard; with m = 1 one unit's at a time.
- activations saved for backward (`recompute = none`), per token of one micro-batch, for one
  transformer layer:
  6·dim for the two RMSNorms (input, normalised input, scaled output each; replicated under
  tp: no sequence parallelism), 4·dim + 4·ffn + n_heads for attention (q, k, v and output as
  flash attention keeps them, its log-sum-exp) and the SwiGLU MLP (sharded over tp), and 2 for
  the norms' reciprocal RMS. The last stage adds 3·dim for the final norm and the vocabulary
  logits and their log-softmax (the logits are gathered over tp); attention is
  flash-style, so there is no seq² term.
- recomputation (`copus.parallel.recompute`): `full` keeps only each layer's input (dim per
  token) and rebuilds one layer's activations at a time in backward (one layer of one
  micro-batch more); `selective` keeps the outputs of matmuls and collectives and the layer's
  input, and rebuilds the rest (norms, rotary, attention core, SwiGLU activation).
- micro-batches in flight: 1F1B keeps min(m, pp − stage) micro-batches' activations on a
  stage (the first stage holds the most); GPipe keeps all m; plain accumulation (pp = 1) one.
- buffers: the data-parallel all-reduce flattens the gradients into one bucket (one more
  gradient-sized copy when dp > 1), plus a fixed per-process runtime overhead.

The byte counts above are this implementation's (`ENGINE`). `Precision` changes them for another
framework's run: the simulator's Megatron-LM truth (`MEGATRON_BF16`, copus.core.megatron) keeps
bf16 parameters, fp32 main gradients and fp32 master weights with the two moments (12 bytes per
parameter, sharded by the distributed optimizer), and with sequence parallelism stores the norms'
activations in bf16 and sharded over tp.
"""

from __future__ import annotations

from dataclasses import dataclass

from copus.core.layout import CandidateConfig, ModelShape, stage_layer_ranges

GIB = 1024**3
FP32 = 4
BF16 = 2
ADAM_STATE_BYTES = 2 * FP32  # exp_avg and exp_avg_sq per parameter


@dataclass(frozen=True)
class Precision:
    """Bytes a framework keeps per parameter and how it stores the norms' activations."""

    param_bytes: int = FP32  # the parameters the forward pass reads
    grad_bytes: int = FP32  # the gradients accumulated over micro-batches and reduced
    optimizer_bytes: int = ADAM_STATE_BYTES  # per parameter, sharded with the optimizer state
    norm_bytes: int = FP32  # the RMSNorms' saved activations
    sequence_parallel: bool = False  # the norms' activations sharded over tp (Korthikanti et al. 2022)
    # dp_shard "optimizer" as Megatron's distributed optimizer has it: only the optimizer state is
    # sharded; parameters and gradients stay whole in their contiguous buffers, which also serve
    # the reduce-scatter and the all-gather (no sharded copies, no extra bucket).
    shards_optimizer_state_only: bool = False
    # dp_shard "full" reduce-scatters every micro-batch's gradients into the shard (ZeRO-3, Megatron
    # FSDP) instead of accumulating them whole until the step's last backward (this engine's FSDP2).
    reduces_every_microbatch: bool = False


ENGINE = Precision()  # copus.parallel: fp32 master weights and gradients, AdamW's two moments
# Megatron-LM with bf16 parameters and fp32 main gradients: 18 bytes per parameter, 6 + 12/d with
# the distributed optimizer (Megatron Core docs, "Distributed Optimizer"; the 12 are the fp32
# master weights and the two moments), sequence parallelism on.
MEGATRON_BF16 = Precision(
    param_bytes=BF16,
    grad_bytes=FP32,
    optimizer_bytes=3 * FP32,
    norm_bytes=BF16,
    sequence_parallel=True,
    shards_optimizer_state_only=True,
    reduces_every_microbatch=True,
)


@dataclass(frozen=True)
class MemoryBreakdown:
    stage: int  # the pipeline stage that needs the most memory
    params: float
    grads: float
    optimizer: float
    activations: float
    buffers: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.buffers

    def as_dict(self) -> dict:
        return {
            "stage": self.stage,
            "params": self.params,
            "grads": self.grads,
            "optimizer": self.optimizer,
            "activations": self.activations,
            "buffers": self.buffers,
            "total": self.total,
        }


def stage_params_per_rank(shape: ModelShape, tp: int, pp: int, stage: int) -> float:
    """Parameters one rank of `stage` holds: sharded weights / tp plus replicated norm weights."""
    layers = len(stage_layer_ranges(shape.n_layers, pp)[stage])
    replicated = layers * 2 * shape.dim  # the two RMSNorm weights of every layer
    if stage == pp - 1:
        replicated += shape.dim  # final norm
    return (shape.stage_params(pp, stage) - replicated) / tp + replicated


def layer_activation_bytes(
    shape: ModelShape, tp: int, recompute: str = "none", act_bytes: int = FP32, precision: Precision = ENGINE
) -> float:
    """Bytes one transformer layer saves for backward per token of one micro-batch on one rank."""
    # Replicated under tp, unless sequence parallelism shards them.
    norms = (6 * shape.dim + 2) * precision.norm_bytes / (tp if precision.sequence_parallel else 1)
    if recompute == "full":
        return shape.dim * act_bytes  # the layer's input only
    if recompute == "selective":
        # Matmul and collective outputs only: q, k, v, gate and up (sharded over tp); the attention
        # output and down projections (whole dim, twice under tp: the partial sum and its all-reduce);
        # and the block's input. Norms, rotary, attention core and SwiGLU are rebuilt.
        sharded = shape.dim + 2 * shape.kv_dim + 2 * shape.ffn_dim
        whole = shape.dim + 2 * shape.dim * (2 if tp > 1 else 1)
        return (sharded / tp + whole) * act_bytes
    return norms + (4 * shape.dim + 4 * shape.ffn_dim + shape.n_heads) * act_bytes / tp


def activation_bytes_per_token(
    shape: ModelShape,
    tp: int,
    pp: int,
    stage: int,
    act_bytes: int = FP32,
    recompute: str = "none",
    precision: Precision = ENGINE,
) -> float:
    """Bytes saved for backward per token of one micro-batch on one rank of `stage`."""
    layers = len(stage_layer_ranges(shape.n_layers, pp)[stage])
    total = layers * layer_activation_bytes(shape, tp, recompute, act_bytes, precision)
    if stage == pp - 1:
        # Final norm, the gathered logits' log-softmax (fp32 for the loss) and the local logits shard.
        total += (
            3 * shape.dim * precision.norm_bytes
            + shape.vocab_size * FP32
            + (shape.vocab_size / tp) * act_bytes * (tp > 1)
        )
    return total


def recompute_bytes_per_token(
    shape: ModelShape, tp: int, recompute: str, act_bytes: int = FP32, precision: Precision = ENGINE
) -> float:
    """Activations rebuilt in backward, alive for one layer of one micro-batch at a time."""
    if recompute == "none":
        return 0.0
    return layer_activation_bytes(shape, tp, "none", act_bytes, precision) - (
        0.0 if recompute == "full" else layer_activation_bytes(shape, tp, recompute, act_bytes, precision)
    )


def largest_shard_unit(shape: ModelShape, tp: int, pp: int, stage: int) -> float:
    """Parameters of the largest FSDP unit (a block, the embedding or the head) on one rank."""
    units = [shape.layer_params() / tp] if stage_layer_ranges(shape.n_layers, pp)[stage] else []
    if stage == 0:
        units.append(shape.embed_params() / tp)
    if stage == pp - 1:
        units.append(shape.head_params() / tp)
    return max(units)


def microbatches_in_flight(pp: int, stage: int, m: int, schedule: str) -> int:
    if pp == 1:
        return 1
    if schedule == "gpipe":
        return m
    return min(m, pp - stage)


def model_state_bytes(
    n: float, unit: float, dp: int, dp_shard: str, m: int = 1, precision: Precision = ENGINE
) -> tuple[float, float, float, float]:
    """(params, grads, optimizer, buffers) bytes of a rank holding n parameters (largest FSDP
    unit `unit`) in a dp group of size dp, under `dp_shard`, with m micro-batches per step."""
    p_bytes, g_bytes, o_bytes = precision.param_bytes, precision.grad_bytes, precision.optimizer_bytes
    if dp == 1 or dp_shard == "none":
        bucket = n * g_bytes if dp > 1 else 0.0  # the flattened gradient buckets of the all-reduce
        return n * p_bytes, n * g_bytes, n * o_bytes, bucket
    if dp_shard == "optimizer" and precision.shards_optimizer_state_only:
        return n * p_bytes, n * g_bytes, n * o_bytes / dp, 0.0
    shard = n / dp
    whole = n if dp_shard == "optimizer" else 2 * unit  # gathered for the step / two units in flight
    # Micro-batches accumulate whole gradients without communication until the step's last
    # backward reduce-scatters them; with one micro-batch a unit's gradient lives until its own.
    accumulating = n if m > 1 and not precision.reduces_every_microbatch else unit
    return (shard + whole) * p_bytes, (shard + accumulating) * g_bytes, shard * o_bytes, 0.0


def bytes_per_rank(
    shape: ModelShape,
    dp: int,
    tp: int,
    pp: int,
    mbs: int,
    m: int,
    seq_len: int,
    schedule: str = "1f1b",
    act_bytes: int = FP32,
    overhead_bytes: float = 0.0,
    dp_shard: str = "none",
    recompute: str = "none",
    precision: Precision = ENGINE,
) -> MemoryBreakdown:
    """Memory of the most loaded rank of the layout (the maximum over pipeline stages)."""
    worst: MemoryBreakdown | None = None
    tokens = mbs * seq_len
    for stage in range(pp):
        n = stage_params_per_rank(shape, tp, pp, stage)
        unit = largest_shard_unit(shape, tp, pp, stage)
        params, grads, optimizer, buffers = model_state_bytes(n, unit, dp, dp_shard, m, precision)
        acts = microbatches_in_flight(pp, stage, m, schedule) * tokens * activation_bytes_per_token(
            shape, tp, pp, stage, act_bytes, recompute, precision
        ) + tokens * recompute_bytes_per_token(shape, tp, recompute, act_bytes, precision)
        b = MemoryBreakdown(stage, params, grads, optimizer, acts, buffers + overhead_bytes)
        if worst is None or b.total > worst.total:
            worst = b
    assert worst is not None
    return worst


def config_bytes(shape: ModelShape, cfg: CandidateConfig, seq_len: int, **options) -> MemoryBreakdown:
    """`bytes_per_rank` of a candidate configuration (its layout, batch shape, sharding and
    recomputation): what the profiler and the simulator ask. `options`: bytes_per_rank's
    schedule, act_bytes, overhead_bytes and precision."""
    layout = (cfg.dp, cfg.tp, cfg.pp, cfg.mbs, cfg.microbatches)
    return bytes_per_rank(shape, *layout, seq_len, dp_shard=cfg.dp_shard, recompute=cfg.recompute, **options)


def fits(breakdown: MemoryBreakdown, device_bytes: float, margin: float) -> tuple[bool, str]:
    """(fits, reason): the layout fits when it needs at most (1 - margin) of the device."""
    usable = device_bytes * (1.0 - margin)
    if breakdown.total <= usable:
        return True, ""
    return False, (
        f"memory model: {breakdown.total / GIB:.2f} GiB per rank (stage {breakdown.stage}: params "
        f"{breakdown.params / GIB:.2f}, grads {breakdown.grads / GIB:.2f}, optimizer "
        f"{breakdown.optimizer / GIB:.2f}, activations {breakdown.activations / GIB:.2f}, buffers "
        f"{breakdown.buffers / GIB:.2f}) > {usable / GIB:.2f} GiB usable "
        f"({device_bytes / GIB:.2f} GiB less {margin:.0%} margin)"
    )
