"""How a Megatron-LM run spends a step: the simulator's step-time truth for the paper's clusters.

The simulator's plain truth (`copus.core.simulator.hardware_params` through the fitted form of
`copus.core.throughput`) is the form the planner fits, so its planner sees nearly the truth's own
shape. This module is the truth of what the paper's clusters run (issue 42, item 4), each piece
from a public description, each a field of `MegatronFramework` to switch off:

- **FLOPs**: 6 per matmul parameter per token plus attention's 12·L·d·s (Kaplan et al. 2020,
  section 2.1; Narayanan et al. 2021, eq. 3, which counts the LM head and not the embedding): the
  embedding is a lookup, no matmul (`matmul_flops_per_token`). The plain truth's 6N counts it.
- **Distributed optimizer with bf16 parameters** (`dp_shard: optimizer`; Megatron Core docs,
  "Distributed Optimizer"): fp32 gradients reduce-scattered, bf16 parameters all-gathered, so a
  step moves 3/4 of an fp32 all-reduce; without it (`none`) the fp32 gradients are all-reduced
  (bf16 training accumulates and reduces gradients in fp32). Memory: copus.core.memory's
  `MEGATRON_BF16`.
- **Overlap** (`--overlap-grad-reduce`, `--overlap-param-gather`): the gradient reduction runs
  bucket by bucket under the backward pass of a step's last micro-batch, the parameter gather
  under the forward pass of its first; only what outlasts that pass, and at least the last
  bucket's share (`bucket_params`, Megatron's default 40 M parameters), is exposed
  (`exposed_dp_seconds`). Under full sharding (ZeRO-3, Megatron FSDP) every micro-batch gathers
  the parameters for its forward and again for its backward and reduce-scatters its gradients
  into the shard, each under that micro-batch's pass (so no rank holds whole gradients: memory's
  `MEGATRON_BF16`). A micro-batch's backward is 2/3 of its compute.
- **Sequence parallelism** (Korthikanti et al. 2022): the tensor-parallel all-reduces become
  reduce-scatters and all-gathers of the same volume (time unchanged), and the norms'
  activations are sharded over tp (memory).
- **Tensor-parallel overlap** (`--tp-comm-overlap`, off by default in Megatron-LM; it needs
  sequence parallelism and Transformer Engine's userbuffers; NVIDIA NeMo docs, "Communication
  Overlap"): each all-gather and reduce-scatter is split into chunks, each moved while the
  adjacent linear layer's matmul works on the chunk before it. What outlasts the matmuls beside
  it is exposed, and at least one of its tp chunks (`exposed_tp_seconds`).
- **Interleaved 1F1B** (`virtual_stages` v > 1; Narayanan et al. 2021, section 2.2.2): the bubble
  shrinks v-fold and each micro-batch crosses v times as many stage boundaries. Megatron needs
  the micro-batches a multiple of pp and the layers a multiple of pp·v; elsewhere plain 1F1B.
- **The stage link** (`stage_link_span`): a pipeline whose stages span nodes sends over the
  network; its slowest boundary paces every micro-batch.

Pure: no torch, no ray.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from copus.core.layout import CandidateConfig, ModelShape
from copus.core.memory import MEGATRON_BF16, Precision
from copus.core.throughput import StepTimeModel, StepTimeParams, Terms

BACKWARD_SHARE = 2.0 / 3.0  # of a micro-batch's compute: the backward pass is twice the forward
DEFAULT_BUCKET_PARAMS = 40e6  # Megatron's DDP bucket (its default bucket size, 40 M parameters)


@dataclass(frozen=True)
class MegatronFramework:
    """What the modelled Megatron-LM run has on (module docstring)."""

    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    sequence_parallel: bool = True
    tp_comm_overlap: bool = False
    virtual_stages: int = 1
    bucket_params: float = DEFAULT_BUCKET_PARAMS

    def __post_init__(self) -> None:
        if self.virtual_stages < 1:
            raise ValueError(f"virtual_stages must be >= 1, got {self.virtual_stages!r}")
        if not self.bucket_params > 0:
            raise ValueError(f"bucket_params must be positive, got {self.bucket_params!r}")

    @property
    def precision(self) -> Precision:
        """What a rank keeps, for copus.core.memory: Megatron's bf16 bytes, sequence parallelism as set."""
        return replace(MEGATRON_BF16, sequence_parallel=self.sequence_parallel)


def attention_flops_per_token(shape: ModelShape, seq_len: int) -> float:
    """Training FLOPs per token of attention's scores and values, 12·L·d·s (no parameters)."""
    return 12.0 * shape.n_layers * shape.dim * seq_len


def matmul_flops_per_token(shape: ModelShape, seq_len: int) -> float:
    """Training FLOPs per token: 6 per matmul parameter (the embedding is a lookup; a tied head
    still multiplies by it) plus attention scores and values."""
    lookup = 0 if shape.tie_embeddings else shape.embed_params()
    return 6.0 * (shape.param_count() - lookup) + attention_flops_per_token(shape, seq_len)


