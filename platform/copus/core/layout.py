"""Which 3D layouts (dp, tp, pp) and batch shapes a model admits. Pure: used by the config
validator (before any worker starts), by the worker's ParallelDims, and later by the planner
and the simulator.

Each problem is a (field, message) pair so the caller can phrase it as ``field: message``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    vocab_size: int


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


def layout_problems(dp: int, tp: int, pp: int, shape: ModelShape, world_size: int | None = None,
                    gbs: int | None = None, mbs: int | None = None) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    if world_size is not None and dp * tp * pp != world_size:
        problems.append(("cluster.num_workers", f"{world_size} does not match the layout parallel.dp x tp x pp = "
                                                f"{dp} x {tp} x {pp} = {dp * tp * pp}"))
    for what, size in (("attention heads", shape.n_heads), ("KV heads", shape.n_kv_heads),
                       ("MLP width", shape.ffn_dim), ("vocabulary", shape.vocab_size)):
        if size % tp:
            problems.append(("parallel.tp", f"{tp} does not divide the model's {size} {what}"))
            break
    if pp > shape.n_layers:
        problems.append(("parallel.pp", f"{pp} stages exceed the model's {shape.n_layers} layers"))
    if gbs is not None and mbs is not None:
        if gbs % (dp * mbs):
            problems.append(("batch.gbs", f"{gbs} is not divisible by parallel.dp x batch.mbs = {dp} x {mbs}"))
        elif pp > 1 and gbs // (dp * mbs) < pp:
            problems.append(("batch.gbs", f"{gbs} gives {gbs // (dp * mbs)} micro-batches per replica "
                                          f"(gbs / (dp x mbs)), fewer than the {pp} pipeline stages"))
    return problems
