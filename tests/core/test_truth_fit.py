"""The simulator's statistical truth fitted to runs (copus.core.truth_fit): runs made by a known
truth at several GBS, measured with noise, give that truth back."""

import math

import numpy as np
import pytest

from copus.core.simulator import CriticalBatch, LossCurve, NoiseEstimate, TrainingModel
from copus.core.truth_fit import Trajectory, fit_estimate, fit_truth, predicted_samples_to, samples_to

SEQ = 128
INITIAL = math.log(256)
TRUTH = LossCurve(e=1.2, a=0.0, b=60.0, beta=0.3, initial=INITIAL), CriticalBatch(b_star_tokens=3.0e5, alpha_b=0.3)


def _run(gbs: int, steps: int, noise: float, rng) -> Trajectory:
    """A run of `steps` at `gbs` under TRUTH, its loss measured every 5 steps with `noise` nats."""
    model = TrainingModel(1.0, SEQ, *TRUTH)
    evals = [(0, INITIAL)]
    for k in range(1, steps + 1):
        model.step(gbs)
        if k % 5 == 0:
            evals.append((model.samples, model.loss + noise * float(rng.standard_normal())))
    return Trajectory(f"gbs{gbs}", (gbs,) * steps, tuple(evals))


def _b_crit(critical: CriticalBatch, loss: float) -> float:
    return critical.tokens(loss) / SEQ


def test_runs_at_several_gbs_give_their_truth_back():
    rng = np.random.default_rng(0)
    runs = [_run(4, 400, 0.01, rng), _run(16, 200, 0.01, rng), _run(64, 120, 0.01, rng)]
    fit = fit_truth(runs, SEQ, INITIAL, min_samples=100)
    assert fit.rms < 0.015  # the measurement noise, not a misfit
    for loss in (3.0, 2.5, 2.2):  # the critical batch over the losses the runs cross
        assert _b_crit(fit.critical, loss) == pytest.approx(_b_crit(TRUTH[1], loss), rel=0.2)
    for run in runs:  # and what a run is there for: its samples to a target (the GBS kept past the run)
        steps = list(run.gbs_per_step) * 10
        measured = predicted_samples_to(steps, 2.4, *TRUTH, SEQ)
        fitted = predicted_samples_to(steps, 2.4, fit.curve, fit.critical, SEQ)
        assert measured is not None and fitted == pytest.approx(measured, rel=0.1)
    assert samples_to(runs[0], 3.0) is not None and samples_to(runs[0], 0.5) is None


def test_a_fit_without_two_gbs_or_enough_points_is_refused():
    rng = np.random.default_rng(1)
    with pytest.raises(ValueError, match="one and the same GBS"):
        fit_truth([_run(16, 100, 0.0, rng), _run(16, 50, 0.0, rng)], SEQ, INITIAL)
    with pytest.raises(ValueError, match="need at least 6"):
        fit_truth([_run(4, 10, 0.0, rng), _run(16, 10, 0.0, rng)], SEQ, INITIAL, min_samples=100)


def test_the_estimates_mapping_error_and_noise_come_back_from_runs_that_read_them():
    """Runs whose live estimate reads m x eps x B_crit(lagged) / c, eps lognormal with sd 0.4:
    fitted against the truth that made them, m and the noise come back."""
    rng = np.random.default_rng(2)
    lag, c, m = NoiseEstimate(), 2.3, 1.8
    runs = []
    for gbs, steps in ((4, 300), (16, 150)):
        model = TrainingModel(1.0, SEQ, *TRUTH, keep_history=True)
        readings = []
        for _ in range(steps):
            model.step(gbs)
            lagged = model.b_crit_at(model.samples - lag.lag(model.samples, 16))
            readings.append((model.samples, m * math.exp(0.4 * rng.standard_normal()) * lagged / c))
        runs.append(
            Trajectory(f"gbs{gbs}", (gbs,) * steps, ((0, INITIAL), (model.samples, model.loss)), tuple(readings))
        )
    known = type("Known", (), {"curve": TRUTH[0], "critical": TRUTH[1]})
    got = fit_estimate(runs, known, SEQ, c, 16, lag)
    assert got.mapping_error == pytest.approx(m, rel=0.1)
    assert got.noise == pytest.approx(0.4, rel=0.15) and got.points == 450
