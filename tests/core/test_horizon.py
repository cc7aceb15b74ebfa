"""The rest of the run: read off the validation curve against the target, else as long as the run
so far."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from copus.core.horizon import elapsed_horizon, read_ratios, rest_of_run, samples_to_target


def power_law(samples, a=8.0, b=-0.15):
    return [a * s**b for s in samples]


def test_an_exact_power_law_gives_the_samples_to_the_target_exactly():
    samples = [1000.0 * 2**k for k in range(8)]
    target = 8.0 * 1e6**-0.15
    low, central = samples_to_target(samples, power_law(samples), target, z=1.645)
    assert central == pytest.approx(1e6, rel=1e-9) and low == pytest.approx(central, rel=1e-9)


def test_a_noisy_curve_reads_the_shorter_end_and_the_fit_uses_the_latest_points():
    rng = np.random.default_rng(0)
    samples = [1000.0 * 1.5**k for k in range(20)]
    losses = [v * math.exp(0.01 * rng.standard_normal()) for v in power_law(samples)]
    low, central = samples_to_target(samples, losses, 8.0 * 1e7**-0.15, z=1.645)
    assert low < central and 0.5 < central / 1e7 < 2.0
    # the first points do not enter: a different early curve changes nothing
    early = [100.0] * 12 + losses[12:]
    assert samples_to_target(samples, early, 8.0 * 1e7**-0.15, z=1.645) == (low, central)


@pytest.mark.parametrize(
    "samples, losses",
    [
        ([100.0, 200.0], [3.0, 2.9]),  # two points: no error to measure
        ([100.0, 200.0, 400.0], [3.0, 3.0, 3.0]),  # flat: no progress to extrapolate
        ([100.0, 200.0, 400.0], [3.0, 3.1, 3.2]),  # rising
        ([0.0, 0.0, 0.0], [3.0, 2.9, 2.8]),  # no samples seen
    ],
)
def test_without_a_falling_curve_to_fit_the_run_so_far_stands(samples, losses):
    assert samples_to_target(samples, losses, 2.0, z=1.645) is None
    h = rest_of_run(samples, losses, 2.0, 400.0, 10.0, elapsed_s=50.0, interval_s=30.0, z=1.645)
    assert h == elapsed_horizon(50.0, 30.0) and h.source == "elapsed" and h.seconds == 50.0


def test_without_a_target_or_a_speed_the_run_so_far_stands_at_least_one_interval():
    samples = [1000.0 * 2**k for k in range(8)]
    assert rest_of_run(samples, power_law(samples), None, 1e5, 100.0, 10.0, 30.0, 1.645).seconds == 30.0
    assert rest_of_run(samples, power_law(samples), 1.0, 1e5, math.nan, 90.0, 30.0, 1.645).source == "elapsed"
    assert elapsed_horizon(math.nan, 30.0).seconds == 30.0


def test_the_seconds_left_are_the_samples_left_at_the_runs_speed():
    samples = [1000.0 * 2**k for k in range(8)]
    target = 8.0 * 1e6**-0.15
    h = rest_of_run(samples, power_law(samples), target, 128_000.0, 200.0, 500.0, 30.0, 1.645)
    assert h.source == "target" and h.samples_left == pytest.approx(1e6 - 128_000.0)
    assert h.seconds == pytest.approx((1e6 - 128_000.0) / 200.0)
    past = rest_of_run(samples, power_law(samples), target, 2e6, 200.0, 500.0, 30.0, 1.645)
    assert past.seconds == 0.0  # the curve says the target is behind: no switch can repay


@settings(max_examples=40, deadline=None)
@given(st.floats(0.001, 0.05), st.floats(1.0, 3.0), st.integers(0, 10_000))
def test_a_wider_quantile_never_lengthens_the_horizon(noise, z, seed):
    rng = np.random.default_rng(seed)
    samples = [500.0 * 1.4**k for k in range(10)]
    losses = [v * math.exp(noise * rng.standard_normal()) for v in power_law(samples)]
    fit_z = samples_to_target(samples, losses, 1.5, z)
    fit_0 = samples_to_target(samples, losses, 1.5, 0.0)
    if fit_0 is not None:  # noise may flatten the curve
        assert fit_z[0] <= fit_0[0] * (1 + 1e-12) and fit_z[1] == pytest.approx(fit_0[1])


def test_on_real_validation_curves_the_horizon_reads_about_what_was_left():
    """The two emulated-cluster pilots' curves (validation noise about 0.03 near the target): read
    at every evaluation from 20% of the way on, the horizon is neither collapsed nor inflated."""
    data = json.loads((Path(__file__).parent.parent / "data" / "horizon" / "emulated-pilot-curves.json").read_text())
    ratios = []
    for run in data["runs"]:
        ratios += read_ratios(run["samples"], run["val_loss"], data["target_val_loss"], z=1.0)
    assert len(ratios) > 100
    assert 0.8 < np.median(ratios) < 1.2 and np.percentile(ratios, 10) > 0.5


def test_a_run_that_never_reached_its_target_reads_nothing():
    samples = [1000.0 * 2**k for k in range(8)]
    assert read_ratios(samples, power_law(samples), target=0.1, z=1.0) == []
