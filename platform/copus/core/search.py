"""The search space of an experiment: which (dp, tp, pp, mbs, gbs, dp_shard, recompute)
configurations exist.

Pure: shared by the profiler (which points to measure), the planner (which candidates to
score) and the simulator.
"""

from __future__ import annotations

from collections.abc import Sequence

from copus.core.layout import DP_SHARD_MODES, RECOMPUTE_MODES, CandidateConfig, ModelShape, layout_problems


def gbs_grid(lo: int, hi: int) -> list[int]:
    """Batch sizes between lo and hi spaced by about √2: powers of two and 1.5 × powers of
    two (they divide well by dp × mbs), plus both bounds."""
    values = {lo, hi}
    k = 1
    while k <= hi:
        for v in (k, 3 * k // 2 if k >= 2 else k):
            if lo <= v <= hi:
                values.add(v)
        k *= 2
    return sorted(values)


def valid_layouts(world: int, shape: ModelShape) -> list[tuple[int, int, int]]:
    """Every (dp, tp, pp) with dp × tp × pp = world that the model admits."""
    out = []
    for tp in range(1, world + 1):
        for pp in range(1, world // tp + 1):
            if world % (tp * pp) == 0:
                dp = world // (tp * pp)
                if not layout_problems(dp, tp, pp, shape, world):
                    out.append((dp, tp, pp))
    return out


def candidates(
    layouts: list[tuple[int, int, int]],
    mbs_values: list[int],
    gbs_values: list[int],
    shape: ModelShape,
    dp_shard: Sequence[str] = ("none",),
    recompute: Sequence[str] = ("none",),
) -> list[CandidateConfig]:
    """Every configuration of the layouts × MBS × GBS × sharding × recomputation grid that divides
    evenly with m ≥ pp. Sharding over a single replica is no sharding: a layout with dp = 1 gets
    `none` only (when the grid has it), so no configuration appears twice."""
    out = []
    for dp, tp, pp in layouts:
        shards = [s for s in dp_shard if dp > 1 or s == "none"] or (["none"] if dp == 1 else [])
        for mbs in mbs_values:
            for gbs in gbs_values:
                if layout_problems(dp, tp, pp, shape, None, gbs, mbs):
                    continue
                out += [CandidateConfig(dp, tp, pp, mbs, gbs, s, r) for s in shards for r in recompute]
    return out


def spread(values: list[int], count: int) -> list[int]:
    """Up to `count` values picked from a sorted list: the ends first, then evenly between."""
    if len(values) <= count:
        return list(values)
    if count == 1:
        return [values[0]]
    idx = sorted({round(i * (len(values) - 1) / (count - 1)) for i in range(count)})
    return [values[i] for i in idx]


def profile_points(
    cands: list[CandidateConfig], per_shape: int, max_microbatches: int | None = None
) -> list[CandidateConfig]:
    """Which candidates to measure, in the order to measure them: for each (layout, MBS), up
    to `per_shape` GBS values spread over its range (the model predicts the others; two
    determine the line in m, a third checks it). With `max_microbatches`, only GBS values
    of at most that many micro-batches per step are measured (at least the shape's smallest):
    step time is linear in m, so a point of hundreds of micro-batches costs minutes of budget
    and tells the model nothing two shorter ones do not. Ordered so that a budget cut short still
    covers every layout and MBS: first each shape's smallest GBS, then its largest, then the
    middle ones; grouped by layout within each round so a worker group builds each layout once
    per round."""
    by_shape: dict[tuple, list[CandidateConfig]] = {}
    for c in cands:
        by_shape.setdefault((c.dp, c.tp, c.pp, c.mbs, c.dp_shard, c.recompute), []).append(c)
    picked = {
        key: spread(_measurable(sorted(v, key=lambda c: c.gbs), max_microbatches), per_shape)
        for key, v in by_shape.items()
    }
    rounds: list[list[CandidateConfig]] = []
    for chosen in picked.values():
        # Round 0: smallest, round 1: largest, then the rest.
        ordered = [chosen[0]] + ([chosen[-1]] if len(chosen) > 1 else []) + chosen[1:-1]
        for r, c in enumerate(ordered):
            while len(rounds) <= r:
                rounds.append([])
            rounds[r].append(c)
    return [c for rnd in rounds for c in sorted(rnd, key=_shape_key)]


def _measurable(shape_points: list[CandidateConfig], max_microbatches: int | None) -> list[CandidateConfig]:
    """A shape's points (sorted by GBS) worth measuring under the micro-batch cap."""
    if max_microbatches is None:
        return shape_points
    return [c for c in shape_points if c.microbatches <= max_microbatches] or shape_points[:1]


def _shape_key(c: CandidateConfig) -> tuple:
    """Measuring order within a round: by model build (layout, sharding, recomputation: a worker
    group builds each once per round), then MBS."""
    return (c.dp, c.tp, c.pp, DP_SHARD_MODES.index(c.dp_shard), RECOMPUTE_MODES.index(c.recompute), c.mbs)
