"""The belief about the critical factor c (copus.core.belief): the ratio a probe measures and its
inverse, the prior and its drift, the grid update (against exact Bayes on a fine grid, at its
limits, and its calibration over Monte Carlo replicates drawn from the prior), and its state."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from copus.core.belief import (
    LOG_C_MAX,
    LOG_C_MIN,
    PRIOR_LOG_SD,
    Z95,
    FactorBelief,
    factor_of_ratio,
    ratio_of_factor,
)
from copus.core.efficiency import DEFAULT_CRITICAL_FACTOR

N, B_SMALL, B_LARGE = 20.0, 16.0, 64.0  # the probe of the calibration checks: c·N ≈ √(16·64) at c ≈ 1.6


def probe(belief: FactorBelief, log_rho: float, sigma: float, samples: float = 1000.0, drift_sd: float = 0.5, **kw):
    """The belief after a probe that measured log ρ̂ = `log_rho` with a symmetric 95% interval of sd `sigma`."""
    rho, low, high = math.exp(log_rho), math.exp(log_rho - Z95 * sigma), math.exp(log_rho + Z95 * sigma)
    batches = (kw.pop("b_noise", N), kw.pop("b_small", B_SMALL), kw.pop("b_large", B_LARGE))
    return belief.observed_ratio(rho, low, high, *batches, samples, drift_sd, **kw)


def exact_posterior(mean: float, sd: float, log_rho: float, sigma: float, batches, points: int = 200_001):
    """Mean and sd of log c by brute force: prior × likelihood on one fine grid of the whole range."""
    x = np.linspace(LOG_C_MIN, LOG_C_MAX, points)
    log_post = (
        -0.5 * ((x - mean) / sd) ** 2 - 0.5 * ((log_rho - np.log(ratio_of_factor(np.exp(x), *batches))) / sigma) ** 2
    )
    w = np.exp(log_post - log_post.max())
    w /= w.sum()
    m = float(w @ x)
    return m, math.sqrt(float(w @ (x - m) ** 2))


# ---- the ratio and its inverse -------------------------------------------------------------------


@pytest.mark.parametrize("b_small,b_large", [(8, 16), (16, 64), (32, 1024)])
@pytest.mark.parametrize("b_noise", [1.0, 20.0, 500.0])
def test_factor_of_ratio_inverts_ratio_of_factor_on_a_grid(b_noise, b_small, b_large):
    for c in np.geomspace(0.01, 100.0, 9):
        rho = ratio_of_factor(c, b_noise, b_small, b_large)
        assert b_small / b_large < rho < 1.0
        assert factor_of_ratio(rho, b_noise, b_small, b_large) == pytest.approx(c, rel=1e-6)


@settings(max_examples=200, deadline=None)
@given(
    c=st.floats(1e-2, 1e3),
    b_noise=st.floats(0.5, 1e4),
    b_small=st.floats(1.0, 1e3),
    times=st.floats(1.1, 100.0),
)
def test_inverse_property(c, b_noise, b_small, times):
    b_large = b_small * times
    rho = ratio_of_factor(c, b_noise, b_small, b_large)
    assert factor_of_ratio(rho, b_noise, b_small, b_large) == pytest.approx(c, rel=1e-5)


def test_ratio_of_factor_takes_arrays_and_its_limits():
    c = np.array([0.0, 0.5, 2.3, math.inf])
    rho = ratio_of_factor(c, N, B_SMALL, B_LARGE)
    assert isinstance(rho, np.ndarray) and rho.shape == (4,)
    assert rho[0] == B_SMALL / B_LARGE and rho[-1] == 1.0
    assert rho[1] == pytest.approx(ratio_of_factor(0.5, N, B_SMALL, B_LARGE))
    assert np.all(np.diff(rho) > 0)  # increasing in c
    assert isinstance(ratio_of_factor(2.3, N, B_SMALL, B_LARGE), float)


def test_factor_of_ratio_outside_the_invertible_range():
    floor = B_SMALL / B_LARGE
    assert factor_of_ratio(floor, N, B_SMALL, B_LARGE) == 0.0
    assert factor_of_ratio(0.5 * floor, N, B_SMALL, B_LARGE) == 0.0
    assert factor_of_ratio(1.0, N, B_SMALL, B_LARGE) == math.inf
    assert factor_of_ratio(1.7, N, B_SMALL, B_LARGE) == math.inf


# ---- prior and drift -----------------------------------------------------------------------------


def test_prior_factor_and_interval():
    prior = FactorBelief.prior(2.3, 0.69)
    assert prior.factor == pytest.approx(2.3)
    low, high = prior.interval()
    assert (low, high) == pytest.approx((2.3 * math.exp(-1.96 * 0.69), 2.3 * math.exp(1.96 * 0.69)))
    assert low == pytest.approx(0.595, abs=1e-3) and high == pytest.approx(8.89, abs=1e-2)
    assert prior.interval(z=1.0) == pytest.approx((2.3 * math.exp(-0.69), 2.3 * math.exp(0.69)))
    assert prior.at_samples == 0.0 and prior.observations == ()
    assert FactorBelief.prior() == FactorBelief.prior(DEFAULT_CRITICAL_FACTOR, PRIOR_LOG_SD)


def test_drift_none_from_zero_then_drift_sd_squared_ln2_per_doubling():
    prior = FactorBelief.prior(2.3, 0.69)
    first = prior.drifted(1000.0, 0.5)
    assert first.sd == prior.sd and first.mean == prior.mean and first.at_samples == 1000.0
    doubled = first.drifted(2000.0, 0.5)
    assert doubled.sd**2 == pytest.approx(0.69**2 + 0.25 * math.log(2.0))
    assert doubled.mean == prior.mean and doubled.at_samples == 2000.0
    back = doubled.drifted(1500.0, 0.5)  # fewer samples (a restart from an earlier checkpoint)
    assert back.sd == doubled.sd and back.at_samples == 1500.0
    assert doubled.drifted(4000.0, 0.0).sd == doubled.sd


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0.0, 1e9), min_size=1, max_size=8), st.floats(0.0, 2.0))
def test_drift_never_shrinks(steps, drift_sd):
    belief = FactorBelief.prior()
    for samples in steps:
        after = belief.drifted(samples, drift_sd)
        assert after.sd >= belief.sd and math.isfinite(after.sd)
        belief = after


# ---- the update ----------------------------------------------------------------------------------


def test_an_uninformative_probe_leaves_the_belief_almost_unchanged():
    prior = FactorBelief.prior()
    after = probe(prior, math.log(0.3), sigma=20.0)
    assert abs(after.mean - prior.mean) < 0.01
    assert after.sd == pytest.approx(prior.sd, rel=1e-3) and after.sd <= prior.sd


@pytest.mark.parametrize("c", [0.5, 2.3, 5.0, 20.0])
def test_a_precise_probe_pulls_c_to_the_observed_value(c):
    prior = FactorBelief.prior()
    after = probe(prior, math.log(ratio_of_factor(c, N, B_SMALL, B_LARGE)), sigma=1e-3)
    assert after.factor == pytest.approx(c, rel=0.01)
    assert after.sd < 0.05 * prior.sd
    record = after.observations[-1]
    assert record["c_observed"] == pytest.approx(c, rel=1e-6)
    assert record["c"] == after.factor and record["log_c_sd"] == after.sd


def test_a_zero_width_interval_is_floored_not_infinitely_precise():
    rho = ratio_of_factor(3.0, N, B_SMALL, B_LARGE)
    after = FactorBelief.prior().observed_ratio(rho, rho, rho, N, B_SMALL, B_LARGE, 1000.0, 0.5)
    assert 0 < after.sd < 0.05 and after.factor == pytest.approx(3.0, rel=0.01)


@pytest.mark.parametrize("rho,direction", [(1.0, +1), (1.3, +1), (B_SMALL / B_LARGE, -1), (0.1, -1)])
def test_a_ratio_outside_the_invertible_range_moves_c_the_right_way(rho, direction):
    prior = FactorBelief.prior()
    after = probe(prior, math.log(rho), sigma=0.1)
    assert math.isfinite(after.mean) and math.isfinite(after.sd) and after.sd > 0
    assert direction * (after.mean - prior.mean) > 0.3
    assert after.sd <= prior.sd
    assert after.observations[-1]["c_observed"] is None
    json.dumps(after.as_dict())  # still JSON-safe


@settings(max_examples=40, deadline=None)
@given(
    mean=st.floats(-2.0, 3.0),
    sd=st.floats(0.1, 1.5),
    log_rho=st.floats(-4.0, 0.5),
    sigma=st.floats(0.01, 2.0),
    b_noise=st.floats(1.0, 2000.0),
    b_small=st.sampled_from([8.0, 16.0, 64.0]),
    times=st.sampled_from([2.0, 4.0, 16.0]),
)
# A narrow prior and a precise probe below the ratio's floor: two modes with a trough between them,
# the far one heavier (exact mean -5.10); a grid around the prior alone found the near one (1.61).
@example(mean=2.0, sd=0.109375, log_rho=-2.0, sigma=0.015625, b_noise=397.0, b_small=8.0, times=2.0)
def test_the_update_is_bayes_rule(mean, sd, log_rho, sigma, b_noise, b_small, times):
    """Against brute force on a 200,001-point grid over the whole range, conflicting probes included:
    the update's grid (widened, refined) loses nothing."""
    batches = (b_noise, b_small, b_small * times)
    after = probe(
        FactorBelief(mean, sd), log_rho, sigma, samples=0.0, b_noise=b_noise, b_small=b_small, b_large=b_small * times
    )
    m, s = exact_posterior(mean, sd, log_rho, sigma, batches)
    assert after.mean == pytest.approx(m, abs=1e-3 * sd)
    assert after.sd == pytest.approx(s, rel=1e-3, abs=1e-4 * sd)


