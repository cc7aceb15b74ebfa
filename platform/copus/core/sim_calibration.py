"""What the simulated planner reads for statistical efficiency: a `copus calibrate` of the truth
(issue 42).

Without one, the simulated planner maps the noise scale to the critical batch with the configured
c, and the truth's noise scale is made from the true critical batch with that same c (up to the
estimate's noise, lag and mapping error): the planner knows the truth's mapping exactly. A real
planner gets its mapping from a calibration, which measures it with error. `simulated_calibration`
makes one the way `copus calibrate` makes a real one (docs/calibration.md), on the truth:

1. **Reference run.** The truth trains at the reference GBS (the planner's b0) and branches at
   `branch_shares` of the samples it takes to the target; at each branch point the noise scale
   a run's controller would read there is drawn from the setting's `NoiseEstimate` (its lag, its
   noise, its mapping error), as the reference run's own estimate (`b_noise_run`).
2. **Sweep.** From each branch point, at every GBS of the grid, the truth continues (its LR
   transient after the change of batch included, as a real continuation pays it) until the loss
   is `decrement` below the branch point's; E(B), the samples that took, is measured `seeds`
   times with the scatter of a real sweep: a per-continuation error of `point_noise` (sd of log
   samples) and a per-seed luck of `seed_noise` shared by all GBS of that seed.
3. **Fit.** The very fit a real calibration makes (`copus.core.calibration.fit_branches`: the
   McCandlish form in logs with seed offsets, the lack-of-fit test, B_crit non-decreasing over
   the branch points) and c = B_crit / b_noise_run at each branch point.

The planner then reads the result through `copus.core.calibration.mapping_from_calibration`, as a
real run reads its calibration file: c interpolated in the loss between branch points, held
beyond them, and each branch point's interval as its uncertainty on the critical batch.

The truth's part (the reference run and the noiseless E(B)) is the same at every seed; each evaluation seed draws its own measurement noise and noise-scale
readings, as each seed profiles the cluster anew (`copus.core.sim_view`).

Defaults, chosen for the cluster time a calibration costs before any run was simulated with it:
branch points at 1%, 3% and 10% of the reference run, every other power of 2 over the search
range (`calibration_grid`), 4 seeds (`copus calibrate`'s), a decrement of 0.02 nats (at 10% of a
paper setting's run the reference run takes some 5% more samples to fall that far, a stretch over
which the critical batch changes little); on the paper settings that costs 51-136 h of the
cluster, a third of a run, charged to no policy (as the profile's 4 h are not): reported as
`cost_h`. Point noise 0.15 and seed luck 0.1: the two
committed calibrations' spread between seeds is a coefficient of variation of 0.13 (median over
their 36 branch point × GBS cells, docs/calibration-tradeoff.json and
docs/calibration-quickstart.json). Our assumptions, reported with every result.

Pure: numpy and scipy, no torch, no ray.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from copus.core.calibration import Sweep, fit_branches, with_noise_scales
from copus.core.finite import finite_json

if TYPE_CHECKING:  # the simulator imports this module
    from copus.core.simulator import Setting

# The generator stream of the calibration's measurement noise (the profile's is 42).
CALIBRATION_STREAM = 43
# A continuation that needs more steps than this is recorded as not reached, as a real one past
# calibration.max_samples is.
MAX_CONTINUATION_STEPS = 2_000_000


@dataclass(frozen=True)
class CalibrationSampling:
    """How the simulated planner's efficiency mapping is made (module docstring); `use` False: the
    configured c × B_noise, as a run without a calibration maps it."""

    use: bool = False
    branch_shares: tuple[float, ...] = (0.01, 0.03, 0.1)
    gbs: tuple[int, ...] | None = None
    seeds: int = 4
    decrement: float = 0.02
    point_noise: float = 0.15
    seed_noise: float = 0.1


@dataclass(frozen=True)
class BranchTruth:
    """One branch point of the reference run, as the truth has it."""

    samples_seen: int
    loss: float
    b_crit: float  # the true critical batch there (samples)
    b_crit_lagged: float  # ... the estimate's mean age earlier: what a live estimate reads
    tokens: float  # the truth's effective tokens there, where every continuation starts
    samples_to_decrement: tuple[float, ...] = ()  # noiseless E(B) per GBS of the grid; NaN: not reached


@dataclass(frozen=True)
class CalibrationTruth:
    """The truth's side of a calibration: the grid, the branch points, and the cluster time the
    whole calibration costs at the truth's best throughput of each GBS (reference run included)."""

    gbs: tuple[int, ...]
    branches: tuple[BranchTruth, ...]
    cost_s: float


def calibration_grid(s: "Setting", p: CalibrationSampling) -> tuple[int, ...]:
    """The GBS grid: as given, else every other power of 2 over the search range from its
    smallest (8, 32, ..., 2048 for 8-4096): a quarter of the cluster time of every power of 2 at
    the large batches, still the 4 values over 16x or more a `copus calibrate` grid needs."""
    if p.gbs is not None:
        return tuple(sorted(p.gbs))
    first = max(0, math.ceil(math.log2(s.gbs_min)))
    return tuple(1 << k for k in range(first, int(math.log2(s.gbs_max)) + 1, 2))


def _samples_to(model, gbs: int, loss: float) -> float:
    """Samples `model` trains at `gbs` until its loss is at or below `loss` (NaN past the cap, or
    at once where `loss` is at or below the curve's floor: stepping to the cap to find that out
    took 40 s of a hostile loss curve's simulation)."""
    if not loss > model.floor:
        return math.nan
    start = model.samples
    for _ in range(MAX_CONTINUATION_STEPS):
        if model.loss <= loss:
            return float(model.samples - start)
        model.step(gbs)
    return math.nan


