"""The switching rule's uncertainties and costs: what the planner knows of how wrong it may be.

A candidate's goodput gain over the current configuration is

    r = log(goodput_candidate / goodput_current) = log(T_cand / T_cur) + log(SE_cand / SE_cur),

and both parts are estimates:

- **The critical batch** B_crit = c × B_noise enters SE. Its log has the sd of log c (the
  controller's belief after its probes, `copus.core.belief`; a calibration's 95% interval at the
  run's progress, `CalibratedMapping.log_b_crit_sd`; else the prior over calibrations,
  `PRIOR_LOG_SD` = 0.69) and of the live noise
  estimate (`NOISE_ESTIMATE_LOG_SD`), independent: their variances add
  (`critical_batch_log_sd`). Its effect on r is read off the planner at B_crit × e^(±z sd): the
  half-difference of r there over z is r's sd from this part (exact for a locally log-linear r,
  and it keeps SE's saturation: a move between two batches far below B_crit has none).
- **The step time** of each candidate comes from the profile's step-time model, whose held-out
  error (`copus.cluster.profile_table`, k-fold) is its relative sd (the mean absolute error × √(π/2),
  a Gaussian's sd); a candidate outside the measured ranges (`StepTimeModel.extrapolates`) takes
  the worst held-out error. Two candidates of the same replica and MBS share the model's terms and
  differ only in their micro-batch count, so their errors cancel in the ratio (0); otherwise they
  are independent: sd² = sd_cur² + sd_cand².

The gain at the lower quantile, exp(r − z √(sd_B² + sd_T²)) − 1 with z = 1 (the 16% quantile: the
same c × e^(±z sd) at which the probes ask whether a decision hangs on c, `policy.probes.quantile_z`),
is what the planner weighs against the full cost of the move over the rest of the run
(`copus.core.horizon`).

The cost of a GBS change is the switch's transient (Adam's second moments and the learning
rate re-adapting, `copus.core.transient`): progress worth `transient_steps` steps of the new
batch, times the depth of the change, |log2(new / old)| at most 1 (a ramp's small step costs
a share of it). From the calibration's measurement where the workload has one, else
`DEFAULT_TRANSIENT_STEPS`.

Pure: numpy only.
"""

from __future__ import annotations

import math

import numpy as np

# The gain is weighed at its 16% quantile. At the 5% (z 1.645) the trade-off workload's run never
# moved within its 49 s (tuning seed 0): the prior's 0.69 in log c alone puts the critical batch's
# low end below a third of its estimate (docs/controller.md, docs/simulator.md report both).
DEFAULT_QUANTILE_Z = 1.0
# sd of the log of the live noise estimate against B_noise measured at fixed weights on the
# trade-off workload (bench/noise_tracking.py; the simulator's NoiseEstimate default is the same)
NOISE_ESTIMATE_LOG_SD = 0.35
# Steps of the new GBS a doubling (or more) of the batch costs in progress: the mean of what the
# trade-off workload's calibration measured for its switches to a larger batch, 1.8 and 4.8 steps
# for 16 -> 64, 3.2 and 7.9 for 16 -> 256 (docs/calibration.md, the transient on its own).
DEFAULT_TRANSIENT_STEPS = 4.4
# sd of log of a measured profile point against what a run in that configuration pays, beyond the
# factor common to every point: on the emulated cluster (docs/profile.md, "What a run pays") the
# profile read 3-10% under the runs (the common part), and single points 20-30% off were seen; 0.1
# is our estimate of the spread around the common part. A planner reading the run's speed weighs
# a point against the step-time model's prediction with it (`Planner.blended_throughputs`).
DEFAULT_PROFILE_POINT_LOG_SD = 0.1
GAUSSIAN_SD_PER_MAE = math.sqrt(math.pi / 2)  # a Gaussian's sd over its mean absolute deviation


def factor_log_sd_at(mapping, loss: float, prior: float) -> float:
    """sd of log c at this progress: the calibration's interval there (`mapping.log_b_crit_sd`),
    else `prior` (a configured c carries no uncertainty of its own)."""
    measured = mapping.log_b_crit_sd(loss)
    return measured if measured is not None else prior


def critical_batch_log_sd(factor_log_sd: float, noise_log_sd: float = NOISE_ESTIMATE_LOG_SD) -> float:
    """sd of log B_crit = log c + log B_noise, the two independent."""
    return math.hypot(factor_log_sd, noise_log_sd)


def step_time_log_sd(mean_abs_error: float, worst_abs_error: float, extrapolates: list[bool]) -> np.ndarray:
    """Per candidate, the relative sd of its predicted step time: the model's held-out mean
    absolute error as a Gaussian's sd, the worst held-out error outside the measured ranges."""
    inside = GAUSSIAN_SD_PER_MAE * max(mean_abs_error, 0.0)
    outside = max(worst_abs_error, inside)
    return np.array([outside if e else inside for e in extrapolates], dtype=float)


def transient_steps_from_calibration(calibration: dict | None) -> float | None:
    """Steps of the new GBS one switch costs, as the calibration measured it: the mean over its
    branch points and its batch sizes above the reference of the transient's samples over the
    batch (a switch to a smaller batch measured none on the trade-off workload; charging it the
    same errs on the side of staying), at least 0; None without a measurement."""
    calibration = calibration or {}
    b0 = calibration.get("reference_gbs") or 0
    rows = [r for entry in calibration.get("transient") or [] for r in entry.get("rows", [])]
    steps = [
        r["transient_samples"] / r["gbs"] for r in rows if r.get("transient_samples") is not None and r["gbs"] > b0
    ]
    return max(float(np.mean(steps)), 0.0) if steps else None


def transient_depth(old_gbs: float, new_gbs: np.ndarray) -> np.ndarray:
    """How much of a full transient a GBS change costs: |log2(new / old)|, at most 1."""
    return np.minimum(1.0, np.abs(np.log2(np.asarray(new_gbs, dtype=float) / old_gbs)))


def pessimistic_log_gain(
    log_gain: np.ndarray, log_gain_low_b: np.ndarray, log_gain_high_b: np.ndarray, throughput_sd: np.ndarray, z: float
) -> tuple[np.ndarray, np.ndarray]:
    """r at its lower quantile, and r's sd: the critical batch's part from r at B_crit × e^(∓z sd)
    (`log_gain_low_b`, `log_gain_high_b`), the step time's part `throughput_sd` (per candidate,
    already combined with the current configuration's)."""
    if z <= 0:
        return log_gain, np.zeros_like(log_gain)
    stat_sd = np.abs(np.nan_to_num(log_gain_high_b - log_gain_low_b)) / (2 * z)
    sd = np.hypot(stat_sd, throughput_sd)
    return log_gain - z * sd, sd
