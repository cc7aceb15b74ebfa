"""Gradient noise scale (McCandlish et al. 2018) from two batch sizes, smoothed as in AdaptDL.

With true gradient G and per-sample covariance Σ, a gradient averaged over B samples has
E|g_B|² = |G|² + tr(Σ)/B. Two measured squared norms, at B_small < B_big, give unbiased
estimates of |G|² and tr(Σ); each is smoothed separately with a bias-corrected exponential
moving average, and B_noise = tr(Σ)/|G|² is the ratio of the smoothed values (never the mean
of per-step ratios, which is biased and unstable).

Pure numpy/math: no torch, no ray.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from copus.core.efficiency import statistical_efficiency


def two_batch_estimates(sq_small: float, b_small: float, sq_big: float, b_big: float) -> tuple[float, float]:
    """Unbiased (|G|², tr(Σ)) from squared gradient norms at two batch sizes."""
    if not b_big > b_small > 0:
        raise ValueError(f"need 0 < b_small < b_big, got {b_small} and {b_big}")
    grad_sqr = (b_big * sq_big - b_small * sq_small) / (b_big - b_small)
    grad_var = (sq_small - sq_big) / (1.0 / b_small - 1.0 / b_big)
    return grad_sqr, grad_var


@dataclass
class GNSState:
    """Everything needed to continue the estimate after a restart (saved with checkpoints)."""

    ema_sqr: float = 0.0
    ema_var: float = 0.0
    weight: float = 0.0  # sum of EMA weights, for bias correction
    updates: int = 0
    skipped_nonfinite: int = 0


class GNSEstimator:
    """Smoothed |G|², tr(Σ), B_noise, critical batch size and statistical efficiency.

    theta = base ** (gbs / reference_gbs): the EMA forgets per sample, not per step, so a
    larger batch (which carries more information) moves the average further (AdaptDL).
    """

    def __init__(
        self, reference_gbs: int, smoothing: float = 0.999, critical_factor: float = 2.0, state: GNSState | None = None
    ):
        if not 0.0 < smoothing < 1.0:
            raise ValueError(f"gns.smoothing must be in (0, 1), got {smoothing}")
        self.reference_gbs = reference_gbs
        self.smoothing = smoothing
        self.critical_factor = critical_factor
        self.state = state or GNSState()

    def update(self, sq_small: float, b_small: float, sq_big: float, b_big: float) -> bool:
        """Fold in one measurement. Non-finite inputs are ignored and counted. Returns whether
        the measurement was used."""
        values = (sq_small, b_small, sq_big, b_big)
        if not all(math.isfinite(v) for v in values):
            self.state.skipped_nonfinite += 1
            return False
        grad_sqr, grad_var = two_batch_estimates(*values)
        theta = self.smoothing ** (b_big / self.reference_gbs)
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
        }

    def state_dict(self) -> dict:
        return asdict(self.state)

    def load_state_dict(self, state: dict) -> None:
        self.state = GNSState(**state)
