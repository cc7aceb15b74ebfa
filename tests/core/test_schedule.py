"""LR schedule: batch-size scaling rules, warm-up and decay counted in samples."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from copus.core.schedule import LRSchedule, batch_scale


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
