"""The simulator's models of what a real run has that an oracle lacks: the planner's noise estimate
lags the truth by the live EMA's mean age and errs with an autocorrelated noise; the first steps
after a GBS change make less progress; an untrained model's loss is ln(vocab), not the loss
fit's divergence at zero data."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

from copus.core.simulator import (
    CriticalBatch,
    LiveEstimate,
    LossCurve,
    LrTransient,
    NoiseEstimate,
    TrainingModel,
)

EXACT_NOW = NoiseEstimate(noise=0.0, half_life_share=0.0, min_half_life=0.0)  # the oracle


@dataclass
class LinearTruth:
    """A truth whose critical batch grows as the samples seen: B_crit = samples / 100."""

    samples: float

    def b_crit_at(self, samples: float) -> float:
        return max(samples, 0.0) / 100


def test_the_lag_is_the_emas_mean_age_and_grows_with_the_samples_seen():
    est = NoiseEstimate()
    floor = 8 * 64 / math.log(2)  # 8 reference batches of 64: the half-life's floor
    assert est.lag(0, 64) == pytest.approx(floor) and est.lag(5000, 64) == pytest.approx(floor)
    lags = [est.lag(s, 64) for s in (1e4, 1e5, 1e6, 1e7)]
    assert lags == sorted(lags) and lags[-1] == pytest.approx(0.05 * 1e7 / math.log(2))
    assert EXACT_NOW.lag(1e7, 64) == 0.0


def test_the_estimate_trails_a_growing_truth_by_the_expected_factor():
    # B_crit proportional to the samples: the estimate reads it h/ln 2 = 7.2% of the run ago.
    live = LiveEstimate(NoiseEstimate(noise=0.0), critical_factor=2.0, reference_gbs=64)
    for samples in (1e6, 1e7):
        seen = 2.0 * live.read(LinearTruth(samples)) / (samples / 100)
        assert seen == pytest.approx(1 - 0.05 / math.log(2))
    # Early, the floor of 8 reference batches dominates: the lag is a larger share of the run.
    assert 2.0 * live.read(LinearTruth(1e4)) / 100 == pytest.approx(1 - 8 * 64 / math.log(2) / 1e4)
    # Mapping error and critical factor as before: b = m x B_crit(lagged) / c.
    m4 = LiveEstimate(NoiseEstimate(noise=0.0, mapping_error=4.0), critical_factor=5.0, reference_gbs=64)
    assert 5.0 * m4.read(LinearTruth(1e7)) == pytest.approx(4.0 * 1e5 * (1 - 0.05 / math.log(2)))


def test_the_estimate_trails_the_simulated_truth():
    model = TrainingModel(7e9, 4096, LossCurve(initial=math.log(32000)), CriticalBatch(), keep_history=True)
    for _ in range(3000):
        model.step(64)
    live = LiveEstimate(NoiseEstimate(noise=0.0), critical_factor=2.0, reference_gbs=64)
    lag = NoiseEstimate().lag(model.samples, 64)
    assert 2.0 * live.read(model) == pytest.approx(model.b_crit_at(model.samples - lag))
    assert 0.5 < 2.0 * live.read(model) / model.b_crit < 1.0  # behind a critical batch that grows
    assert model.b_crit_at(-1.0) == model.b_crit_of(0.0) and model.b_crit_at(1e12) == model.b_crit


def _log_errors(estimate: NoiseEstimate, growth: float, reads: int = 500) -> np.ndarray:
    """log(ε) of successive reads, the samples seen growing by `growth` between two: the
    half-life is 5% of them, so reads are (growth - 1) / 0.05 half-lives apart."""
    live, truth = LiveEstimate(estimate, 1.0, 64), LinearTruth(1e7)
    out = []
    for _ in range(reads):
        truth.samples *= growth
        lagged = truth.b_crit_at(truth.samples - estimate.lag(truth.samples, 64))
        out.append(math.log(live.read(truth) / lagged))
    return np.array(out)


def test_the_estimation_noise_persists_over_decisions_as_the_emas_error():
    est = NoiseEstimate(noise=0.35, seed=1)
    close = _log_errors(est, growth=1.002)  # 0.04 half-lives apart: rho = 0.5^0.04 = 0.97
    far = _log_errors(est, growth=1.5)  # ten half-lives apart: independent
    corr = lambda x: float(np.corrcoef(x[:-1], x[1:])[0, 1])  # noqa: E731
    assert corr(close) > 0.9 and abs(corr(far)) < 0.15
    assert np.std(far) == pytest.approx(0.35, rel=0.15)  # the stationary sd is the setting's sigma


def test_a_noisy_estimate_is_deterministic_for_its_seed():
    a, b = (_log_errors(NoiseEstimate(seed=3), 1.05, 50) for _ in range(2))
    assert np.array_equal(a, b) and not np.array_equal(a, _log_errors(NoiseEstimate(seed=4), 1.05, 50))
    assert np.all(_log_errors(EXACT_NOW, 1.05, 5) == 0.0)


def _progress_per_step(gbs_by_step: list[int], transient: LrTransient) -> list[float]:
    # A flat critical batch: every step at one GBS is worth the same, but for the transient.
    model = TrainingModel(7e9, 4096, critical=CriticalBatch(flat_tokens=256 * 4096), transient=transient)
    out = []
    for gbs in gbs_by_step:
        before = model.tokens
        model.step(gbs)
        out.append((model.tokens - before) / (gbs * 4096 * 256 / (256 + gbs)))
    return out


def test_a_gbs_change_costs_progress_right_after_it_not_later():
    t = LrTransient(steps=20, efficiency=0.5)
    share = _progress_per_step([64] * 30 + [128] * 30, t)
    assert share[:30] == pytest.approx([1.0] * 30)  # the start is no change
    assert share[30] == pytest.approx(0.5) and share[40] == pytest.approx(0.75)  # rising linearly
    assert share[50:] == pytest.approx([1.0] * 10)  # 20 steps on, the step is whole again
    # A smaller change costs less (depth log2 of the ratio), a halving as much as a doubling.
    assert _progress_per_step([64, 96], t)[1] == pytest.approx(1 - 0.5 * math.log2(1.5))
    assert _progress_per_step([128, 64], t)[1] == pytest.approx(0.5)
    assert _progress_per_step([64, 128], LrTransient(steps=0))[1] == pytest.approx(1.0)  # switched off


def test_the_loss_starts_at_an_untrained_models_not_at_the_fits_divergence():
    fit = LossCurve()
    assert fit.loss(7e9, 0.0) > 400  # Chinchilla's form at one token
    capped = LossCurve(initial=math.log(32000))
    assert capped.loss(7e9, 0.0) == pytest.approx(10.37, abs=0.01)
    assert capped.loss(7e9, 1e10) == fit.loss(7e9, 1e10)  # later the fit holds
    # There the published fit's critical batch is about a sequence, not 1e-8 of one.
    model = TrainingModel(7e9, 4096, capped)
    assert 0.3 < model.b_crit < 3 and model.loss == capped.loss(7e9, 0.0)
