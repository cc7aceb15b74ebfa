"""Which 3D layouts (dp, tp, pp) and batch shapes a model admits. Pure: used by the config
validator (before any worker starts), by the worker's ParallelDims, and later by the planner
and the simulator.

Each problem is a (field, message) pair so the caller can phrase it as ``field: message``.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields
from typing import Literal, get_args

DpShard = Literal["none", "optimizer", "full"]
Recompute = Literal["none", "selective", "full"]
DP_SHARD_MODES: tuple[str, ...] = get_args(DpShard)
RECOMPUTE_MODES: tuple[str, ...] = get_args(Recompute)
REPLICA_FIELDS = ("dp", "tp", "pp", "dp_shard", "recompute")  # CandidateConfig.replica()


@dataclass(frozen=True)
class CandidateConfig:
    """One candidate configuration of a run: the 3D layout and the batch shape. It is what the
    planner chooses among, the profiler measures, a worker trains in and a record reports."""

    dp: int
    tp: int
    pp: int
    mbs: int
    gbs: int
    # How the dp group shares the model state (none: every replica holds all of it; optimizer:
    # AdamW state and gradients sharded; full: parameters too) and what the backward pass
    # recomputes instead of keeping (none, selective: attention and MLP inner activations, full:
    # whole layers). Both are choices of the planner like the layout.
    dp_shard: DpShard = "none"
    recompute: Recompute = "none"

    @property
    def microbatches(self) -> int:
        return self.gbs // (self.dp * self.mbs)

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    def replica(self) -> dict:
        """What a replica is built with: the layout, its sharding and its recomputation. Configurations
        that differ only in MBS or GBS share a replica; any other change builds another."""
        return {k: getattr(self, k) for k in REPLICA_FIELDS}

    def label(self) -> str:
        return f"{self.layout_label()} mbs{self.mbs} gbs{self.gbs}{self.knobs_label()}"

    def layout_label(self) -> str:
        """The layout alone, e.g. dp2-tp1-pp1: how overheads and run factors are keyed."""
        return f"dp{self.dp}-tp{self.tp}-pp{self.pp}"

    def shape_label(self) -> str:
        """The label without the GBS: what stays when only the batch size changes."""
        return f"dp{self.dp}-tp{self.tp}-pp{self.pp} mbs{self.mbs}{self.knobs_label()}"

    def knobs_label(self) -> str:
        """The knobs that are not "none", as they end a label (" shard=full recompute=selective")."""
        pairs = (("shard", self.dp_shard), ("recompute", self.recompute))
        return "".join(f" {name}={value}" for name, value in pairs if value != "none")

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> CandidateConfig:
        """From any mapping that carries the fields (a record, a profile row, summary.json's layout);
        other keys are ignored, a missing field raises KeyError naming it."""
        return cls(
            **{
                f.name: (int(data[f.name]) if f.default is MISSING else str(data[f.name]))
                for f in fields(cls)
                if f.default is MISSING or data.get(f.name) is not None
            }
        )


@dataclass(frozen=True)
class ModelShape:
    """What layout rules, memory and throughput models need to know of a decoder model."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    vocab_size: int
    dim: int = 0
    qkv_bias: bool = False
    tie_embeddings: bool = False

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * (self.dim // self.n_heads)

    def layer_params(self) -> int:
        attn = self.dim * self.dim * 2 + self.dim * self.kv_dim * 2  # wq, wo, wk, wv
        if self.qkv_bias:
            attn += self.dim + 2 * self.kv_dim
        return attn + 3 * self.dim * self.ffn_dim + 2 * self.dim  # SwiGLU MLP, two RMSNorm weights

    def embed_params(self) -> int:
        return self.vocab_size * self.dim

    def head_params(self) -> int:
        """Final norm and LM head (the head shares the embedding when tied)."""
        return self.dim + (0 if self.tie_embeddings else self.vocab_size * self.dim)

    def param_count(self) -> int:
        return self.embed_params() + self.n_layers * self.layer_params() + self.head_params()

    def stage_params(self, pp: int, stage: int) -> int:
        """Parameters held by one pipeline stage (before tensor-parallel sharding)."""
        n = len(stage_layer_ranges(self.n_layers, pp)[stage]) * self.layer_params()
        if stage == 0:
            n += self.embed_params()
        if stage == pp - 1:
            n += self.head_params()
        return n

    def max_stage_params(self, pp: int) -> int:
        return max(self.stage_params(pp, s) for s in range(pp))


def stage_layer_ranges(n_layers: int, pp: int) -> list[range]:
    """Balanced split of layers over pp stages; earlier stages take the remainder, since the
    last stage also carries the LM head."""
    base, extra = divmod(n_layers, pp)
    ranges, start = [], 0
    for stage in range(pp):
        size = base + (1 if stage < extra else 0)
        ranges.append(range(start, start + size))
        start += size
    return ranges


def bubble_fraction(pp: int, microbatches: int) -> float:
    """Idle share of a GPipe/1F1B step: (p - 1) / (m + p - 1)."""
    return (pp - 1) / (microbatches + pp - 1)


def layout_problems(
    dp: int,
    tp: int,
    pp: int,
    shape: ModelShape,
    world_size: int | None = None,
    gbs: int | None = None,
    mbs: int | None = None,
) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    if world_size is not None and dp * tp * pp != world_size:
        problems.append(
            (
                "cluster.num_workers",
                f"{world_size} does not match the layout parallel.dp x tp x pp = {dp} x {tp} x {pp} = {dp * tp * pp}",
            )
        )
    for what, size in (
        ("attention heads", shape.n_heads),
        ("KV heads", shape.n_kv_heads),
        ("MLP width", shape.ffn_dim),
        ("vocabulary", shape.vocab_size),
    ):
        if size % tp:
            problems.append(("parallel.tp", f"{tp} does not divide the model's {size} {what}"))
            break
    if pp > shape.n_layers:
        problems.append(("parallel.pp", f"{pp} stages exceed the model's {shape.n_layers} layers"))
    if pp > 1 and shape.tie_embeddings:
        # The first stage holds the embedding, the last the head: one shared weight cannot be
        # on both (Megatron all-reduces their gradients; not implemented here).
        problems.append(
            (
                "parallel.pp",
                f"{pp} stages: the model ties its input and output embeddings, which "
                "pipeline stages would untie (use pp = 1)",
            )
        )
    if gbs is not None and mbs is not None:
        if gbs % (dp * mbs):
            problems.append(("batch.gbs", f"{gbs} is not divisible by parallel.dp x batch.mbs = {dp} x {mbs}"))
        elif pp > 1 and gbs // (dp * mbs) < pp:
            problems.append(
                (
                    "batch.gbs",
                    f"{gbs} gives {gbs // (dp * mbs)} micro-batches per replica "
                    f"(gbs / (dp x mbs)), fewer than the {pp} pipeline stages",
                )
            )
    return problems
