"""The simulator's statistical truth fitted to real runs (issue 42, item 1): the loss curve
L(D) = e + b / D^beta over effective tokens D and the critical batch B_crit(L) = B* / L^(1/alpha_B)
(`copus.core.simulator.LossCurve`, `CriticalBatch`) chosen so that `TrainingModel`, stepped
through each run's own GBS sequence, gives the validation losses the run measured.

Why a joint fit over runs at several GBS: one run's loss curve cannot tell the curve from the
critical batch (every step is worth B · B_crit / (B_crit + B) effective samples, a factor that
a single B folds into b); the spread between runs at different GBS at the same samples is what
measures B_crit, and how that spread grows as the loss falls is what measures alpha_B.

Points before `min_samples` are left out: the real runs warm their learning rate up over the
first samples, which the truth does not model (the same samples for every GBS, so the fit's
curve absorbs it from there on)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from copus.core.simulator import CriticalBatch, LossCurve, LrTransient, NoiseEstimate, TrainingModel

DEFAULT_TRANSIENT = LrTransient()  # the simulator's own default: a fit reads runs as it would simulate them
DEFAULT_LAG = NoiseEstimate()  # the product's half-life rule (gns.half_life_share, gns.min_half_life)


@dataclass(frozen=True)
class Trajectory:
    """One real run as the fit reads it: the GBS of every step it trained, in order, and its
    validation losses with the samples seen when each was measured."""

    label: str
    gbs_per_step: tuple[int, ...]
    evals: tuple[tuple[int, float], ...]  # (samples, val_loss), samples increasing
    b_noise: tuple[tuple[int, float], ...] = ()  # (samples, the live noise-scale estimate) after steps

    def __post_init__(self):
        if not self.gbs_per_step or not self.evals:
            raise ValueError(f"{self.label}: a trajectory needs steps and validation losses")


@dataclass(frozen=True)
class TruthFit:
    curve: LossCurve
    critical: CriticalBatch
    rms: float  # of the validation-loss residuals the fit used
    points: int
    per_run: tuple[dict, ...]  # label, points, rms, mean residual

    def as_dict(self) -> dict:
        c, k = self.curve, self.critical
        return {
            "loss_curve": {"e": c.e, "a": 0.0, "b": c.b, "beta": c.beta, "initial": c.initial},
            "critical_batch": {"b_star_tokens": k.b_star_tokens, "alpha_b": k.alpha_b},
            "rms_residual": self.rms,
            "points": self.points,
            "per_run": list(self.per_run),
        }


def _truth(theta: np.ndarray, initial: float) -> tuple[LossCurve, CriticalBatch]:
    e, log_b, beta, log_b_star, alpha_b = (float(x) for x in theta)
    curve = LossCurve(e=e, a=0.0, b=math.exp(log_b), beta=beta, initial=initial)
    return curve, CriticalBatch(b_star_tokens=math.exp(log_b_star), alpha_b=alpha_b)


def predicted_losses(
    run: Trajectory,
    curve: LossCurve,
    critical: CriticalBatch,
    seq_len: int,
    transient: LrTransient = DEFAULT_TRANSIENT,
) -> np.ndarray:
    """The truth's loss at each of `run`'s validation points, stepping its GBS sequence (a point
    past the last step reads the loss after it)."""
    model = TrainingModel(1.0, seq_len, curve, critical, transient)  # a = 0: the parameter count drops out
    out, steps = [], iter(run.gbs_per_step)
    for samples, _ in run.evals:
        while model.samples < samples:
            gbs = next(steps, None)
            if gbs is None:
                break
            model.step(gbs)
        out.append(model.loss)
    return np.array(out)


def _used(run: Trajectory, min_samples: int) -> np.ndarray:
    return np.array([s >= min_samples for s, _ in run.evals])


def _residuals(theta, runs, seq_len, initial, min_samples, transient) -> np.ndarray:
    curve, critical = _truth(theta, initial)
    parts = []
    for run in runs:
        used = _used(run, min_samples)
        observed = np.array([y for _, y in run.evals])[used]
        parts.append(predicted_losses(run, curve, critical, seq_len, transient)[used] - observed)
    return np.concatenate(parts)


def fit_truth(
    runs: list[Trajectory],
    seq_len: int,
    initial: float,
    min_samples: int = 0,
    transient: LrTransient = DEFAULT_TRANSIENT,
) -> TruthFit:
    """The loss curve and critical batch that best reproduce `runs`' validation losses (least
    squares over every point from `min_samples`), started from several guesses of the critical
    batch (the fit has local minima where B_crit is far below or above every GBS run)."""
    used = sum(int(_used(r, min_samples).sum()) for r in runs)
    if used < 6:
        raise ValueError(f"truth fit: {used} validation points from {min_samples} samples on; need at least 6")
    if len({g for r in runs for g in r.gbs_per_step}) < 2:
        raise ValueError("truth fit: every run trains one and the same GBS; the critical batch needs two or more")
    lowest = min(y for r in runs for _, y in r.evals)
    lower = [0.05, -10.0, 0.02, 0.0, 0.05]
    upper = [lowest - 0.01, 40.0, 3.0, 60.0, 3.0]
    args = (runs, seq_len, initial, min_samples, transient)
    best = None
    for b_crit_at_3 in (4.0, 32.0, 256.0):  # sequences, at loss 3 nats, with alpha_B 0.21
        start = [0.5 * lowest, math.log(50.0), 0.3, math.log(b_crit_at_3 * seq_len) + math.log(3.0) / 0.21, 0.21]
        found = least_squares(_residuals, start, bounds=(lower, upper), args=args, x_scale="jac")
        if best is None or found.cost < best.cost:
            best = found
    curve, critical = _truth(best.x, initial)
    return TruthFit(curve, critical, _rms(best.fun), len(best.fun), _per_run(runs, curve, critical, *args[1:]))


def _rms(residuals: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(residuals)))) if len(residuals) else math.nan


def _per_run(runs, curve, critical, seq_len, _initial, min_samples, transient) -> tuple[dict, ...]:
    out = []
    for run in runs:
        used = _used(run, min_samples)
        residual = (predicted_losses(run, curve, critical, seq_len, transient) - [y for _, y in run.evals])[used]
        out.append({"run": run.label, "points": int(used.sum()), "rms": _rms(residual)})
        out[-1]["mean_residual"] = float(residual.mean()) if len(residual) else math.nan
    return tuple(out)


def samples_to(run: Trajectory, target: float) -> int | None:
    """The samples at `run`'s first validation loss at or below `target` (None when none)."""
    return next((s for s, y in run.evals if y <= target), None)


