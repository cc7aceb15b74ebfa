"""Gradient noise scale (McCandlish et al. 2018) from two batch sizes, smoothed as in AdaptDL.

With true gradient G and per-sample covariance Σ, a gradient averaged over B samples has
E|g_B|² = |G|² + tr(Σ)/B. Two measured squared norms, at B_small < B_big, give unbiased
estimates of |G|² and tr(Σ); each is smoothed separately with a bias-corrected exponential
moving average, and B_noise = tr(Σ)/|G|² is the ratio of the smoothed values (never the mean
of per-step ratios, which is biased and unstable).

How far back the average reaches (its horizon) is a bias-variance trade-off. The noise scale
grows as training goes on (it follows the loss, McCandlish et al.), so an average lags the
present by its mean age; a shorter one is noisier (each step's two-batch estimate of |G|² is
itself very noisy, often negative). Two horizons:

- progress (default): a half-life in samples that is a share of the samples seen so far,
  never below a floor: h = max(share × samples_seen, floor). The mean age of the average is
  h / ln 2, so with B_noise ∝ samples^a the estimate trails the present by a factor of about
  (1 + share/ln 2)^a (≈ 7% low at share 0.05 and a = 1), whatever the run's length, and it
  averages ≈ 2.9·h/GBS steps (≥ 23 at the default floor of 8 reference batches).
- fixed: θ = smoothing ** (GBS / B0) per step, AdaptDL's form. 0.999 per reference batch is a
  horizon of ~1000 steps; on runs of a few thousand samples that is close to the average since
  step 0, which lags a growing noise scale several-fold (docs/calibration.md).

At fixed weights (no training in between: `copus gns`) nothing drifts and the fixed form with
smoothing near 1 is the plain average it should be.

A step's tr(Σ) estimate is heavy-tailed: an outlier batch (a loss spike, its gradient norm 8x the
run's) gives a tr(Σ) 50-100x the average's, and with a half-life of a few dozen steps one such
step lifted the estimate x4-x7 at once on the emulated cluster's runs, which then moved their
layout on it (docs/noise-scale.md, "Outlier steps"). With `outlier_ratio` k (`gns.outlier_ratio`,
off by default), a step whose tr(Σ)
exceeds k times the average's counts for k × average / its tr(Σ) of its samples (a Huber weight:
its influence is bounded, not removed), once the average has `MIN_UPDATES_FOR_OUTLIERS` steps.

Pure numpy/math: no torch, no ray.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from copus.core.efficiency import DEFAULT_CRITICAL_FACTOR, statistical_efficiency


def two_batch_estimates(sq_small: float, b_small: float, sq_big: float, b_big: float) -> tuple[float, float]:
    """Unbiased (|G|², tr(Σ)) from squared gradient norms at two batch sizes."""
    if not b_big > b_small > 0:
        raise ValueError(f"need 0 < b_small < b_big, got {b_small} and {b_big}")
    grad_sqr = (b_big * sq_big - b_small * sq_small) / (b_big - b_small)
    grad_var = (sq_small - sq_big) / (1.0 / b_small - 1.0 / b_big)
    return grad_sqr, grad_var


def b_noise_interval(
    norms: list[tuple[float, float, float, float]], seed: int = 0, resamples: int = 400
) -> tuple[float, float]:
    """95% interval of B_noise measured at fixed weights: a bootstrap over the steps' two-batch
    norms (sq_small, b_small, sq_big, b_big), each resample's estimate the ratio of the mean
    tr(Σ) to the mean |G|² (the steps are exchangeable: nothing drifts). NaN with < 2 steps."""
    pairs = np.array([two_batch_estimates(*n) for n in norms if all(map(math.isfinite, n))], dtype=float)
    if len(pairs) < 2:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(pairs), size=(resamples, len(pairs)))
    sqr, var = pairs[picks, 0].mean(axis=1), np.maximum(pairs[picks, 1].mean(axis=1), 0.0)
    ratio = np.sort(np.where(sqr > 0, var / np.where(sqr > 0, sqr, 1.0), np.inf))
    # Order statistics, not np.percentile: a resample whose |G|² is not positive is inf.
    return float(ratio[int(0.025 * (resamples - 1))]), float(ratio[math.ceil(0.975 * (resamples - 1))])


@dataclass
class GNSState:
    """Everything needed to continue the estimate after a restart (saved with checkpoints)."""

    ema_sqr: float = 0.0
    ema_var: float = 0.0
    weight: float = 0.0  # sum of EMA weights, for bias correction
    updates: int = 0
    skipped_nonfinite: int = 0
    downweighted: int = 0  # outlier steps folded in with less than their samples' weight


@dataclass(frozen=True)
class Horizon:
    """How far back the estimate reaches (module docstring): `share` of the samples seen as a
    half-life, at least `floor` samples; or, with share None, `smoothing` per reference batch."""

    share: float | None = 0.05
    floor: float = 128.0  # samples
    smoothing: float = 0.999

    def __post_init__(self):
        if not 0.0 < self.smoothing < 1.0:
            raise ValueError(f"gns.smoothing must be in (0, 1), got {self.smoothing}")
        if self.share is not None and not 0.0 < self.share <= 1.0:
            raise ValueError(f"gns.half_life_share must be in (0, 1], got {self.share}")
        if not self.floor > 0:
            raise ValueError(f"gns.min_half_life must be positive, got {self.floor}")

    def theta(self, batch: float, reference_gbs: float, samples_seen: float | None) -> float:
        """The weight the old average keeps when a step of `batch` samples is folded in: the
        average forgets per sample, not per step, so a larger batch (which carries more
        information) moves it further (AdaptDL). Without the samples seen (fixed weights), the
        fixed form."""
        if self.share is None or samples_seen is None or not math.isfinite(samples_seen):
            return self.smoothing ** (batch / reference_gbs)
        half_life = max(self.share * samples_seen, self.floor)
        return 0.5 ** (batch / half_life)


# Steps the average needs before a step can be judged an outlier against it.
MIN_UPDATES_FOR_OUTLIERS = 10


class GNSEstimator:
    """Smoothed |G|², tr(Σ), B_noise, critical batch size and statistical efficiency.
    `outlier_ratio`: a step's tr(Σ) above this multiple of the average's is down-weighted
    (module docstring); None: every step at full weight."""

    def __init__(
        self,
        reference_gbs: int,
        smoothing: float = 0.999,
        critical_factor: float = DEFAULT_CRITICAL_FACTOR,
        state: GNSState | None = None,
        horizon: Horizon | None = None,
        outlier_ratio: float | None = None,
    ):
        if outlier_ratio is not None and not outlier_ratio > 1.0:
            raise ValueError(f"gns.outlier_ratio must be above 1, got {outlier_ratio}")
        self.horizon = horizon if horizon is not None else Horizon(share=None, smoothing=smoothing)
        self.reference_gbs = reference_gbs
        self.smoothing = self.horizon.smoothing
        self.critical_factor = critical_factor
        self.outlier_ratio = outlier_ratio
        self.state = state or GNSState()

    def _weight_of(self, grad_var: float) -> float:
        """The share of its samples a step counts for: 1, or the Huber weight of an outlier."""
        if self.outlier_ratio is None or self.state.updates < MIN_UPDATES_FOR_OUTLIERS:
            return 1.0
        limit = self.outlier_ratio * self.grad_var
        if limit <= 0 or grad_var <= limit:
            return 1.0
        self.state.downweighted += 1
        return limit / grad_var

    def update(
        self, sq_small: float, b_small: float, sq_big: float, b_big: float, samples_seen: float | None = None
    ) -> bool:
        """Fold in one measurement (`samples_seen`: the run's samples after this step; the
        progress horizon needs it). Non-finite inputs are ignored and counted. Returns whether
        the measurement was used."""
        values = (sq_small, b_small, sq_big, b_big)
        if not all(math.isfinite(v) for v in values):
            self.state.skipped_nonfinite += 1
            return False
        grad_sqr, grad_var = two_batch_estimates(*values)
        # theta = 0.5 ** (samples / half-life): a step counting for a share of its samples keeps
        # theta ** share of the old average
        theta = self.horizon.theta(b_big, self.reference_gbs, samples_seen) ** self._weight_of(grad_var)
        s = self.state
        s.ema_sqr = theta * s.ema_sqr + (1 - theta) * grad_sqr
        s.ema_var = theta * s.ema_var + (1 - theta) * grad_var
        s.weight = theta * s.weight + (1 - theta)
        s.updates += 1
        return True

    @property
    def ready(self) -> bool:
        return self.state.weight > 0

    @property
    def grad_sqr(self) -> float:
        """Bias-corrected smoothed |G|² (may be <= 0 early on: the estimate is noisy)."""
        return self.state.ema_sqr / self.state.weight if self.ready else float("nan")

    @property
    def grad_var(self) -> float:
        return self.state.ema_var / self.state.weight if self.ready else float("nan")

    @property
    def b_noise(self) -> float:
        """tr(Σ)/|G|² of the smoothed values; inf while |G|² is not yet positive."""
        if not self.ready:
            return float("nan")
        sqr, var = self.grad_sqr, max(self.grad_var, 0.0)
        return var / sqr if sqr > 0 else float("inf")

    @property
    def critical_batch_size(self) -> float:
        return self.critical_factor * self.b_noise

    def efficiency(self, gbs: float) -> float:
        """Pollux statistical efficiency of training at `gbs`, relative to the reference GBS."""
        return statistical_efficiency(self.b_noise, self.reference_gbs, gbs)

    def summary(self, gbs: float) -> dict[str, float]:
        return {
            "gns_sqr": self.grad_sqr,
            "gns_var": self.grad_var,
            "b_noise": self.b_noise,
            "critical_batch_size": self.critical_batch_size,
            "statistical_efficiency": self.efficiency(gbs),
            "gns_downweighted": float(self.state.downweighted),  # outlier steps so far
        }

    def state_dict(self) -> dict:
        return asdict(self.state)

    def load_state_dict(self, state: dict) -> None:
        self.state = GNSState(**state)