def test_a_conflicting_probe_where_the_ratio_saturates_can_widen_the_belief():
    """Not a linear Kalman filter: at N = 2000 the prior puts ρ at 0.998 (c·N ≫ 32) and ρ̂ = 0.445
    (sd 0.1 in log) says c ≈ 0.006, 8.7 prior sd lower. Between the two the ratio is flat in log c
    at both ends, and the posterior spreads over that stretch: 3.3 times wider than the prior, as
    exact Bayes has it."""
    prior = FactorBelief.prior()
    batches = (2000.0, 8.0, 32.0)
    after = probe(prior, math.log(0.445), 0.1, samples=0.0, b_noise=2000.0, b_small=8.0, b_large=32.0)
    m, s = exact_posterior(prior.mean, prior.sd, math.log(0.445), 0.1, batches)
    assert after.sd > 3.0 * prior.sd and after.sd == pytest.approx(s, rel=1e-3)
    assert after.mean < prior.mean - 2.0 and after.mean == pytest.approx(m, abs=1e-3)


def test_calibration_one_probe_from_the_prior():
    """True log c drawn from the prior N(ln 2.3, 0.69), ρ̂ with sd 0.1 in log: the posterior 95%
    interval covers the truth in 90-99% of replicates and beats the prior's squared error."""
    rng = np.random.default_rng(2024)
    prior, sigma, reps = FactorBelief.prior(2.3, 0.69), 0.1, 300
    covered, se_post, se_prior = 0, 0.0, 0.0
    for _ in range(reps):
        truth = rng.normal(math.log(2.3), 0.69)
        log_rho = math.log(ratio_of_factor(math.exp(truth), N, B_SMALL, B_LARGE)) + rng.normal(0.0, sigma)
        after = probe(prior, log_rho, sigma)
        assert after.sd <= prior.sd  # probes drawn from the prior never widen it
        low, high = after.interval()
        covered += low <= math.exp(truth) <= high
        se_post += (after.mean - truth) ** 2
        se_prior += (prior.mean - truth) ** 2
    assert 0.90 <= covered / reps <= 0.99
    assert se_post / reps < 0.5 * se_prior / reps


