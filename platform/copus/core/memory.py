"""Bytes per rank for a (dp, tp, pp, mbs, m) configuration, and whether it fits a device.

Pure math (no torch): the planner and the simulator call it for thousands of candidates.
The counts follow what this implementation allocates (`workloads/llama.py` under
`copus.parallel`), checked against the tensors torch actually allocates for the CPU flavours
(tests/core/test_memory.py):

- parameters and gradients in fp32 (mixed precision autocasts activations, the master weights
  stay fp32); AdamW keeps two fp32 moments per parameter. Tensor parallelism shards the
  attention and MLP weights, the embedding and the LM head; RMSNorm weights are replicated.
  A sharded optimiser (ZeRO-1 style) would divide the moments by dp as well.
- activations saved for backward, per token of one micro-batch, for one transformer layer:
  6·dim for the two RMSNorms (input, normalised input, scaled output each; replicated under
  tp: no sequence parallelism), 4·dim + 4·ffn + n_heads for attention (q, k, v and output as
  flash attention keeps them, its log-sum-exp) and the SwiGLU MLP (sharded over tp), and 2 for
  the norms' reciprocal RMS. The last stage adds 3·dim for the final norm and the vocabulary
  logits and their log-softmax (the logits are gathered over tp); attention is
  flash-style, so there is no seq² term.
- micro-batches in flight: 1F1B keeps min(m, pp − stage) micro-batches' activations on a
  stage (the first stage holds the most); GPipe keeps all m; plain accumulation (pp = 1) one.
- buffers: the data-parallel all-reduce flattens the gradients into one bucket (one more
  gradient-sized copy when dp > 1), plus a fixed per-process runtime overhead.
"""

from __future__ import annotations

from dataclasses import dataclass

from copus.core.layout import ModelShape, stage_layer_ranges

GIB = 1024**3
FP32 = 4
ADAM_STATE_BYTES = 2 * FP32  # exp_avg and exp_avg_sq per parameter


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


def activation_bytes_per_token(shape: ModelShape, tp: int, pp: int, stage: int, act_bytes: int = FP32) -> float:
    """Bytes saved for backward per token of one micro-batch on one rank of `stage`."""
    layers = len(stage_layer_ranges(shape.n_layers, pp)[stage])
    per_layer = (6 * shape.dim + 2) * FP32 + (4 * shape.dim + 4 * shape.ffn_dim + shape.n_heads) * act_bytes / tp
    total = layers * per_layer
    if stage == pp - 1:
        # Final norm, the gathered logits' log-softmax (fp32 for the loss) and the local logits shard.
        total += 3 * shape.dim * FP32 + shape.vocab_size * FP32 + (shape.vocab_size / tp) * act_bytes * (tp > 1)
    return total


def microbatches_in_flight(pp: int, stage: int, m: int, schedule: str) -> int:
    if pp == 1:
        return 1
    if schedule == "gpipe":
        return m
    return min(m, pp - stage)


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
    shard_optimizer: bool = False,
    overhead_bytes: float = 0.0,
) -> MemoryBreakdown:
    """Memory of the most loaded rank of the layout (the maximum over pipeline stages)."""
    worst: MemoryBreakdown | None = None
    for stage in range(pp):
        n = stage_params_per_rank(shape, tp, pp, stage)
        acts = (
            microbatches_in_flight(pp, stage, m, schedule)
            * mbs
            * seq_len
            * activation_bytes_per_token(shape, tp, pp, stage, act_bytes)
        )
        bucket = n * FP32 if dp > 1 else 0.0
        b = MemoryBreakdown(
            stage,
            n * FP32,
            n * FP32,
            n * ADAM_STATE_BYTES / (dp if shard_optimizer else 1),
            acts,
            bucket + overhead_bytes,
        )
        if worst is None or b.total > worst.total:
            worst = b
    assert worst is not None
    return worst


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