def matmul_share(shape: ModelShape, seq_len: int) -> float:
    """The share of a micro-batch's compute in the linear layers' matmuls (the rest: attention's
    scores and values), the work tensor-parallel communication can hide under."""
    total = matmul_flops_per_token(shape, seq_len)
    return (total - attention_flops_per_token(shape, seq_len)) / total


def stage_link_span(cfg: CandidateConfig, ranks_per_node: int) -> int:
    """How far apart the ranks of the farthest stage boundary are, for the cluster's link rule:
    ranks are laid out (pp, dp, tp), so stages are dp·tp ranks apart, and a pipeline over more
    ranks than a node holds crosses nodes at some boundary."""
    stride = cfg.dp * cfg.tp
    return stride * cfg.pp if cfg.pp > 1 and stride * cfg.pp > ranks_per_node else stride + 1


def interleaved_stages(cfg: CandidateConfig, shape: ModelShape, fw: MegatronFramework) -> int:
    """The virtual stages the run uses: `fw.virtual_stages` where Megatron allows them."""
    v = fw.virtual_stages
    if v == 1 or cfg.pp == 1 or cfg.microbatches % cfg.pp or shape.n_layers % (cfg.pp * v):
        return 1
    return v


def exposed_dp_seconds(
    cfg: CandidateConfig, allreduce_s: float, compute_s: float, rank_params: float, fw: MegatronFramework
) -> float:
    """Seconds of data-parallel communication a step does not hide. `allreduce_s`: one ring
    all-reduce of the rank's fp32 gradients; `compute_s`: one micro-batch's compute on the
    busiest stage (the pass a reduction or gather can hide under)."""
    if cfg.dp == 1:
        return 0.0
    last_bucket = min(1.0, fw.bucket_params / max(rank_params, 1.0))

    def hidden_under(comm: float, window: float, on: bool) -> float:
        return max(comm * last_bucket, comm - window) if on else comm

    backward, forward = BACKWARD_SHARE * compute_s, (1.0 - BACKWARD_SHARE) * compute_s
    if cfg.dp_shard == "none":  # one fp32 all-reduce under the last backward
        return hidden_under(allreduce_s, backward, fw.overlap_grad_reduce)
    reduce_scatter, gather = allreduce_s / 2.0, allreduce_s / 4.0  # fp32 gradients, bf16 parameters
    exposed = hidden_under(reduce_scatter, backward, fw.overlap_grad_reduce)
    if cfg.dp_shard == "optimizer":  # the parameters gathered once, under the first forward
        return exposed + hidden_under(gather, forward, fw.overlap_param_gather)
    # full: every micro-batch gathers them for its forward and again for its backward, and
    # reduce-scatters its gradients under that backward too
    overlap = fw.overlap_param_gather and fw.overlap_grad_reduce
    per_microbatch = hidden_under(gather, forward, fw.overlap_param_gather) + hidden_under(
        gather + reduce_scatter, backward, overlap
    )
    return cfg.microbatches * per_microbatch


def exposed_tp_seconds(cfg: CandidateConfig, tp_comm_s: float, matmul_s: float, fw: MegatronFramework) -> float:
    """Seconds of a micro-batch's tensor-parallel communication (`tp_comm_s`) not hidden under
    the matmuls beside it (`matmul_s`): all of it without `tp_comm_overlap` (or without sequence
    parallelism, which the overlap needs); with it, what outlasts the matmuls, and at least one
    of its tp chunks (the pipelined split's last reduce-scatter chunk has no matmul after it)."""
    if cfg.tp == 1 or not (fw.tp_comm_overlap and fw.sequence_parallel):
        return tp_comm_s
    return max(tp_comm_s / cfg.tp, tp_comm_s - matmul_s)


def megatron_terms(
    params: StepTimeParams,
    shape: ModelShape,
    seq_len: int,
    cfg: CandidateConfig,
    fw: MegatronFramework,
    allreduce_s: float,
) -> Terms:
    """A step of `cfg` as Megatron-LM runs it: `params` price compute, tensor-parallel and
    stage-to-stage traffic and the optimizer step (their data-parallel terms are not read);
    `allreduce_s` is one fp32 all-reduce of the rank's gradients over the dp group's link."""
    t = StepTimeModel(replace(params, d0=0.0, d1=0.0, z=1.0, gamma=1.0), shape).terms(cfg)
    v = interleaved_stages(cfg, shape, fw)
    tp_comm = exposed_tp_seconds(cfg, t.tp_comm, matmul_share(shape, seq_len) * t.compute, fw)
    per_microbatch = t.compute + tp_comm + v * t.p2p
    pipeline = cfg.microbatches * per_microbatch
    bubble = (cfg.pp - 1) * per_microbatch / v
    rank_params = shape.max_stage_params(cfg.pp) / cfg.tp
    exposed = exposed_dp_seconds(cfg, allreduce_s, t.compute, rank_params, fw)
    return Terms(
        compute=t.compute,
        tp_comm=tp_comm,
        p2p=v * t.p2p,
        pipeline=pipeline,
        bubble=bubble,
        dp_allreduce=exposed,
        fixed=t.fixed,
        step=pipeline + bubble + exposed + t.fixed,
    )
