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

the lr-aware form with the critical batch in place of c × B_noise.

The fit is made in logs: log E(B) = log E_min + log(1 + B / B_crit), plus an offset per seed
(seed k reads the same data at every GBS, so its luck is shared along its row), plus noise
pooled over all points of the branch. B_crit's 95% interval comes from simulated
re-measurements with that pooled noise, its variance drawn like the estimate's own (a few
seeds give the wide, t-like intervals they should). Where the measurements do not follow the
linear form (a learning-rate rule that over- or under-steps at some batch sizes makes E grow
faster than linearly), a lack-of-fit F test against the seed-to-seed spread says so and the
measured curve E(B0)/E(B) itself is what the planner uses, interpolated in log B. Across
branch points, log B_crit is fitted jointly, non-decreasing with progress (an isotonic fit
weighted by each branch point's precision); each branch point's own value is kept beside it.

Two mappings from the live noise scale to efficiency, one interface (`critical_batch`,
`efficiency`), used by the planner and by the policies that follow the critical batch:

- `NoiseScaleMapping`: critical batch = c × B_noise with the configured factor c.
- `CalibratedMapping`: c measured at each branch point (B_crit / the run's B_noise there),
  interpolated in the loss, so the drift of c with progress is followed; SE from the fitted
  form (the monotone joint B_crit), or from the measured curve where the fit was rejected.

Pure: numpy and scipy, no torch, no ray.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, asdict, dataclass, field, fields, replace

import numpy as np

from copus.core.efficiency import DEFAULT_CRITICAL_FACTOR
from copus.core.efficiency import efficiency as noise_scale_efficiency
from copus.core.finite import finite_json

# The linear form is rejected when its lack-of-fit test's p-value falls below this: the measured
# curve is kept instead.
FIT_P_MIN = 0.01
# Simulated re-measurements of a branch point behind B_crit's interval and its weight in the joint fit.
BOOTSTRAP = 400
INTERVAL = 0.95
INTERVAL_Z = 1.959964  # a Gaussian 95% interval is this many sd either side
# log B_crit is searched up to a factor 1000 beyond either end of the grid, in this many steps: a
# value at the edge of that range means the grid cannot tell B_crit from 0 (below) or from
# infinity (above), and reads as such.
B_CRIT_SEARCH_FACTOR = 1000.0
B_CRIT_SEARCH_POINTS = 300
# A crossing the evaluations did not resolve is measured again with evaluations this many times closer.
REFINE_FACTOR = 4
# Below this (in squared log units: a relative spread of 1e-6), a sum of squares is no spread at all.
NO_SPREAD = 1e-12


def _optimize():
    """scipy.optimize, imported on first use: its import costs ~0.5 s of CPU, and this module
    comes with the planner into every Ray worker, controller and CLI command, which fit a
    calibration rarely (scipy.stats likewise, in `_lack_of_fit_p`)."""
    import scipy.optimize

    return scipy.optimize


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
    trend = _optimize().isotonic_regression(raw, increasing=False).x
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


def crossing_unresolved(samples: list[float], crossing: float) -> bool:
    """Whether a crossing (of `smoothed_crossing`) lies at or before the curve's first evaluation
    after its start. The evaluations do not resolve it then: it is read off the start and one
    evaluation, or clamped to the start, and says more about the evaluation interval than about
    the samples the decrement took. A finer interval may resolve it."""
    return math.isfinite(crossing) and len(samples) >= 2 and crossing <= samples[1]


def finer_evaluation(eval_every_samples: int, gbs: int) -> int | None:
    """The evaluation interval to measure an unresolved crossing again with: REFINE_FACTOR times
    closer, at least one step of `gbs`; None when the evaluations are already one step apart
    (an interval is rounded down to whole steps, at least one)."""
    if eval_every_samples < 2 * gbs:
        return None
    return max(gbs, eval_every_samples // REFINE_FACTOR)


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
    b_crit: float  # the joint fit over branch points (log B_crit non-decreasing with progress)
    b_crit_low: float  # its 95% interval
    b_crit_high: float
    e_min: float  # this branch point's own fit
    s_min: float
    chi2_p: float  # goodness of the linear fit: p-value of the lack-of-fit F test
    fit_ok: bool
    b_noise: float = float("nan")  # measured at the branch weights, raw gradients
    b_noise_adam: float = float("nan")  # ... gradients divided by Adam's sqrt(v_hat) + eps
    b_noise_run: float = float("nan")  # the reference run's smoothed estimate there (what a controller sees)
    c: float = float("nan")  # b_crit / b_noise_run: the factor the planner applies to its live estimate
    b_crit_raw: float = float("nan")  # this branch point's own B_crit, before the joint fit
    b_crit_raw_low: float = float("nan")  # its 95% interval
    b_crit_raw_high: float = float("nan")
    log_b_crit_sd: float = float("nan")  # spread of log b_crit_raw; the joint fit weighs it by 1/sd^2

    @property
    def level(self) -> float:
        """The loss the sweep's efficiency belongs to: the middle of its decrement."""
        return self.val_loss - self.decrement / 2

    def as_dict(self) -> dict:
        return finite_json(asdict(self))


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
    "b_crit_raw",
    "b_crit_raw_low",
    "b_crit_raw_high",
    "log_b_crit_sd",
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


@dataclass(frozen=True)
class Sweep:
    """One branch point's measurements: {gbs: [samples to the decrement, one per seed, in seed
    order; NaN where a seed never reached it or its crossing was not measurable]}."""

    val_loss: float
    decrement: float
    samples_seen: int
    points: dict[int, list[float]]


def is_grid_point(point: dict) -> bool:
    """A continuation of the grid, at the rule's LR (what the fits read), not one of the LR probe's."""
    return point.get("lr_factor", 1.0) == 1.0


def grid_points(points: list[dict]) -> list[dict]:
    return [p for p in points if is_grid_point(p)]


def samples_by_gbs(points: list[dict], branch: int, seeds: set[int] | None = None) -> dict[int, list[float]]:
    """A branch point's continuations (`points` in seed order; those of `seeds` only, when given)
    as a Sweep's {gbs: [samples to the decrement per seed]}: NaN where one did not reach it."""
    by_gbs: dict[int, list[float]] = {}
    for p in points:
        if p["branch"] == branch and (seeds is None or p["seed"] in seeds):
            by_gbs.setdefault(p["gbs"], []).append(p["samples"] if p["reached"] else float("nan"))
    return by_gbs


def _seed_matrix(points: dict[int, list[float]]) -> tuple[np.ndarray, np.ndarray]:
    """(grid, samples[seed, gbs]) over the batch sizes and seeds that measured anything; NaN
    where a seed did not. Seed k is row k at every GBS: it read the same data at each."""
    gbs = sorted(points)
    samples = np.full((max(len(xs) for xs in points.values()), len(gbs)), np.nan)
    for j, b in enumerate(gbs):
        samples[: len(points[b]), j] = points[b]
    samples[~np.isfinite(samples) | (samples <= 0)] = np.nan  # nothing to take the log of
    measured = np.isfinite(samples)
    some_gbs, some_seed = measured.any(axis=0), measured.any(axis=1)
    return np.array(gbs, dtype=float)[some_gbs], samples[some_seed][:, some_gbs]


def _search_range(gbs: np.ndarray) -> np.ndarray:
    span = math.log(B_CRIT_SEARCH_FACTOR)
    return np.linspace(math.log(gbs.min()) - span, math.log(gbs.max()) + span, B_CRIT_SEARCH_POINTS)


def _shape(gbs: np.ndarray, log_b_crit) -> np.ndarray:
    """log E(B) - log E_min = log(1 + B / B_crit): a row per candidate log B_crit, a column per GBS."""
    return np.log1p(gbs[None, :] * np.exp(-np.atleast_1d(np.asarray(log_b_crit, dtype=float)))[:, None])


def _residuals(z: np.ndarray, observed: np.ndarray, gbs: np.ndarray, log_b_crit: float) -> np.ndarray:
    """z[seed, gbs] (log samples, 0 where not observed) less the form at log_b_crit and each
    seed's own best offset (its shared luck, and log E_min); 0 where not observed."""
    off_form = (z - _shape(gbs, log_b_crit)[0]) * observed
    offset = off_form.sum(axis=1) / observed.sum(axis=1)
    return (off_form - offset[:, None]) * observed


def _sums_of_squares(z: np.ndarray, observed: np.ndarray, shape: np.ndarray) -> np.ndarray:
    """The sum of squared `_residuals` of every replicate z[r] for every candidate row of `shape`,
    (replicates, candidates), expanded into matrix products so that hundreds of replicates
    against hundreds of candidates take milliseconds (`_residuals` is the exact form)."""
    weight = observed.astype(float)
    own = (z**2).sum(axis=(1, 2))[:, None] - 2 * z.sum(axis=1) @ shape.T + (weight.sum(axis=0) @ (shape**2).T)[None]
    per_seed = (z.sum(axis=2)[:, :, None] - (weight @ shape.T)[None]) ** 2 / weight.sum(axis=1)[None, :, None]
    return own - per_seed.sum(axis=1)


def _best_on_range(z: np.ndarray, observed: np.ndarray, gbs: np.ndarray, search: np.ndarray) -> np.ndarray:
    """The least-squares log B_crit of every replicate z[r]: the best point of the search range,
    refined by a parabola through it and its neighbours."""
    sse = _sums_of_squares(z, observed, _shape(gbs, search))
    best = np.clip(sse.argmin(axis=1), 1, len(search) - 2)
    rows = np.arange(len(best))
    left, mid, right = sse[rows, best - 1], sse[rows, best], sse[rows, best + 1]
    curvature = left - 2 * mid + right
    shift = np.where(curvature > 0, (left - right) / (2 * np.where(curvature > 0, curvature, 1.0)), 0.0)
    return search[best] + np.clip(shift, -1.0, 1.0) * (search[1] - search[0])


def _least_squares(z: np.ndarray, observed: np.ndarray, gbs: np.ndarray, search: np.ndarray) -> tuple[float, float]:
    """(log B_crit, its sum of squared residuals) of the measured sweep, solved to 1e-10."""
    near = _best_on_range(z[None], observed, gbs, search)[0]
    step = search[1] - search[0]
    bounds = (max(near - 2 * step, search[0]), min(near + 2 * step, search[-1]))
    best = _optimize().minimize_scalar(
        lambda t: float(np.sum(_residuals(z, observed, gbs, t) ** 2)),
        bounds=bounds,
        method="bounded",
        options={"xatol": 1e-10},
    )
    return float(best.x), float(best.fun)


def _simulated_log_b_crit(
    z: np.ndarray, observed: np.ndarray, gbs: np.ndarray, search: np.ndarray, log_b_crit: float, sse: float, rng, n: int
) -> np.ndarray:
    """log B_crit of `n` simulated re-measurements of the sweep: the fitted form and seed offsets
    plus normal noise of a variance drawn as sse / chi2(dof), the sampling distribution of the
    pooled residual variance, so that few seeds give the wide (t-like) spread they should. With
    no residual dof nothing is known: the draws span the search range."""
    dof = int(observed.sum()) - observed.shape[0] - 1
    if dof < 1:
        return np.linspace(search[0], search[-1], n)
    fitted = z - _residuals(z, observed, gbs, log_b_crit)
    sigma = np.sqrt(sse / rng.chisquare(dof, n))
    again = (fitted[None] + sigma[:, None, None] * rng.standard_normal((n, *z.shape))) * observed
    # Shifted by the search's own error on the noise-free fitted sweep: no noise, no spread.
    bias = _best_on_range(fitted[None], observed, gbs, search)[0] - log_b_crit
    return np.clip(_best_on_range(again, observed, gbs, search) - bias, search[0], search[-1])


def _lack_of_fit_p(z: np.ndarray, observed: np.ndarray, sse: float) -> float:
    """p-value of the linear form against the saturated model (a free mean per GBS, plus each
    seed's offset): F = (lack of fit / its dof) / (pure error / its dof), the pure error being
    what is left between the seeds of each GBS once each seed's shared offset is removed, pooled
    over all GBS of the branch. NaN where either dof is 0 (two batch sizes, or one seed)."""
    seed, col = np.nonzero(observed)
    n_seeds, n_gbs = observed.shape
    design = np.zeros((len(seed), n_seeds + n_gbs - 1))
    design[np.arange(len(seed)), seed] = 1.0
    later = np.nonzero(col > 0)[0]
    design[later, n_seeds + col[later] - 1] = 1.0
    coef, _, rank, _ = np.linalg.lstsq(design, z[seed, col], rcond=None)
    pure = float(np.sum((z[seed, col] - design @ coef) ** 2))
    lack_dof, pure_dof = rank - (n_seeds + 1), len(seed) - rank
    if lack_dof < 1 or pure_dof < 1:
        return float("nan")
    if pure <= NO_SPREAD:  # seeds that agree exactly: any lack of fit is significant
        return 1.0 if sse - pure <= NO_SPREAD else 0.0
    from scipy import stats  # imported here, as scipy.optimize is (`_optimize`)

    return float(stats.f.sf(((sse - pure) / lack_dof) / (pure / pure_dof), lack_dof, pure_dof))


def _b_crit_of(log_b_crit: float, search: np.ndarray) -> float:
    """B_crit of a log value of the search; at its lower edge 0 (E proportional to B: no batch
    is too small), at its upper edge infinite (samples do not grow with B over the grid)."""
    half_step = (search[1] - search[0]) / 2
    if log_b_crit <= search[0] + half_step:
        return 0.0
    return float("inf") if log_b_crit >= search[-1] - half_step else math.exp(log_b_crit)


def _interval(draws: np.ndarray, search: np.ndarray) -> tuple[float, float]:
    tail = (1 - INTERVAL) / 2 * 100
    low, high = np.percentile(draws, [tail, 100 - tail])
    return _b_crit_of(low, search), _b_crit_of(high, search)


def _scale(samples: np.ndarray, gbs: np.ndarray, b_crit: float) -> tuple[float, float]:
    """(E_min, S_min) of the fitted form, from the geometric mean of the samples."""
    logs = np.log(samples)
    if math.isinf(b_crit):
        return float(np.exp(np.nanmean(logs))), 0.0
    s_min = float(np.exp(np.nanmean(logs - np.log(b_crit + gbs))))
    return s_min * b_crit, s_min


def _mean_and_sd(samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per GBS, over the seeds that measured it: the mean and the spread (0 for one seed)."""
    count = np.isfinite(samples).sum(axis=0)
    mean = np.nansum(samples, axis=0) / count
    spread = np.nansum((samples - mean) ** 2, axis=0) / np.maximum(count - 1, 1)
    return mean, np.sqrt(spread)


def _own_fit(sweep: Sweep, b0: float, search: np.ndarray, rng, n: int) -> tuple[BranchFit, float, np.ndarray]:
    """One branch point on its own: its fit (b_crit = b_crit_raw), log B_crit and its simulated draws."""
    gbs, samples = _seed_matrix(sweep.points)
    if len(gbs) < 2:
        raise ValueError(
            f"branch at loss {sweep.val_loss:.3f}: fewer than 2 batch sizes measured the decrement (never "
            "reached it, or reached it within one step, too soon to measure: a larger decrement would do)"
        )
    observed = np.isfinite(samples)
    logs = np.where(observed, np.log(np.where(observed, samples, 1.0)), 0.0)
    z = (logs - (logs.sum(axis=1) / observed.sum(axis=1))[:, None]) * observed  # small numbers: exact sums
    log_b_crit, sse = _least_squares(z, observed, gbs, search)
    draws = _simulated_log_b_crit(z, observed, gbs, search, log_b_crit, sse, rng, n)
    p = _lack_of_fit_p(z, observed, sse)
    b_crit, (low, high) = _b_crit_of(log_b_crit, search), _interval(draws, search)
    mean, sd = _mean_and_sd(samples)
    fit = BranchFit(
        sweep.val_loss,
        sweep.decrement,
        sweep.samples_seen,
        [int(b) for b in gbs],
        mean.tolist(),
        sd.tolist(),
        _efficiency_curve(gbs, mean, b0).tolist(),
        b_crit,
        low,
        high,
        *_scale(samples, gbs, b_crit),
        p,
        not p < FIT_P_MIN,  # a form that cannot be tested (NaN) is kept
        b_crit_raw=b_crit,
        b_crit_raw_low=low,
        b_crit_raw_high=high,
        log_b_crit_sd=float(draws.std()),
    )
    return fit, log_b_crit, draws


def _monotone(log_b_crit: np.ndarray, draws: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """log B_crit non-decreasing over branch points in progress order (rows), each weighted by
    the inverse variance of its own draws; the same fit of every column of draws is the joint
    fit's spread (the branch points' draws are independent)."""
    if len(log_b_crit) < 2:
        return log_b_crit, draws
    weights = 1.0 / np.maximum(draws.var(axis=1), NO_SPREAD)
    isotonic = _optimize().isotonic_regression
    joint = isotonic(log_b_crit, weights=weights).x
    again = np.stack([isotonic(column, weights=weights).x for column in draws.T], axis=1)
    return joint, again


def fit_branches(sweeps: list[Sweep], b0: float, seed: int = 0, draws: int = BOOTSTRAP) -> list[BranchFit]:
    """Fit every branch point on its own, then B_crit jointly: a critical batch that shrinks as
    training goes on is noise (McCandlish et al.; Merrill et al. 2025), so log B_crit is made
    non-decreasing in the samples seen, each branch point weighted by its precision. b_crit and
    its interval are the joint fit's; b_crit_raw and its interval, each branch point's own.
    Returned in the order given. `seed` makes the simulated re-measurements repeatable."""
    search = _search_range(np.array(sorted({b for s in sweeps for b in s.points}), dtype=float))
    rng = np.random.default_rng(seed)
    own = [_own_fit(s, b0, search, rng, draws) for s in sweeps]
    order = sorted(range(len(sweeps)), key=lambda i: sweeps[i].samples_seen)
    joint, joint_draws = _monotone(np.array([own[i][1] for i in order]), np.stack([own[i][2] for i in order]))
    fits: list[BranchFit] = [own[i][0] for i in range(len(sweeps))]
    for rank, i in enumerate(order):
        low, high = _interval(joint_draws[rank], search)
        fits[i] = replace(fits[i], b_crit=_b_crit_of(joint[rank], search), b_crit_low=low, b_crit_high=high)
    return fits


def fit_branch(
    val_loss: float,
    decrement: float,
    samples_seen: int,
    points: dict[int, list[float]],
    b0: float,
    seed: int = 0,
    draws: int = BOOTSTRAP,
) -> BranchFit:
    """Fit one branch point from {gbs: [samples to the decrement, one per seed]} (`fit_branches`
    of it alone). GBS values whose every seed failed to reach the decrement are left out of the
    fit (they are in the points list with NaN)."""
    return fit_branches([Sweep(val_loss, decrement, samples_seen, points)], b0, seed, draws)[0]


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
    critical_factor: float = DEFAULT_CRITICAL_FACTOR
    source: str = "configured"

    def critical_batch(self, b_noise: float, loss: float = float("nan")) -> float:
        return self.critical_factor * b_noise

    def log_b_crit_sd(self, loss: float) -> float | None:
        """A configured c carries no measured uncertainty of its own: None (the prior's applies)."""
        return None

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
    fallback_factor: float = DEFAULT_CRITICAL_FACTOR  # c where no branch measured one (no noise estimate there)

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

    def log_b_crit_sd(self, loss: float) -> float | None:
        """sd of log B_crit from the 95% intervals of the branch points this progress lies
        between, weighted as the mapping weighs them; None where none has a finite interval."""
        sds = [
            (math.log(b.b_crit_high / b.b_crit_low) / (2 * INTERVAL_Z), w)
            for b, w in self._weights(loss)
            if 0 < b.b_crit_low <= b.b_crit_high < math.inf
        ]
        total = sum(w for _, w in sds)
        return sum(sd * w for sd, w in sds) / total if total > 0 else None

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


# --- the learning-rate rule's share -----------------------------------------------------------


def _mean_samples(points: list[dict], branch: int, gbs: int, factor: float) -> tuple[float | None, int]:
    """Mean samples to the decrement of the continuations at (branch, GBS, LR factor) that were
    measured, and how many were; None when none was."""
    got = [
        p["samples"]
        for p in points
        if p["branch"] == branch
        and p["gbs"] == gbs
        and p.get("lr_factor", 1.0) == factor
        and p["samples"] is not None
        and math.isfinite(p["samples"])
    ]
    return (float(np.mean(got)) if got else None), len(got)


def lr_probe_table(points: list[dict], b0: int, probe: dict) -> dict:
    """What `calibration.lr_probe` measured, per branch point: samples to the decrement at each
    (GBS, LR factor) against the rule's LR at that GBS (`relative_to_rule` < 1: fewer samples than
    the rule's LR needs), and the jump: at B0 with the LR the rule gives `jump_to`, against B0 and
    against `jump_to` at their rule's LR. `lr_share_of_switch` = log(E(B0, jumped LR) / E(B0)) /
    log(E(jump_to) / E(B0)): the part of the switch's change in samples that the LR jump alone
    makes (0: none, 1: all of it; null when the switch changes nothing measurable)."""
    rows, jumps = [], []
    for branch in sorted({p["branch"] for p in points}):
        for gbs, factor in probe["pairs"]:
            mean, n = _mean_samples(points, branch, gbs, factor)
            rule, _ = _mean_samples(points, branch, gbs, 1.0)
            relative = mean / rule if mean is not None and rule else None
            rows.append(
                {
                    "branch": branch,
                    "gbs": gbs,
                    "lr_factor": factor,
                    "mean_samples": mean,
                    "seeds": n,
                    "rule_samples": rule,
                    "relative_to_rule": relative,
                }
            )
        jumps.append(_jump_row(points, branch, b0, probe))
    return {"jump_to": probe["jump_to"], "jump_factor": probe["jump_factor"], "rows": rows, "jumps": jumps}


def _jump_row(points: list[dict], branch: int, b0: int, probe: dict) -> dict:
    at_b0, _ = _mean_samples(points, branch, b0, 1.0)
    jumped, _ = _mean_samples(points, branch, b0, probe["jump_factor"])
    switched, _ = _mean_samples(points, branch, probe["jump_to"], 1.0)
    share = None
    if at_b0 and jumped and switched and abs(math.log(switched / at_b0)) > 1e-9:
        share = math.log(jumped / at_b0) / math.log(switched / at_b0)
    return {
        "branch": branch,
        "samples_b0": at_b0,
        "samples_b0_jumped_lr": jumped,
        "samples_jump_to": switched,
        "lr_share_of_switch": share,
    }
