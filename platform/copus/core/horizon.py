"""How long the run has left: the time a switch has to repay its cost in.

With a target loss and a validation curve, the rest of the run is read off the curve: a power law
in the samples seen, log L = a + b · log S, is fitted by least squares to the evaluations of the
run's latest `FIT_SPAN`-fold of samples (those at S ≥ S_now / 2, at least `MIN_POINTS`: a window of
fixed width in log S, where the curve is locally straight in log-log, whose slope is pinned by a
whole doubling of the samples however densely the run evaluates), and the samples at which it
reaches the target, S* = exp((log target − a) / b), are taken at a low quantile of their
prediction interval (the fit's residual error carried through the slope by the delta method): a
switch is weighed against the shorter end of what the run may have left, as the gain is weighed
at its pessimistic end (`copus.core.planner`). The samples left, at the run's current speed, are
the seconds left.

A power law without a floor falls faster than a real curve near its asymptote, so it
underestimates the samples to a target close to the floor: the horizon errs short, which
refuses a costly switch rather than making one that does not repay.

Why a span of samples and not a count of evaluations: the rule before fitted the latest 8
evaluations. On the two emulated-cluster pilots to loss 1.8 (docs/emulated-cluster.md; 157
decisions' worth of evaluations between 20% and 100% of the way) those 8 spanned a few percent
of the samples seen, where a validation noise of about 0.03 is the size of the loss's fall, and
the horizon at the 16% quantile read a median 0.42x of the samples that were really left (over
10% of readings at nothing: no time left, near the target and early alike). Over the latest
doubling it read 0.97x (10% under 0.75x, 10% over 1.29x), `bench/horizon.py`. The span was
chosen on those two pilot runs, which no suite evaluates (`tests/data/horizon/`).

Without a target, with fewer than `MIN_POINTS` evaluations, or when the fitted curve does not fall
(no progress to extrapolate), today's rule stands: the rest of the run is taken to be as long as
the run so far, and at least one decision interval (`elapsed_horizon`).

Pure: numpy only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

MIN_POINTS = 3  # evaluations a fit needs (two leave no residual to measure its error by)
FIT_SPAN = 2.0  # the curve is fitted to the evaluations at S >= S_now / FIT_SPAN


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


Window = Callable[[list[tuple[float, float]]], list[tuple[float, float]]]


def latest_span(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (samples, loss) points the curve is fitted to: those within the latest `FIT_SPAN`-fold
    of samples, at least the last `MIN_POINTS`."""
    if not points:
        return []
    start = points[-1][0] / FIT_SPAN
    inside = [p for p in points if p[0] >= start]
    return inside if len(inside) >= MIN_POINTS else points[-MIN_POINTS:]


def latest_points(count: int) -> Window:
    """The window of the rule before Dec 2026: the latest `count` evaluations."""
    return lambda points: points[-count:]


def fit_window(points: int | None) -> Window:
    """The configured window (`policy.horizon_points`): the latest doubling of the samples (None),
    else the latest `points` evaluations."""
    return latest_span if points is None else latest_points(points)


def samples_to_target(
    samples: list[float], losses: list[float], target: float, z: float, window: Window = latest_span
) -> tuple[float, float] | None:
    """The samples at which the power law fitted to the latest points (`window` of them) reaches
    `target`: (a low quantile at `z` sd, the central estimate); None when no fit can say (too few
    points with positive samples and loss, a flat or rising curve)."""
    pts = [(s, v) for s, v in zip(samples, losses) if s > 0 and v > 0 and math.isfinite(s) and math.isfinite(v)]
    pts = window(pts)
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
    window: Window = latest_span,
) -> Horizon:
    """The horizon of a decision now: from the validation curve (`samples`, `losses`, fitted over
    `window`) and the `target` at the run's current speed where the fit can say, else
    `elapsed_horizon`."""
    fit = samples_to_target(samples, losses, target, z, window) if target is not None else None
    if fit is None or not (math.isfinite(samples_per_s) and samples_per_s > 0):
        return elapsed_horizon(elapsed_s, interval_s)
    low, central = fit
    left = max(low - samples_now, 0.0)
    return Horizon(left / samples_per_s, "target", left, max(central - samples_now, 0.0))


def read_ratios(
    samples: list[float],
    losses: list[float],
    target: float,
    z: float,
    window: Window = latest_span,
    from_share: float = 0.2,
) -> list[float]:
    """How the horizon would have read a finished run that reached `target`: at each evaluation
    from `from_share` of the way on until the target, the samples left at the fit's low quantile
    over those that were really left (a fit that cannot say, or says nothing is left, reads 0).
    Empty when the run never reached the target."""
    reached = next((s for s, v in zip(samples, losses) if v <= target), None)
    if reached is None:
        return []
    out = []
    for i, now in enumerate(samples):
        if not from_share * reached <= now < reached:
            continue
        fit = samples_to_target(samples[: i + 1], losses[: i + 1], target, z, window)
        out.append(max(fit[0] - now, 0.0) / (reached - now) if fit is not None else 0.0)
    return out
