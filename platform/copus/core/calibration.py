"""The critical batch, measured: fits of branch-point sweeps and the efficiency mapping the
planner uses.

A calibration (`copus calibrate`) continues a reference run from a few branch points at every
GBS B of a grid (same data order, the experiment's learning-rate rule) until the validation
loss has dropped by a fixed decrement, and counts the samples E(B) that took. McCandlish et
al. (2018) predict

    E(B) = E_min · (1 + B / B_crit)        S(B) = E(B) / B = S_min · (1 + B_crit / B)

so E is linear in B: E = E_min + S_min·B, and B_crit = E_min / S_min. The statistical
efficiency of B relative to the reference batch B0 is the ratio of samples needed,

    SE(B) = E(B0) / E(B) = (B_crit + B0) / (B_crit + B),

the lr-aware form with the critical batch in place of c × B_noise. Where the measurements do
not follow the linear form (a learning-rate rule that over- or under-steps at some batch
sizes makes E grow faster than linearly), the fit says so (a chi-square test against the
seed-to-seed spread) and the measured curve E(B0)/E(B) itself is what the planner uses,
interpolated in log B.

Two mappings from the live noise scale to efficiency, one interface (`critical_batch`,
`efficiency`), used by the planner and by the policies that follow the critical batch:

- `NoiseScaleMapping`: critical batch = c × B_noise with the configured factor c.
- `CalibratedMapping`: c measured at each branch point (B_crit / the run's B_noise there),
  interpolated in the loss, so the drift of c with progress is followed; SE from the fitted
  form, or from the measured curve where the fit was rejected.

Pure: numpy and scipy, no torch, no ray.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, asdict, dataclass, field, fields

import numpy as np
from scipy import stats
from scipy.optimize import isotonic_regression, nnls

from copus.core.efficiency import efficiency as noise_scale_efficiency

# A fit whose chi-square p-value falls below this is rejected: the curve is kept instead.
FIT_P_MIN = 0.01
# Relative spread assumed for a point when its seeds agree better than this (two seeds
# under-estimate the spread; the crossing of a noisy loss curve is never exact).
MIN_REL_SD = 0.05
BOOTSTRAP = 400


def samples_to_decrement(samples: list[float], losses: list[float], target: float) -> float:
    """Samples at which the loss curve first reaches `target`, interpolated linearly between the
    two evaluations around the crossing; NaN if it never does."""
    for i in range(1, len(losses)):
        if losses[i] <= target:
            l0, l1, s0, s1 = losses[i - 1], losses[i], samples[i - 1], samples[i]
            frac = 1.0 if l0 == l1 else (l0 - target) / (l0 - l1)
            return float(s0 + min(max(frac, 0.0), 1.0) * (s1 - s0))
    return float("nan")


def smoothed_crossing(samples: list[float], losses: list[float], target: float, window: float) -> float:
    """Samples at which the *trend* of a noisy loss curve reaches `target`.

    The first crossing of the raw curve is biased early, and more so for a noisier curve: a
    fluctuation hits the threshold before the trend does, and a smaller batch's trajectory
    fluctuates more, so first passage flatters small batches. Instead: a non-increasing
    (isotonic) fit of the curve, then a least-squares line through the raw points whose fitted
    loss lies within `window` of the target, solved for the target (the isotonic fit's own
    crossing when fewer than 3 points qualify). NaN when the trend never gets there."""
    s = np.asarray(samples, dtype=float)
    raw = np.asarray(losses, dtype=float)
    trend = isotonic_regression(raw, increasing=False).x
    if not np.any(trend <= target):
        return float("nan")
    fallback = samples_to_decrement(list(s), list(trend), target)
    near = np.abs(trend - target) <= window
    if near.sum() < 3 or np.ptp(s[near]) == 0:
        return fallback
    slope, intercept = np.polyfit(s[near], raw[near], 1)
    if slope >= 0:
        return fallback
    return float(min(max((target - intercept) / slope, s[0]), s[-1]))


def fit_linear_e(gbs: np.ndarray, e: np.ndarray) -> tuple[float, float]:
    """(E_min, S_min) ≥ 0 of E = E_min + S_min·B, least squares in relative error."""
    a = np.stack([np.ones_like(gbs), gbs], axis=1) / e[:, None]
    coef, _ = nnls(a, np.ones_like(e))
    return float(coef[0]), float(coef[1])


def critical_batch_of(e_min: float, s_min: float) -> float:
    if s_min <= 0:
        return float("inf")  # samples do not grow with B: perfect scaling over the grid
    return e_min / s_min


@dataclass(frozen=True)
class BranchFit:
    """One branch point's sweep, fitted."""

    val_loss: float  # validation loss at the branch point
    decrement: float  # the loss drop every continuation ran to
    samples_seen: int  # samples of the reference run at the branch point
    gbs: list[int]  # the grid
    mean_samples: list[float]  # E(B): samples to the decrement, mean over seeds
    sd_samples: list[float]  # their spread over seeds
    efficiency: list[float]  # measured SE(B) = E(B0)/E(B)
    b_crit: float
    b_crit_low: float  # 95% bootstrap interval over seeds
    b_crit_high: float
    e_min: float
    s_min: float
    chi2_p: float  # goodness of the linear fit
    fit_ok: bool
    b_noise: float = float("nan")  # measured at the branch weights, raw gradients
    b_noise_adam: float = float("nan")  # ... gradients divided by Adam's sqrt(v_hat) + eps
    b_noise_run: float = float("nan")  # the reference run's smoothed estimate there (what a controller sees)
    c: float = float("nan")  # b_crit / b_noise_run: the factor the planner applies to its live estimate

    @property
    def level(self) -> float:
        """The loss the sweep's efficiency belongs to: the middle of its decrement."""
        return self.val_loss - self.decrement / 2

    def as_dict(self) -> dict:
        return finite_json(asdict(self))


