"""LR schedule: batch-size scaling rules, warm-up and decay counted in samples."""

from __future__ import annotations

import bisect
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from copus.core.schedule import Cadence, LRSchedule, batch_scale


def test_scaling_rules():
    assert batch_scale("sqrt", 64, 16) == pytest.approx(2.0)
    assert batch_scale("linear", 64, 16) == pytest.approx(4.0)
    assert batch_scale("none", 64, 16) == 1.0
    with pytest.raises(ValueError, match="optimizer.lr_scaling: unknown rule 'cubic'"):
        batch_scale("cubic", 64, 16)


@given(samples=st.integers(0, 10**7), gbs=st.integers(1, 4096))
def test_lr_is_bounded_and_positive(samples, gbs):
    sched = LRSchedule(1e-3, 16, "sqrt", warmup_samples=1000, decay="cosine", decay_samples=10**6, min_lr_ratio=0.1)
    lr = sched.lr(samples, gbs)
    top = 1e-3 * math.sqrt(gbs / 16)
    assert 0 < lr <= top * (1 + 1e-12)
    if samples >= 10**6:
        assert lr == pytest.approx(0.1 * top)


def test_warmup_is_in_samples_not_steps():
    sched = LRSchedule(1e-3, 16, "none", warmup_samples=100)
    # The same amount of data gives the same warm-up factor whatever the batch size.
    assert sched.lr(49, 16) == sched.lr(49, 64) == pytest.approx(0.5e-3)
    assert sched.lr(100, 16) == 1e-3
    assert sched.lr(0, 16) > 0


def test_a_growing_cadence_samples_a_curve_evenly_in_log_samples():
    every = Cadence(steps=1, samples=64, origin=960, growth=0.25)
    since = [s - 960 for s in range(961, 960 + 10_001) if every.due(0, s, 1)]
    assert since[:4] == [64, 128, 192, 256]  # the fixed interval until it is a quarter of the samples since
    for a, b in zip(since[3:], since[4:]):
        assert b - a == pytest.approx(0.25 * a, abs=2)
    assert len(since) == 20  # against 156 at the fixed interval
    fixed = Cadence(steps=1, samples=64, origin=960)  # no growth: multiples of the interval, as before
    assert [s for s in range(1, 1000) if fixed.due(0, s, 1)] == list(range(64, 1000, 64))


@given(st.integers(1, 300), st.floats(0.01, 1.0), st.integers(0, 5000))
def test_a_growing_cadence_is_due_once_per_step_that_passes_a_point(gbs, growth, origin):
    every = Cadence(steps=1, samples=48, origin=origin, growth=growth)
    points = [u for u in range(1, 5_000) if every.due(0, origin + u, 1)]  # each point, one sample at a time
    for u in range(gbs, 5_000, gbs):
        passed = bisect.bisect_right(points, u) - bisect.bisect_right(points, u - gbs)
        assert every.due(0, origin + u, gbs) == (passed > 0)