def _continuation(model, gbs: int, loss: float) -> float:
    """E(B) of one continuation: NaN where it crosses within its first step, which a real sweep,
    evaluating every step at its finest, records as not measurable (`copus calibrate` refuses a
    crossing at its first evaluation), or where it does not reach the loss at all."""
    samples = _samples_to(model, gbs, loss)
    return samples if samples > gbs else math.nan


def _reference_run(s: "Setting", b0: int, shares: tuple[float, ...]) -> list[BranchTruth]:
    """The reference run at `b0`: once to the target, to place the branch points, then again to
    each (the truth is deterministic), with its history for the live estimate's lag."""
    to_target = _samples_to(s.truth_model(), b0, s.target_loss)
    if not math.isfinite(to_target):
        raise ValueError(f"calibration: the reference run at GBS {b0} does not reach the target loss")
    model, stops = s.truth_model(keep_history=True), []
    for share in sorted(shares):
        while model.samples < max(1, round(share * to_target / b0)) * b0:
            model.step(b0)
        lagged = model.b_crit_at(model.samples - s.estimate.lag(model.samples, b0))
        stops.append(BranchTruth(model.samples, model.loss, model.b_crit, lagged, model.tokens))
    return stops


def calibration_truth(s: "Setting", p: CalibrationSampling, speed: dict[int, float]) -> CalibrationTruth:
    """The truth's side of `p` on setting `s` (deterministic: the same at every seed). `speed`:
    {gbs: the truth's best samples/s at it}, to price the cluster time (NaN where a GBS has none)."""
    b0, grid = s.start.gbs, calibration_grid(s, p)
    stops = _reference_run(s, b0, p.branch_shares)
    cost = stops[-1].samples_seen / speed.get(b0, math.nan)
    branches = []
    for stop in stops:
        e = tuple(
            _continuation(s.truth_model(tokens=stop.tokens, last_gbs=b0), g, stop.loss - p.decrement) for g in grid
        )
        cost += sum(p.seeds * x / speed.get(g, math.nan) for g, x in zip(grid, e) if math.isfinite(x))
        branches.append(replace(stop, samples_to_decrement=e))
    return CalibrationTruth(grid, tuple(branches), cost)


def _sweep(branch: BranchTruth, truth: CalibrationTruth, p: CalibrationSampling, rng) -> Sweep:
    """One branch point's measurements: the noiseless E(B) with a real sweep's scatter."""
    luck = p.seed_noise * rng.standard_normal(p.seeds)
    points = {}
    for g, e in zip(truth.gbs, branch.samples_to_decrement):
        noise = p.point_noise * rng.standard_normal(p.seeds)
        points[g] = [float(e * math.exp(z + u)) if math.isfinite(e) else math.nan for z, u in zip(noise, luck)]
    return Sweep(branch.loss, p.decrement, branch.samples_seen, points)


def simulated_calibration(
    s: "Setting", p: CalibrationSampling, truth: CalibrationTruth, seed: int
) -> tuple[dict | None, dict]:
    """The calibration file a planner at evaluation seed `seed` reads (the shape `copus calibrate`
    writes; None where no branch point could be measured: the planner then maps with the
    configured c, as a run without a calibration) and a report of how far it is from the truth.
    A branch point with fewer than 2 GBS that measured the decrement is left out, as `copus
    calibrate` cannot fit it."""
    rng = np.random.default_rng([seed, CALIBRATION_STREAM])
    measurable = [b for b in truth.branches if sum(map(math.isfinite, b.samples_to_decrement)) >= 2]
    report = {
        "source": "simulated calibration",
        "grid": list(truth.gbs),
        "seeds": p.seeds,
        "decrement": p.decrement,
        "point_noise": p.point_noise,
        "seed_noise": p.seed_noise,
        "cost_h": truth.cost_s / 3600,
        "unmeasurable_branches": len(truth.branches) - len(measurable),
    }
    if not measurable:
        return None, finite_json(report | {"branches": [], "c_log_error": None})
    fits = fit_branches([_sweep(b, truth, p, rng) for b in measurable], s.start.gbs, seed=seed)
    rows = []
    for i, (fit, b) in enumerate(zip(fits, measurable)):
        b_noise_run = s.estimate.mapping_error * s.estimate.factor(rng) * b.b_crit_lagged / s.critical_factor
        fits[i] = with_noise_scales(fit, math.nan, math.nan, b_noise_run)
        rows.append(_branch_row(fits[i], b, b_noise_run))
    data = {
        "id": f"simulated-seed{seed}",
        "reference_gbs": s.start.gbs,
        "decrement": p.decrement,
        "branch_points": [f.as_dict() for f in fits],
    }
    errors = [abs(math.log(r["c"] / r["c_true"])) for r in rows if r["c"] > 0 and math.isfinite(r["c"])]
    # |log(c measured / c true)|, mean over the branch points: how far the planner's critical
    # batch is off the truth's from the calibration alone
    # null where a figure is not finite (an unpriced GBS, a reading of no noise), as JSON needs
    return data, finite_json(report | {"branches": rows, "c_log_error": float(np.mean(errors)) if errors else None})


def _branch_row(fit, b: BranchTruth, b_noise_run: float) -> dict:
    """One branch point as measured, beside the truth there."""
    return {
        "samples_seen": b.samples_seen,
        "loss": b.loss,
        "b_crit": fit.b_crit,
        "b_crit_true": b.b_crit,
        "c": fit.c,
        # the c that maps this b_noise_run onto the true critical batch
        "c_true": b.b_crit / b_noise_run,
        "fit_ok": fit.fit_ok,
    }
