"""The search space: valid configurations only, and a profiling order that covers every
layout and MBS before it refines any."""

from __future__ import annotations

from copus.core.layout import layout_problems
from copus.core.search import candidates, gbs_grid, profile_points, spread, valid_layouts
from workloads.flavours import FLAVOURS

SHAPE = FLAVOURS["tiny"].shape()


def test_valid_layouts_multiply_to_the_world_and_respect_the_model():
    layouts = valid_layouts(8, SHAPE)
    assert (2, 2, 2) in layouts and (8, 1, 1) in layouts and (1, 8, 1) not in layouts  # tiny has 4 heads
    assert all(dp * tp * pp == 8 and not layout_problems(dp, tp, pp, SHAPE, 8) for dp, tp, pp in layouts)


def test_candidates_divide_evenly_and_fill_the_pipeline():
    cands = candidates(valid_layouts(4, SHAPE), [2, 4, 8], gbs_grid(8, 64), SHAPE)
    assert cands
    for c in cands:
        assert c.gbs % (c.dp * c.mbs) == 0 and c.microbatches >= c.pp


def test_profile_points_cover_every_shape_first_then_refine():
    cands = candidates(valid_layouts(2, SHAPE), [2, 4, 8], gbs_grid(8, 128), SHAPE)
    points = profile_points(cands, per_shape=3)
    shapes = {(c.dp, c.tp, c.pp, c.mbs) for c in cands}
    first_round = points[: len(shapes)]
    assert {(c.dp, c.tp, c.pp, c.mbs) for c in first_round} == shapes
    # Each shape's first point is its smallest GBS, its second its largest.
    for key in shapes:
        mine = [c.gbs for c in points if (c.dp, c.tp, c.pp, c.mbs) == key]
        options = sorted(c.gbs for c in cands if (c.dp, c.tp, c.pp, c.mbs) == key)
        assert mine[0] == options[0] and mine[1] == options[-1] and len(mine) == min(3, len(options))
    assert len(set(points)) == len(points)


def test_profile_points_skip_steps_of_too_many_microbatches():
    cands = candidates(valid_layouts(2, SHAPE), [2, 4, 8], gbs_grid(8, 256), SHAPE)
    points = profile_points(cands, per_shape=3, max_microbatches=8)
    assert points and all(c.microbatches <= 8 for c in points)
    assert {(c.dp, c.tp, c.pp, c.mbs) for c in points} == {(c.dp, c.tp, c.pp, c.mbs) for c in cands}
    # One micro-batch at most: each shape keeps one point, its smallest GBS (pipelines need m >= pp,
    # so theirs is over the cap and kept all the same).
    assert profile_points(cands, 3, max_microbatches=1) == profile_points(cands, 1)


def test_spread_keeps_the_ends():
    assert spread([1, 2, 3, 4, 5], 3) == [1, 3, 5]
    assert spread([1, 2], 3) == [1, 2]
    assert spread([4, 5, 6], 1) == [4]