def test_calibration_three_probes_while_c_drifts():
    """Probes at 1,000, 2,000 and 4,000 samples; between them the true log c random-walks with
    sd 0.5·√ln(s/s_prev), the drift the filter assumes: coverage at 88% or more after each probe."""
    rng = np.random.default_rng(7)
    sigma, reps, at = 0.1, 300, (1000.0, 2000.0, 4000.0)
    covered = np.zeros(len(at))
    for _ in range(reps):
        belief, truth = FactorBelief.prior(2.3, 0.69), rng.normal(math.log(2.3), 0.69)
        for k, samples in enumerate(at):
            if k:
                truth += rng.normal(0.0, 0.5 * math.sqrt(math.log(samples / at[k - 1])))
            log_rho = math.log(ratio_of_factor(math.exp(truth), N, B_SMALL, B_LARGE)) + rng.normal(0.0, sigma)
            belief = probe(belief, log_rho, sigma, samples=samples, drift_sd=0.5)
            low, high = belief.interval()
            covered[k] += low <= math.exp(truth) <= high
        assert len(belief.observations) == 3 and belief.at_samples == 4000.0
    assert np.all(covered / reps >= 0.88), covered / reps


# ---- state and inputs ----------------------------------------------------------------------------


def test_as_dict_round_trips_through_json():
    belief = probe(FactorBelief.prior(), math.log(0.5), 0.1, samples=1000.0, note={"probe": 1, "at_gbs": [16, 64]})
    belief = probe(belief, math.log(1.2), 0.2, samples=3000.0)
    d = belief.as_dict()
    assert d["c"] == belief.factor and (d["c_low"], d["c_high"]) == belief.interval()
    first = d["observations"][0]
    assert first["probe"] == 1 and first["at_gbs"] == [16, 64] and first["samples"] == 1000.0
    assert set(first) >= {"rho", "low", "high", "b_noise", "b_small", "b_large", "c_observed", "c", "log_c_sd"}
    again = FactorBelief.from_dict(json.loads(json.dumps(d)))
    assert again == belief
    assert FactorBelief.from_dict(FactorBelief.prior().as_dict()) == FactorBelief.prior()


