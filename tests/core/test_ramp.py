"""The batch-size ramp (`policy.name: ramp`): Megatron's linear rampup and explicit tables."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from copus.core.layout import CandidateConfig
from copus.core.ramp import BatchRamp, ramp_order


@st.composite
def linear_ramps(draw):
    start = draw(st.integers(1, 64))
    increment = draw(st.integers(1, 64))
    n = draw(st.integers(1, 40))
    ramp_samples = draw(st.integers(1, 5000))
    return start, increment, ramp_samples, start + n * increment


def megatron_gbs(start: int, increment: int, ramp_samples: int, final: int, samples: int) -> int:
    """Megatron's formula, in exact arithmetic: floor(s / (ramp_samples / n)) increments."""
    n = (final - start) // increment
    return min(final, start + (samples * n // ramp_samples) * increment)


@settings(max_examples=60, deadline=None)
@given(ramp=linear_ramps(), probes=st.lists(st.integers(0, 10_000), min_size=1, max_size=30))
def test_the_linear_ramp_is_megatrons_formula_monotone_and_reaches_the_final_gbs_at_its_end(ramp, probes):
    start, increment, ramp_samples, final = ramp
    schedule = BatchRamp.linear(start, increment, ramp_samples, final)
    for s in probes:
        assert schedule.gbs(s) == megatron_gbs(*ramp, s)
    for a, b in zip(sorted(probes), sorted(probes)[1:]):
        assert schedule.gbs(a) <= schedule.gbs(b)
    assert schedule.gbs(0) == schedule.start_gbs == start
    assert schedule.gbs(ramp_samples) == schedule.final_gbs == final
    assert schedule.gbs(ramp_samples - 1) < final  # not a sample before
    assert schedule.gbs(10 * ramp_samples) == final and schedule.end_samples == ramp_samples
    assert all((g - start) % increment == 0 for _, g in schedule.points)


def test_a_linear_ramp_in_numbers():
    # Megatron --rampup-batch-size 8 8 300 with --global-batch-size 32: 3 increments, every 100 samples.
    ramp = BatchRamp.linear(8, 8, 300, 32)
    assert ramp.points == ((0, 8), (100, 16), (200, 24), (300, 32))
    assert [ramp.gbs(s) for s in (0, 99, 100, 199, 200, 299, 300, 10**9)] == [8, 8, 16, 16, 24, 24, 32, 32]
    # Chunks that are no whole number of samples: each change at the first sample past its share.
    assert BatchRamp.linear(4, 4, 10, 16).points == ((0, 4), (4, 8), (7, 12), (10, 16))
    # Chunks under one sample: the increments that fall on one count collapse into its last.
    assert BatchRamp.linear(1, 1, 2, 5).points == ((0, 1), (1, 3), (2, 5))
    assert ramp.describe() == "GBS 8 to 32 in 3 changes over 300 samples"


@given(
    table=st.lists(st.tuples(st.integers(1, 10_000), st.integers(1, 512)), max_size=12, unique_by=lambda p: p[0]),
    first=st.integers(1, 512),
    probe=st.integers(0, 20_000),
)
def test_a_table_gives_the_gbs_of_its_last_point_at_or_before_the_samples(table, first, probe):
    points = [(0, first), *sorted(table)]
    ramp = BatchRamp.from_table([list(p) for p in points])
    expected = [g for s, g in points if s <= probe][-1]
    assert ramp.gbs(probe) == expected
    for s, g in points:
        assert ramp.gbs(s) == g  # a point's GBS holds from its own sample count on


@pytest.mark.parametrize(
    "points,message",
    [
        ((), "starts at 0 samples"),
        (((5, 8),), "starts at 0 samples"),
        (((0, 8), (100, 16), (100, 32)), "must increase strictly"),
        (((0, 8), (200, 16), (100, 32)), "must increase strictly"),
        (((0, 0),), "must be positive"),
    ],
)
def test_a_malformed_table_is_refused(points, message):
    with pytest.raises(ValueError, match=message):
        BatchRamp(points)


@pytest.mark.parametrize("args", [(8, 8, 300, 8), (16, 8, 300, 8), (8, 5, 300, 32), (8, 0, 300, 32), (8, 8, 0, 32)])
def test_an_impossible_linear_ramp_is_refused(args):
    with pytest.raises(ValueError, match="no linear ramp"):
        BatchRamp.linear(*args)


def test_the_order_changes_the_gbs_only_and_only_when_the_schedule_moves():
    ramp = BatchRamp.linear(8, 8, 300, 32)
    current = CandidateConfig(dp=2, tp=1, pp=1, mbs=2, gbs=8, dp_shard="optimizer")
    assert ramp_order(ramp, 96, current) is None
    order = ramp_order(ramp, 104, current)
    assert order.config == CandidateConfig(dp=2, tp=1, pp=1, mbs=2, gbs=16, dp_shard="optimizer")
    assert (order.change, order.way, order.cost_s) == ("gbs", "in_place", 0.0)
    assert order.reason == "ramp: 104 samples seen, schedule says GBS 16"
    # A run that resumes behind the schedule (a checkpoint of an older GBS) jumps straight to it.
    assert ramp_order(ramp, 250, current).config.gbs == 24
