"""How long the run has left: the time a switch has to repay its cost in.

With a target loss and a validation curve, the rest of the run is read off the curve: a power law
in the samples seen, log L = a + b · log S, is fitted by least squares to the latest evaluations
(`FIT_POINTS` of them, where the curve is locally straight in log-log), and the samples at which it
reaches the target, S* = exp((log target − a) / b), are taken at a low quantile of their
prediction interval (the fit's residual error carried through the slope by the delta method): a
switch is weighed against the shorter end of what the run may have left, as the gain is weighed
at its pessimistic end (`copus.core.planner`). The samples left, at the run's current speed, are
the seconds left.

A power law without a floor falls faster than a real curve near its asymptote, so it
underestimates the samples to a target close to the floor: the horizon errs short, which
refuses a costly switch rather than making one that does not repay.

Without a target, with fewer than `MIN_POINTS` evaluations, or when the fitted curve does not fall
(no progress to extrapolate), today's rule stands: the rest of the run is taken to be as long as
the run so far, and at least one decision interval (`elapsed_horizon`).

Pure: numpy only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MIN_POINTS = 3  # evaluations a fit needs (two leave no residual to measure its error by)
FIT_POINTS = 8  # the latest evaluations the curve is fitted to


@dataclass(frozen=True)
class Horizon:
    """The seconds a switch has to repay its cost in, and where they come from: "target" (the
    fitted curve's samples to the target at the run's speed) or "elapsed" (as long as the run so
    far). `samples_left` and `samples_left_median` (the fit's central estimate) for "target"."""

    seconds: float
    source: str
    samples_left: float | None = None
    samples_left_median: float | None = None

    def as_dict(self) -> dict:
        return {
            "horizon_s": self.seconds,
            "horizon_source": self.source,
            "samples_left": self.samples_left,
            "samples_left_median": self.samples_left_median,
        }


def elapsed_horizon(elapsed_s: float, interval_s: float) -> Horizon:
    """The rest of the run taken as long as the run so far, at least one decision interval (what
    a run of unknown length has left, on average, once it has lasted that long)."""
    seconds = max(interval_s, elapsed_s) if math.isfinite(elapsed_s) else interval_s
    return Horizon(seconds, "elapsed")


def samples_to_target(samples: list[float], losses: list[float], target: float, z: float) -> tuple[float, float] | None:
    """The samples at which the power law fitted to the latest points reaches `target`: (a low
    quantile at `z` sd, the central estimate); None when no fit can say (too few points with
    positive samples and loss, a flat or rising curve)."""
    pts = [(s, v) for s, v in zip(samples, losses) if s > 0 and v > 0 and math.isfinite(s) and math.isfinite(v)]
    pts = pts[-FIT_POINTS:]
    if len(pts) < MIN_POINTS or not target > 0:
        return None
    x = np.log([p[0] for p in pts])
    y = np.log([p[1] for p in pts])
    sxx = float(((x - x.mean()) ** 2).sum())
    if sxx <= 0:
        return None
    slope = float(((x - x.mean()) * (y - y.mean())).sum() / sxx)
    if not slope < 0:
        return None
    intercept = float(y.mean() - slope * x.mean())
    x_star = (math.log(target) - intercept) / slope
    residual_sd = math.sqrt(float(((y - intercept - slope * x) ** 2).sum()) / (len(pts) - 2)) if len(pts) > 2 else 0.0
    # The fitted log loss at x_star is uncertain by residual_sd · √(1/n + (x* − x̄)²/Sxx); the curve
    # crosses the target earlier or later by that over the slope's magnitude.
    sd_x = residual_sd * math.sqrt(1.0 / len(pts) + (x_star - x.mean()) ** 2 / sxx) / abs(slope)
    return math.exp(min(x_star - z * sd_x, 700.0)), math.exp(min(x_star, 700.0))


def rest_of_run(
    samples: list[float],
    losses: list[float],
    target: float | None,
    samples_now: float,
    samples_per_s: float,
    elapsed_s: float,
    interval_s: float,
    z: float,
) -> Horizon:
    """The horizon of a decision now: from the validation curve (`samples`, `losses`) and the
    `target` at the run's current speed where the fit can say, else `elapsed_horizon`."""
    fit = samples_to_target(samples, losses, target, z) if target is not None else None
    if fit is None or not (math.isfinite(samples_per_s) and samples_per_s > 0):
        return elapsed_horizon(elapsed_s, interval_s)
    low, central = fit
    left = max(low - samples_now, 0.0)
    return Horizon(left / samples_per_s, "target", left, max(central - samples_now, 0.0))