@pytest.mark.parametrize(
    "change,message",
    [
        ({"rho": 0.0}, "rho must be positive"),
        ({"rho": math.nan}, "rho must be positive"),
        ({"low": -0.1}, "low must be positive"),
        ({"high": math.inf}, "high must be positive"),
        ({"low": 0.6, "high": 0.4}, "low .* > high"),
        ({"b_noise": 0.0}, "b_noise must be positive"),
        ({"b_noise": math.inf}, "b_noise must be positive"),
        ({"b_small": 64.0}, "b_small < b_large"),
        ({"b_small": 0.0}, "b_small < b_large"),
        ({"samples": -1.0}, "samples must be finite"),
        ({"drift_sd": math.nan}, "drift_sd must be finite"),
        ({"note": {"rho": 2}}, "would overwrite"),
    ],
)
def test_bad_inputs_raise(change, message):
    args = {"rho": 0.5, "low": 0.4, "high": 0.6, "b_noise": N, "b_small": B_SMALL, "b_large": B_LARGE}
    args |= {"samples": 1000.0, "drift_sd": 0.5}
    with pytest.raises(ValueError, match=message):
        FactorBelief.prior().observed_ratio(**(args | change))


def test_bad_beliefs_raise():
    with pytest.raises(ValueError, match="sd must be positive"):
        FactorBelief(0.0, 0.0)
    with pytest.raises(ValueError, match="mean .* must be finite"):
        FactorBelief(math.inf, 1.0)
    with pytest.raises(ValueError, match="c must be positive"):
        FactorBelief.prior(-1.0)
    with pytest.raises(ValueError, match="b_small < b_large"):
        factor_of_ratio(0.5, N, 64.0, 16.0)
