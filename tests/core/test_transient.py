"""The switch's transient read off continuation curves (copus.core.transient), on synthetic
continuations whose steady rate follows E(B) = E_min (1 + B / B_crit) and whose first steps after
the switch run slower by a known factor."""

import math

import numpy as np
import pytest

from copus.core.calibration import smoothed_crossing
from copus.core.transient import halves, transient_table

B0, DECREMENT, E_MIN, B_CRIT, START, CURVATURE = 16, 0.1, 400.0, 48.0, 2.5, 2.0


def _curve(gbs: int, slow_steps: int, slowdown: float, every: int, noise: float, rng) -> tuple[list, list]:
    """A continuation's validation curve, evaluated every `every` samples to a third of the
    decrement beyond it, plus normal noise of sd `noise`. Its progress is x = effective samples /
    E(B) and its loss START - DECREMENT * f(x), f concave with f(1) = 1 (the first half of the
    decrement is quicker than the second at every GBS, as a real loss curve's); the effective
    samples count those of the first `slow_steps` steps (the switch's transient) `slowdown` times."""
    e = E_MIN * (1 + gbs / B_CRIT)
    slow_until = slow_steps * gbs
    samples, losses = [0.0], [START]
    while losses[-1] > START - 4 * DECREMENT / 3 + 3 * noise:
        s = samples[-1] + every
        x = (s - (1 - slowdown) * min(s, slow_until)) / e
        samples.append(s)
        losses.append(
            START - DECREMENT * math.log1p(CURVATURE * x) / math.log1p(CURVATURE) + noise * rng.standard_normal()
        )
    return samples, losses


def _points(slow: dict[int, int], slowdown: float = 0.5, noise: float = 0.0, seeds: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    out = []
    for gbs in (4, 16, 64, 256):
        for k in range(seeds):
            every = max(gbs, 16)
            xs, ys = _curve(gbs, slow.get(gbs, 0), slowdown, every, noise, rng)
            whole = smoothed_crossing(xs, ys, START - DECREMENT, DECREMENT / 3)
            out.append(
                {"branch": 0, "gbs": gbs, "seed": k, "samples": whole, "curve_samples": xs, "curve_val_loss": ys}
            )
    return out


BRANCH = [{"val_loss": START, "samples_seen": 1000, "b_crit": B_CRIT}]


def test_without_a_transient_both_halves_read_the_same_critical_batch():
    (entry,) = transient_table(_points({}), BRANCH, B0, DECREMENT)
    for row in entry["rows"]:
        # The curve is concave: its first half is quicker, at every GBS alike.
        assert row["first_half_share"] == pytest.approx(0.366, abs=0.02)
        assert row["share_gap"] == pytest.approx(0.0, abs=0.01)  # the crossings read a curved curve by lines
        assert row["transient_share"] == pytest.approx(0.0, abs=0.02)
    assert entry["b_crit_first"] == pytest.approx(B_CRIT, rel=0.1)
    assert entry["b_crit_late"] == pytest.approx(B_CRIT, rel=0.1)


def test_a_transient_at_the_large_batches_shows_in_their_first_half_and_the_late_half_b_crit():
    # The switch to 64 and 256 runs at half speed for its first 8 steps (the reference GBS and
    # the smaller ones do not), within the first half of the decrement at both.
    (entry,) = transient_table(_points({64: 8, 256: 3}), BRANCH, B0, DECREMENT)
    rows = {r["gbs"]: r for r in entry["rows"]}
    assert rows[4]["share_gap"] == pytest.approx(0.0, abs=0.01)
    for gbs, steps in ((64, 8), (256, 3)):
        # Half speed for steps x gbs samples costs half as many samples more, all in the first half.
        assert rows[gbs]["share_gap"] > 0.05  # 0.14 and 0.08 here: 37% of the samples without the transient
        assert rows[gbs]["transient_samples"] == pytest.approx(steps * gbs / 2, rel=0.25)
    # The whole decrement's fit mixes the transient in; the late half does not see it.
    assert entry["b_crit_late"] == pytest.approx(B_CRIT, rel=0.1)
    assert entry["b_crit_first"] < 0.8 * B_CRIT


def test_noisy_curves_give_an_interval_around_the_transient():
    (entry,) = transient_table(_points({64: 8}, noise=0.004, seed=3), BRANCH, B0, DECREMENT)
    rows = {r["gbs"]: r for r in entry["rows"]}
    assert rows[64]["seeds"] == rows[64]["seeds_b0"] == 4
    assert rows[64]["share_gap_low"] < rows[64]["share_gap"] < rows[64]["share_gap_high"]
    assert rows[64]["share_gap_low"] > 0.0
    assert rows[4]["share_gap_low"] < 0.0 < rows[4]["share_gap_high"]


def test_a_continuation_without_a_curve_or_a_measurement_has_no_halves():
    assert all(math.isnan(v) for v in halves({"samples": 100.0, "curve_samples": [], "curve_val_loss": []}, 0.1))
    xs, ys = [0.0, 25.0, 50.0, 75.0, 100.0, 125.0], [2.5, 2.475, 2.45, 2.425, 2.4, 2.375]
    assert all(math.isnan(v) for v in halves({"samples": None, "curve_samples": xs, "curve_val_loss": ys}, 0.1))
    first, late = halves({"samples": 100.0, "curve_samples": xs, "curve_val_loss": ys}, 0.1)
    assert (first, late) == pytest.approx((50.0, 50.0))


def test_points_taken_over_without_curves_give_no_table():
    points = [{"branch": 0, "gbs": 16, "seed": 0, "samples": 100.0, "curve_samples": [], "curve_val_loss": []}]
    assert transient_table(points, BRANCH, B0, DECREMENT) is None


def test_growth_over_half_a_decrement_comes_from_the_branch_points():
    branches = [
        {"val_loss": 2.6, "samples_seen": 1000, "b_crit": 20.0},
        {"val_loss": 2.3, "samples_seen": 4000, "b_crit": 80.0},
    ]
    points = [dict(p, branch=b) for b in (0, 1) for p in _points({})]
    entries = transient_table(points, branches, B0, DECREMENT)
    # log B_crit grows by log 4 over 0.3 nats: over 0.05 nats, a factor 4 ** (1/6).
    for entry in entries:
        assert entry["growth_expected"] == pytest.approx(4 ** (1 / 6))


def test_the_share_gap_interval_covers_no_transient_at_its_nominal_rate():
    # 120 calibrations of noisy curves (8 seeds) with no transient anywhere: the 95% interval of
    # every GBS's gap to B0 holds 0 at least 90% of the time.
    covered = []
    for rep in range(120):
        (entry,) = transient_table(_points({}, noise=0.006, seeds=8, seed=100 + rep), BRANCH, B0, DECREMENT)
        covered += [r["share_gap_low"] <= 0.0 <= r["share_gap_high"] for r in entry["rows"]]
    assert np.mean(covered) >= 0.9


def test_a_branch_point_without_continuations_reads_nothing_rather_than_failing():
    branches = [BRANCH[0], {"val_loss": 2.3, "samples_seen": 4000, "b_crit": 80.0}]
    first, second = transient_table(_points({}), branches, B0, DECREMENT)
    assert first["b_crit_late"] is not None
    assert second["rows"] == [] and second["b_crit_first"] is None and second["b_crit_late"] is None