def finite_json(value):
    """JSON has no NaN: a value not measured (a GBS that never reached the decrement) is null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


# A branch point's values that were measured: a number, or null where nothing was measurable.
_MEASURED = (
    "val_loss",
    "decrement",
    "b_crit",
    "b_crit_low",
    "b_crit_high",
    "e_min",
    "s_min",
    "chi2_p",
    "b_noise",
    "b_noise_adam",
    "b_noise_run",
    "c",
)
_SERIES = ("mean_samples", "sd_samples", "efficiency")  # one value (or null) per GBS of the grid


def _number_or_null(value) -> bool:
    return value is None or isinstance(value, (int, float)) and not isinstance(value, bool)


def _count(value, least: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def branch_point_problem(d) -> str | None:
    """Why `d` is not a branch point of a calibration file, one `BranchFit` holds (None when it is)."""
    if not isinstance(d, dict):
        return "not a mapping"
    missing = [f.name for f in fields(BranchFit) if f.default is MISSING and f.name not in d]
    if missing:
        return f"{missing[0]} missing"
    wrong = [k for k in _MEASURED if k in d and not _number_or_null(d[k])]
    if wrong or not _count(d["samples_seen"]) or not isinstance(d["fit_ok"], bool):
        return f"{(wrong or ['samples_seen or fit_ok'])[0]} has the wrong type"
    if not isinstance(d["gbs"], list) or not all(_count(g, 1) for g in d["gbs"]):
        return "gbs: expected a list of batch sizes"
    for key in _SERIES:
        if not isinstance(d[key], list) or len(d[key]) != len(d["gbs"]) or not all(map(_number_or_null, d[key])):
            return f"{key}: expected a number or null per batch size of gbs"
    return None


def calibration_problem(data) -> str | None:
    """Why `data` is not what `copus calibrate` writes (calibration-<id>.json; None when it is):
    what the planner and the report read of it, each of the type they read it as."""
    if not isinstance(data, dict) or not isinstance(data.get("key"), dict) or data["key"].get("kind") != "calibration":
        return "no key.kind 'calibration'"
    if not isinstance(data.get("branch_points"), list) or not data["branch_points"]:
        return "branch_points: expected a non-empty list"
    for i, point in enumerate(data["branch_points"]):
        problem = branch_point_problem(point)
        if problem:
            return f"branch_points[{i}]: {problem}"
    if not all(_number_or_null(data.get(k)) for k in ("reference_gbs", "decrement", "wall_clock_s")):
        return "reference_gbs, decrement or wall_clock_s is not a number"
    points = data.get("points") or []
    if not isinstance(points, list) or not all(isinstance(p, dict) for p in points):
        return "points: expected a list of mappings"
    if not all(isinstance(v or {}, dict) for v in (data.get("settings"), data["key"].get("workload"))):
        return "settings or key.workload: expected a mapping"
    return None


def branch_fit_from_dict(d: dict) -> BranchFit:
    nan = float("nan")
    fields = {k: (nan if v is None else v) for k, v in d.items() if k in BranchFit.__dataclass_fields__}
    return BranchFit(**fields)


def _efficiency_curve(gbs: np.ndarray, e: np.ndarray, b0: float) -> np.ndarray:
    """E(B0)/E(B); E(B0) interpolated in log-log when B0 is not on the grid."""
    e_b0 = math.exp(np.interp(math.log(b0), np.log(gbs), np.log(e)))
    return e_b0 / e


def _chi2_p(gbs: np.ndarray, mean: np.ndarray, sd: np.ndarray, e_min: float, s_min: float, n_seeds: int) -> float:
    rel_sd = np.maximum(sd / mean, MIN_REL_SD) / math.sqrt(max(n_seeds, 1))
    resid = (mean - (e_min + s_min * gbs)) / mean / rel_sd
    dof = max(len(gbs) - 2, 1)
    return float(stats.chi2.sf(float(np.sum(resid**2)), dof))


def _bootstrap_interval(gbs: np.ndarray, by_seed: list[np.ndarray], rng: np.random.Generator) -> tuple[float, float]:
    """95% interval of B_crit over seed resamples (each GBS's seeds drawn with replacement)."""
    values = []
    for _ in range(BOOTSTRAP):
        e = np.array([rng.choice(s, size=len(s)).mean() for s in by_seed])
        values.append(critical_batch_of(*fit_linear_e(gbs, e)))
    low, high = np.percentile(np.array(values), [2.5, 97.5])
    return float(low), float(high)


def fit_branch(
    val_loss: float, decrement: float, samples_seen: int, points: dict[int, list[float]], b0: float, seed: int = 0
) -> BranchFit:
    """Fit one branch point from {gbs: [samples to the decrement, one per seed]}. GBS values
    whose every seed failed to reach the decrement are left out of the fit (they are in the
    points list with NaN)."""
    reached = {b: np.array([x for x in xs if math.isfinite(x)]) for b, xs in sorted(points.items())}
    reached = {b: xs for b, xs in reached.items() if len(xs)}
    if len(reached) < 2:
        raise ValueError(f"branch at loss {val_loss:.3f}: fewer than 2 batch sizes reached the decrement")
    gbs = np.array(list(reached), dtype=float)
    by_seed = list(reached.values())
    mean = np.array([s.mean() for s in by_seed])
    sd = np.array([s.std(ddof=1) if len(s) > 1 else 0.0 for s in by_seed])
    e_min, s_min = fit_linear_e(gbs, mean)
    low, high = _bootstrap_interval(gbs, by_seed, np.random.default_rng(seed))
    p = _chi2_p(gbs, mean, sd, e_min, s_min, min(len(s) for s in by_seed))
    return BranchFit(
        val_loss,
        decrement,
        samples_seen,
        [int(b) for b in gbs],
        mean.tolist(),
        sd.tolist(),
        _efficiency_curve(gbs, mean, b0).tolist(),
        critical_batch_of(e_min, s_min),
        low,
        high,
        e_min,
        s_min,
        p,
        p >= FIT_P_MIN,
    )


def with_noise_scales(fit: BranchFit, b_noise: float, b_noise_adam: float, b_noise_run: float) -> BranchFit:
    c = fit.b_crit / b_noise_run if b_noise_run > 0 and math.isfinite(b_noise_run) else float("nan")
    return BranchFit(
        **{**asdict(fit), "b_noise": b_noise, "b_noise_adam": b_noise_adam, "b_noise_run": b_noise_run, "c": c}
    )


# --- mappings from the live noise scale to efficiency -----------------------------------------


@dataclass(frozen=True)
class NoiseScaleMapping:
    """The configured mapping: critical batch = critical_factor × B_noise; SE in `form`."""

    form: str = "pollux"
    critical_factor: float = 2.0
    source: str = "configured"

    def critical_batch(self, b_noise: float, loss: float = float("nan")) -> float:
        return self.critical_factor * b_noise

    def efficiency(self, b_noise: float, loss: float, b0: float, gbs: np.ndarray) -> np.ndarray:
        return np.asarray(noise_scale_efficiency(self.form, b_noise, b0, gbs, self.critical_factor), dtype=float)


def _log_interp(x: np.ndarray, xs: list[float], ys: list[float]) -> np.ndarray:
    """Interpolate y in log x; beyond the grid, extend the end segments' log-log slopes (never
    letting SE rise with B)."""
    lx, lxs, lys = np.log(x), np.log(np.asarray(xs, float)), np.log(np.asarray(ys, float))
    out = np.interp(lx, lxs, lys)
    if len(xs) >= 2:
        lo_slope = min((lys[1] - lys[0]) / (lxs[1] - lxs[0]), 0.0)
        hi_slope = min((lys[-1] - lys[-2]) / (lxs[-1] - lxs[-2]), 0.0)
        out = np.where(lx < lxs[0], lys[0] + lo_slope * (lx - lxs[0]), out)
        out = np.where(lx > lxs[-1], lys[-1] + hi_slope * (lx - lxs[-1]), out)
    return np.exp(out)


@dataclass(frozen=True)
class CalibratedMapping:
    """The measured mapping. Branches sorted by progress (falling loss); between two branch
    levels the SE curves (and c) are interpolated linearly in the loss, held beyond the ends."""

    branches: tuple[BranchFit, ...]
    b0: float
    source: str = "calibration"
    fallback_factor: float = 2.0  # c where no branch measured one (no noise estimate there)

    def _weights(self, loss: float) -> list[tuple[BranchFit, float]]:
        bs = sorted(self.branches, key=lambda b: -b.level)
        if not math.isfinite(loss) or loss >= bs[0].level:
            return [(bs[0], 1.0)]
        if loss <= bs[-1].level:
            return [(bs[-1], 1.0)]
        for a, b in zip(bs, bs[1:]):
            if b.level <= loss <= a.level:
                w = (a.level - loss) / (a.level - b.level)
                return [(a, 1.0 - w), (b, w)]
        return [(bs[-1], 1.0)]

    def factor(self, loss: float) -> float:
        """c at this loss (interpolated between the branch points that measured one)."""
        pairs = [(b, w) for b, w in self._weights(loss) if math.isfinite(b.c)]
        if not pairs:
            known = [b.c for b in self.branches if math.isfinite(b.c)]
            return float(np.median(known)) if known else self.fallback_factor
        return sum(b.c * w for b, w in pairs) / sum(w for _, w in pairs)

    def _branch_b_crit(self, branch: BranchFit, b_noise: float) -> float:
        if math.isfinite(b_noise) and b_noise > 0 and math.isfinite(branch.c):
            return branch.c * b_noise
        return branch.b_crit

    def critical_batch(self, b_noise: float, loss: float = float("nan")) -> float:
        return sum(self._branch_b_crit(b, b_noise) * w for b, w in self._weights(loss))

    def _branch_efficiency(self, branch: BranchFit, b_noise: float, b0: float, gbs: np.ndarray) -> np.ndarray:
        if not branch.fit_ok:
            return (
                _log_interp(gbs, branch.gbs, branch.efficiency)
                / _log_interp(np.array([b0]), branch.gbs, branch.efficiency)[0]
            )
        b_crit = self._branch_b_crit(branch, b_noise)
        if math.isinf(b_crit):
            return np.ones_like(gbs, dtype=float)
        return (b_crit + b0) / (b_crit + gbs)

    def efficiency(self, b_noise: float, loss: float, b0: float, gbs: np.ndarray) -> np.ndarray:
        gbs = np.asarray(gbs, dtype=float)
        return sum(self._branch_efficiency(b, b_noise, b0, gbs) * w for b, w in self._weights(loss))


def mapping_from_calibration(data: dict, b0: float, fallback_factor: float) -> CalibratedMapping:
    branches = tuple(branch_fit_from_dict(d) for d in data["branch_points"])
    if not branches:
        raise ValueError("calibration has no branch points")
    return CalibratedMapping(branches, b0, source=data.get("id", "calibration"), fallback_factor=fallback_factor)


@dataclass
class CalibrationResult:
    """What `copus calibrate` writes (calibration-<id>.json) and prints with --json."""

    key: dict
    reference_gbs: int
    decrement: float
    branch_points: list[BranchFit]
    points: list[dict] = field(default_factory=list)  # every continuation run
    wall_clock_s: float = 0.0

    def as_dict(self, cal_id: str) -> dict:
        return {
            "id": cal_id,
            "key": self.key,
            "reference_gbs": self.reference_gbs,
            "decrement": self.decrement,
            "branch_points": [b.as_dict() for b in self.branch_points],
            "points": self.points,
            "wall_clock_s": self.wall_clock_s,
            "all_fits_ok": all(b.fit_ok for b in self.branch_points),
            "b_crit_growth": _growth([b.b_crit for b in self.branch_points]),
        }


def _growth(values: list[float]) -> float | None:
    finite = [v for v in values if math.isfinite(v) and v > 0]
    return finite[-1] / finite[0] if len(finite) >= 2 else None
