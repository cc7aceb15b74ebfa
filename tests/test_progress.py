"""The live progress line: the ETA to the target read off the validation curve, beside the budget."""

import math

from copus.cluster.progress import eta_to_target, progress_line
from copus.records import StepRecord
from copus.train.worker_plan import StopRule


def _step(samples: int, samples_per_s: float = 100.0) -> StepRecord:
    return StepRecord(
        step=samples // 16, samples=samples, train_loss=3.0, gbs=16, mbs=4, dp=4, tp=1, pp=1,
        step_time_s=0.16, samples_per_s=samples_per_s, wall_clock_s=samples / samples_per_s,
    )  # fmt: skip


def _power_law_curve(points: int) -> list[tuple[float, float]]:
    # L = 10 · S^-0.2: reaches 2.0 at S = 5^5 = 3125 samples
    return [(float(s), 10.0 * s**-0.2) for s in (400, 800, 1200, 1600, 2000)[:points]]


def test_the_eta_to_target_is_the_fitted_curves_crossing_at_the_current_speed():
    stop = StopRule(target_val_loss=2.0, max_wall_clock_s=600.0)
    eta = eta_to_target(_step(2000), stop, _power_law_curve(5))
    assert math.isclose(eta, (3125 - 2000) / 100.0, rel_tol=1e-9)
    line = progress_line(_step(2000), stop, 2.2, _power_law_curve(5))
    assert "ETA to target 00:11, to budget 09:40" in line


def test_the_eta_to_target_is_na_until_the_curve_can_say():
    stop = StopRule(target_val_loss=2.0, max_steps=1000)
    assert eta_to_target(_step(800), stop, _power_law_curve(2)) is None  # two evaluations leave no error
    assert "ETA to target n/a, to budget" in progress_line(_step(800), stop, None, _power_law_curve(2))
    rising = [(400.0, 2.5), (800.0, 2.6), (1200.0, 2.7)]
    assert eta_to_target(_step(1200), stop, rising) is None
    no_target = StopRule(max_steps=1000)
    assert eta_to_target(_step(2000), no_target, _power_law_curve(5)) is None


def test_a_run_past_the_crossing_shows_zero_not_a_negative_time():
    stop = StopRule(target_val_loss=2.0)
    assert eta_to_target(_step(4000), stop, _power_law_curve(5)) == 0.0
    assert "to budget n/a" in progress_line(_step(4000), stop, 2.0, _power_law_curve(5))