def predicted_samples_to(
    gbs_per_step, target: float, curve: LossCurve, critical: CriticalBatch, seq_len: int, transient=DEFAULT_TRANSIENT
) -> int | None:
    """The samples the truth takes to `target` stepping `gbs_per_step` (None when not within it)."""
    model = TrainingModel(1.0, seq_len, curve, critical, transient)
    for gbs in gbs_per_step:
        model.step(gbs)
        if model.loss <= target:
            return model.samples
    return None


@dataclass(frozen=True)
class EstimateFit:
    """How the live noise-scale estimate of real runs departs from the fitted truth, in the terms
    of `copus.core.simulator.NoiseEstimate`: c × b_noise against the truth's critical batch the
    estimate's mean age ago, their log ratio's median (the mapping error m) and sd (the noise σ)."""

    mapping_error: float
    noise: float
    points: int
    per_run: tuple[dict, ...]

    def as_dict(self) -> dict:
        return {"mapping_error": self.mapping_error, "noise": self.noise, "points": self.points}


def fit_estimate(
    runs: list[Trajectory],
    fit: TruthFit,
    seq_len: int,
    critical_factor: float,
    reference_gbs: float,
    lag: NoiseEstimate = DEFAULT_LAG,
    min_samples: int = 0,
) -> EstimateFit:
    """The mapping error and noise that make `NoiseEstimate` read as the runs' estimates read:
    each run's truth stepped through its own GBS sequence (`fit`), the true critical batch at
    the lagged samples (`lag`'s half-life rule) set against c × the estimate after each step from
    `min_samples`."""
    logs, per_run = [], []
    for run in runs:
        model = TrainingModel(1.0, seq_len, fit.curve, fit.critical, keep_history=True)
        for gbs in run.gbs_per_step:
            model.step(gbs)
        ratios = [
            math.log(critical_factor * b / model.b_crit_at(samples - lag.lag(samples, reference_gbs)))
            for samples, b in run.b_noise
            if samples >= min_samples and b > 0 and math.isfinite(b)
        ]
        logs += ratios
        if ratios:
            per_run.append(
                {"run": run.label, "points": len(ratios), "median_ratio": math.exp(float(np.median(ratios)))}
            )
    if len(logs) < 3:
        raise ValueError(f"estimate fit: {len(logs)} finite noise-scale estimates from {min_samples} samples on")
    return EstimateFit(math.exp(float(np.median(logs))), float(np.std(logs)), len(logs), tuple(per_run))
