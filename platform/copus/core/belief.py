"""A belief about the critical factor c (B_crit = c × B_noise), updated from probes during a run.

The configured SE(B) = (c·N + B0)/(c·N + B) (N = B_noise, copus.core.efficiency) takes c as a
constant, 2.3 by default, the geometric mean over 8 calibration branch points whose log c spreads
with sd about 0.69 (docs/noise-scale.md). c is not constant: it grows with progress (about 1-2
early, 4-6 late). A probe measures it in the run: a branch from a checkpoint at s0 samples goes on
at a small GBS b_s while the run goes on at a large one b_l, and the samples each needs to reach a
matched loss give ρ = S_small/S_large with a 95% interval (copus.core.counterfactual). Under the
model ρ = SE(b_l)/SE(b_s) = (c·N + b_s)/(c·N + b_l) (`ratio_of_factor`): free of B0, increasing in
c from b_s/b_l (c → 0) to 1 (c → ∞).

Belief. Gaussian in log c (`FactorBelief`: mean, sd). Log because c is a positive scale factor
whose calibrations spread by factors (1.3-4.2 at 95%), and a multiplicative error is what moves
B_crit; the mean's exp is the posterior median of c, and the interval is exp(mean ± 1.96 sd).

Drift. Between probes log c is a random walk in log samples: its variance grows by
drift_sd² · ln(s/s_prev) (`FactorBelief.drifted`, a 1-D Kalman filter's predict step). Log samples
because c's growth is taken to be spread evenly over the run's progress: a doubling of the samples
seen late in a run is assumed to move it about as much as one early (1-2 early, 4-6 late over the
calibrations' few doublings). From 0 samples (the prior) nothing drifts: the
prior already describes c wherever the first probe lands.

Update. Bayes' rule on a grid of log c (`FactorBelief.observed_ratio`): the drifted Gaussian
prior times the likelihood log ρ̂ ~ Normal(log ratio_of_factor(c), σ), σ from the probe's interval
(its log width / (2·1.96)), summarised by the posterior's mean and sd (moment matching). A grid,
not a linearised (extended) Kalman update, because the ratio saturates at both ends: far from
c·N ≈ √(b_s·b_l) its slope in log c vanishes, so a linearisation there would read almost no
information, or, for a ρ̂ outside (b_s/b_l, 1) that no c explains, diverge. On the grid such a ρ̂
only says "c is small" or "c is large", as strongly as the prior and σ allow, and the belief stays
finite. The grid spans the drifted prior's mean ± 8 sd and the stretch where the likelihood is
within 8 σ of ρ̂, c in [1e-3, 1e4] at most: a probe in strong conflict with a narrow prior can give
a posterior with two modes and a trough between them, the far one heavier, which a grid around the
prior alone would miss. Its steps are a quarter of the narrower of the two; it is widened
where the posterior has not fallen off at an edge, and refined around the posterior until the posterior sd spans at least
RESOLVED_STEPS steps, so a precise probe is not rounded to one grid point. Unlike a linear Kalman
update, this one can widen the belief: where the ratio saturates the likelihood has a plateau, and
a probe in conflict with the prior there leaves the posterior spread over the flat stretch between
them (exact Bayes, not a numerical artefact; tests/core/test_belief.py has one 3.3 times wider).
Probes consistent with the prior narrow it.

Validation (tests/core/test_belief.py; N = 20, GBS 16 vs 64, σ = 0.1, true log c drawn from the
prior N(ln 2.3, 0.69); 5,000 replicates): one probe, the 95% interval covers the true c in 94.9%,
mean squared error in log c 0.093 against the prior's 0.467; three probes at 1,000, 2,000 and
4,000 samples while log c random-walks at drift_sd 0.5: coverage 94.4%, 94.9%, 94.8%. The update
matches brute-force Bayes on a 200,001-point grid (conflicting probes included) to 0.1% of an sd.

Stored. Each update appends a JSON-safe record to `observations`: its inputs (ρ̂, interval, N,
b_s, b_l, samples), the c it implies alone (`c_observed`, None where no finite positive c does),
the belief after it (`c`, `log_c_sd`) and the caller's note. `as_dict`/`from_dict` round-trip the
whole belief for the controller's state file and summary.json.

Pure math: numpy only, no torch, no ray.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from copus.core.efficiency import DEFAULT_CRITICAL_FACTOR

PRIOR_LOG_SD = 0.69  # sd of log c over the calibration branch points (docs/noise-scale.md: 0.66-0.71)
Z95 = 1.959964  # the standard normal's 97.5% quantile: a 95% interval is ± Z95 sd
MIN_SIGMA = 1e-3  # floor on a probe's sd in log ρ: a zero-width interval is not infinite precision
GRID_POINTS = 2001  # points of the log-c grid of an update, at least
MAX_GRID_POINTS = 400_001  # at most: a 1e-3-wide factor over the whole range, at 4 points a width
GRID_SDS = 8.0  # the grid spans the drifted prior's mean ± GRID_SDS sd
LOG_C_MIN, LOG_C_MAX = math.log(1e-3), math.log(1e4)  # c outside this range is not entertained
RESOLVED_STEPS = 20  # the grid is refined until the posterior sd spans at least this many steps
EDGE_LOG_WEIGHT = -25.0  # posterior log weight (relative to its peak) at an edge that widens the grid
MAX_PASSES = 16  # grids per update: bounds the widening and the refinement
RECORD_KEYS = ("rho", "low", "high", "b_noise", "b_small", "b_large", "samples", "c_observed", "c", "log_c_sd")


def _check_batches(b_noise: float, b_small: float, b_large: float) -> None:
    if not (math.isfinite(b_noise) and b_noise > 0):
        raise ValueError(f"b_noise must be positive and finite, got {b_noise!r}")
    if not (math.isfinite(b_small) and math.isfinite(b_large) and 0 < b_small < b_large):
        raise ValueError(f"need 0 < b_small < b_large (finite), got b_small={b_small!r}, b_large={b_large!r}")


def ratio_of_factor(c, b_noise: float, b_small: float, b_large: float):
    """ρ = SE(b_large)/SE(b_small) = (c·N + b_small)/(c·N + b_large): what a probe should measure
    at critical factor c (a number: a float; an array: an array). 1 at c = ∞ (all noise)."""
    _check_batches(b_noise, b_small, b_large)
    c = np.asarray(c, dtype=float)
    with np.errstate(invalid="ignore"):
        rho = np.where(np.isinf(c), 1.0, (c * b_noise + b_small) / (c * b_noise + b_large))
    return float(rho) if rho.ndim == 0 else rho


def factor_of_ratio(rho: float, b_noise: float, b_small: float, b_large: float) -> float:
    """The c that `ratio_of_factor` maps to ρ: (ρ·b_large − b_small)/((1 − ρ)·N). 0.0 for ρ at or
    below b_small/b_large and inf for ρ at or above 1, where no finite positive c explains ρ."""
    _check_batches(b_noise, b_small, b_large)
    if rho * b_large <= b_small:
        return 0.0
    if rho >= 1.0:
        return math.inf
    return (rho * b_large - b_small) / ((1.0 - rho) * b_noise)


def _moments(x: np.ndarray, log_weight: np.ndarray) -> tuple[float, float]:
    """Mean and sd of the distribution on the even grid `x` with unnormalised log weights, by the
    trapezoid rule (accurate to O(step²) also where the range's bound cuts the posterior off)."""
    w = np.exp(log_weight - log_weight.max())
    w[[0, -1]] *= 0.5
    w /= w.sum()
    mean = float(w @ x)
    return mean, float(math.sqrt(max(float(w @ (x - mean) ** 2), 0.0)))


def _likelihood_window(log_rho: float, sigma: float, batches: tuple[float, float, float]) -> tuple[float, float]:
    """The log-c interval where the likelihood is within GRID_SDS σ of ρ̂: log ρ is increasing in
    log c, so its ends are the c that map to ρ̂·exp(∓GRID_SDS·σ), the range's ends where no finite
    positive c does (a ρ̂ beyond saturation: the likelihood is flat all the way to that end)."""
    ends = []
    for shift in (-GRID_SDS * sigma, GRID_SDS * sigma):
        c = factor_of_ratio(math.exp(log_rho + shift), *batches)
        ends.append(
            LOG_C_MIN if c <= 0 else LOG_C_MAX if math.isinf(c) else min(max(math.log(c), LOG_C_MIN), LOG_C_MAX)
        )
    return ends[0], ends[1]


def _first_grid(mean: float, sd: float, log_rho: float, sigma: float, batches) -> tuple[float, float, int]:
    """Bounds and points of the first grid. The posterior's modes lie between the prior's mean and
    the likelihood's peak (outside, both factors fall), so the grid spans both the prior's ± GRID_SDS
    sd and the likelihood's window; two modes may sit far apart with a trough between them that no
    edge test sees. Steps of a quarter of min(sd, σ) resolve every mode: a mode is about as wide as
    the narrower factor or wider (d log ρ / d log c < 1, so the likelihood is no narrower in log c
    than σ), never so narrow that it falls between two points."""
    lik_lo, lik_hi = _likelihood_window(log_rho, sigma, batches)
    lo = min(max(min(mean - GRID_SDS * sd, lik_lo), LOG_C_MIN), LOG_C_MAX)
    hi = max(min(max(mean + GRID_SDS * sd, lik_hi), LOG_C_MAX), LOG_C_MIN)
    if hi - lo < 1e-9:  # the prior lies wholly outside the range: the whole range
        lo, hi = LOG_C_MIN, LOG_C_MAX
    points = int(min(max(GRID_POINTS, 4.0 * (hi - lo) / min(sd, sigma) + 1), MAX_GRID_POINTS))
    return lo, hi, points


def _posterior(mean: float, sd: float, log_rho: float, sigma: float, batches: tuple[float, float, float]):
    """Mean and sd of log c under the prior N(mean, sd) times the likelihood
    log ρ̂ ~ N(log ratio_of_factor(c), sigma), on a grid over both (`_first_grid`), widened while
    the posterior has not fallen off an edge (or reached the range's) and refined until it resolves
    the posterior."""
    lo, hi, points = _first_grid(mean, sd, log_rho, sigma, batches)
    for _ in range(MAX_PASSES):
        x = np.linspace(lo, hi, points)
        model = np.log(ratio_of_factor(np.exp(x), *batches))
        log_post = -0.5 * ((x - mean) / sd) ** 2 - 0.5 * ((log_rho - model) / sigma) ** 2
        log_post -= log_post.max()
        post_mean, post_sd = _moments(x, log_post)
        width, step = hi - lo, x[1] - x[0]
        if log_post[0] > EDGE_LOG_WEIGHT and lo > LOG_C_MIN:  # cut off below: widen down
            lo = max(lo - width, LOG_C_MIN)
        elif log_post[-1] > EDGE_LOG_WEIGHT and hi < LOG_C_MAX:  # cut off above: widen up
            hi = min(hi + width, LOG_C_MAX)
        elif post_sd < RESOLVED_STEPS * step:  # too narrow for the grid: zoom in on it
            half = GRID_SDS * max(post_sd, step)
            lo, hi, points = max(post_mean - half, lo), min(post_mean + half, hi), GRID_POINTS
        else:
            break
    return post_mean, max(post_sd, 1e-12)  # positive even for a prior far outside the range


@dataclass(frozen=True)
class FactorBelief:
    """Gaussian belief on log c (module docstring). `mean`, `sd`: of log c. `at_samples`: the
    samples seen at the last update (0 for the prior, from which nothing drifts). `observations`:
    one JSON-safe record per update, oldest first."""

    mean: float
    sd: float
    at_samples: float = 0.0
    observations: tuple[dict[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if not math.isfinite(self.mean):
            raise ValueError(f"FactorBelief: mean (log c) must be finite, got {self.mean!r}")
        if not (math.isfinite(self.sd) and self.sd > 0):
            raise ValueError(f"FactorBelief: sd must be positive and finite, got {self.sd!r}")
        if not (math.isfinite(self.at_samples) and self.at_samples >= 0):
            raise ValueError(f"FactorBelief: at_samples must be finite and >= 0, got {self.at_samples!r}")

    @classmethod
    def prior(cls, c: float = DEFAULT_CRITICAL_FACTOR, sd: float = PRIOR_LOG_SD) -> FactorBelief:
        """The belief before any probe: median c, sd `sd` in log c, at 0 samples."""
        if not (math.isfinite(c) and c > 0):
            raise ValueError(f"FactorBelief.prior: c must be positive and finite, got {c!r}")
        return cls(math.log(c), float(sd))

    @property
    def factor(self) -> float:
        """exp(mean): the posterior median of c, the value the controller applies."""
        return math.exp(self.mean)

    def interval(self, z: float = 1.96) -> tuple[float, float]:
        """(low, high) in c: exp(mean ± z·sd), 95% at the default z."""
        return math.exp(self.mean - z * self.sd), math.exp(self.mean + z * self.sd)

    def drifted(self, samples: float, drift_sd: float) -> FactorBelief:
        """The belief at `samples`: log c has random-walked since `at_samples` (Kalman predict,
        module docstring), var += drift_sd² · max(0, ln(samples/at_samples)); none from 0."""
        if not (math.isfinite(samples) and samples >= 0):
            raise ValueError(f"samples must be finite and >= 0, got {samples!r}")
        if not (math.isfinite(drift_sd) and drift_sd >= 0):
            raise ValueError(f"drift_sd must be finite and >= 0, got {drift_sd!r}")
        steps = math.log(samples) - math.log(self.at_samples) if self.at_samples > 0 and samples > 0 else 0.0
        var = self.sd**2 + drift_sd**2 * max(0.0, steps)
        return FactorBelief(self.mean, math.sqrt(var), float(samples), self.observations)

    def observed_ratio(
        self,
        rho: float,
        low: float,
        high: float,
        b_noise: float,
        b_small: float,
        b_large: float,
        samples: float,
        drift_sd: float,
        note: dict[str, Any] | None = None,
    ) -> FactorBelief:
        """The belief after a probe at `samples` measured ρ̂ = `rho` with 95% interval (`low`,
        `high`) between `b_small` and `b_large` at noise scale `b_noise`: drift to `samples`, then
        a grid update (module docstring). A ρ̂ outside (b_small/b_large, 1) is fine: it pulls c
        down or up as far as the prior and its interval allow. `note` joins the record."""
        for name, value in (("rho", rho), ("low", low), ("high", high)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be positive and finite, got {value!r}")
        if low > high:
            raise ValueError(f"interval: low {low!r} > high {high!r}")
        _check_batches(b_noise, b_small, b_large)
        clash = sorted(set(note or {}) & set(RECORD_KEYS))
        if clash:
            raise ValueError(f"note: keys {clash} would overwrite the record's own")
        prior = self.drifted(samples, drift_sd)
        sigma = max((math.log(high) - math.log(low)) / (2.0 * Z95), MIN_SIGMA)
        mean, sd = _posterior(prior.mean, prior.sd, math.log(rho), sigma, (b_noise, b_small, b_large))
        implied = factor_of_ratio(rho, b_noise, b_small, b_large)
        record = {
            **{k: float(v) for k, v in zip(RECORD_KEYS, (rho, low, high, b_noise, b_small, b_large, samples))},
            "c_observed": implied if 0 < implied < math.inf else None,
            "c": math.exp(mean),
            "log_c_sd": sd,
            **(note or {}),
        }
        return FactorBelief(mean, sd, prior.at_samples, (*self.observations, record))

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe state (floats, lists), with c and its 95% interval for readers."""
        low, high = self.interval()
        return {
            "mean": self.mean,
            "sd": self.sd,
            "at_samples": self.at_samples,
            "c": self.factor,
            "c_low": low,
            "c_high": high,
            "observations": [dict(o) for o in self.observations],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FactorBelief:
        """The belief `as_dict` wrote (its c, c_low, c_high are derived and ignored)."""
        observations = tuple(dict(o) for o in d.get("observations", ()))
        return cls(float(d["mean"]), float(d["sd"]), float(d.get("at_samples", 0.0)), observations)
