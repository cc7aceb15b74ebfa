"""What the simulated planner reads instead of the truth: a step-time table made the way `copus
profile` makes a real run's (issue 42).

The truth's step time (`copus.core.simulator.step_time`) prices every configuration exactly. A
real planner never sees that: `copus profile` measures a sample of the configurations, a few steps
each, with the timing noise of a few steps, within a budget of cluster time; the planner then
reads the measured figure where a point was measured and the step-time model fitted to those
points (`copus.core.throughput.fit_step_time_model`) elsewhere, leaves out configurations of a
parallel degree no point had (as `copus.cluster.profiler.feasible_space`), and weighs each
prediction with the model's held-out error (`copus.core.decision_rule.step_time_log_sd`). A
`ProfileSampling` does the same to the simulated cluster: the points of
`copus.core.search.profile_points`, in its order, while `budget_s` of cluster time lasts, each
measured as the truth's step time times e^(noise · z). Its report says how far the planner's table
is from the truth.

`ProfileSampling(exact=True)` is the planner before issue 42: the truth's own table, no error.
Pure: numpy and scipy, no torch, no ray.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from copus.core.decision_rule import step_time_log_sd
from copus.core.layout import CandidateConfig, ModelShape
from copus.core.search import profile_points
from copus.core.throughput import Measurement, cross_validate, fit_step_time_model

# The generator stream of the profile's timing noise (the estimate's noise uses the seed alone).
PROFILE_STREAM = 42

if TYPE_CHECKING:  # the simulator imports this module
    from copus.core.simulator import MeasuredSteps


@dataclass(frozen=True)
class ProfileSampling:
    """How the simulated planner's step-time table is made (module docstring). Defaults: 3 GBS per
    (layout, MBS, sharding, recomputation) up to 16 micro-batches, as `copus profile`'s
    (`profile.gbs_per_shape`, `profile.max_microbatches`); 4 steps per point (1 warm-up, 3 timed);
    4 h of the cluster; timing noise 2% (sd of log), our assumption for the median of 3 GPU steps."""

    exact: bool = False
    noise: float = 0.02
    gbs_per_shape: int = 3
    max_microbatches: int | None = 16
    budget_s: float = 4 * 3600.0
    steps_per_point: int = 4
    folds: int = 5


@dataclass(frozen=True)
class PlannerView:
    """The planner's table ({candidate: samples/s}, only those it may choose), each candidate's
    relative sd of its predicted throughput (None: exact), and how it was made."""

    throughputs: dict[CandidateConfig, float]
    throughput_log_sd: dict[CandidateConfig, float] | None
    report: dict
    # the step-time model's samples/s of the same candidates, which a decision scales to the
    # run's own speed (`Planner.at_run_speed`); None: no model (the exact view)
    model_throughputs: dict[CandidateConfig, float] | None = None
    # the calibration file the planner reads (copus.core.sim_calibration) and how far it is from
    # the truth; None: the configured c x B_noise
    calibration: dict | None = None
    calibration_report: dict | None = None


def exact_view(cands: list[CandidateConfig], truth: np.ndarray) -> PlannerView:
    """The truth's own table: what the planner read before issue 42, and the perfect planner's."""
    return PlannerView(dict(zip(cands, map(float, truth))), None, {"source": "truth", "exact": True})


def _measure(
    order: list[CandidateConfig], step_s: dict[CandidateConfig, float], p: ProfileSampling, rng
) -> tuple[list[Measurement], float]:
    """The profile's points in order while the budget lasts (a point started is finished, as the
    profiler's), each the truth's step time with the timing noise; and the cluster seconds spent."""
    points, spent = [], 0.0
    for c in order:
        if spent >= p.budget_s:
            break
        spent += p.steps_per_point * step_s[c]
        points.append(Measurement(c, step_s[c] * math.exp(p.noise * float(rng.standard_normal()))))
    return points, spent


def profiled_view(
    shape: ModelShape, cands: list[CandidateConfig], truth: np.ndarray, p: ProfileSampling, seed: int
) -> PlannerView:
    """The table a planner gets from a profile of the simulated cluster (module docstring); `seed`
    draws the timing noise. `truth`: each candidate's true samples/s."""
    if p.exact:
        return exact_view(cands, truth)
    step_s = {c: c.gbs / float(t) for c, t in zip(cands, truth)}
    rng = np.random.default_rng([seed, PROFILE_STREAM])
    points, spent = _measure(profile_points(cands, p.gbs_per_shape, p.max_microbatches), step_s, p, rng)
    if len(points) < 2:
        raise ValueError(
            f"profile.budget_s: {p.budget_s:g} s measures {len(points)} configuration(s); the step-time fit needs 2"
        )
    model = fit_step_time_model(points, shape)
    held_out = cross_validate(points, shape, p.folds, seed)
    measured = {m.config: m.step_time_s for m in points}
    usable = [c for c in cands if not model.extrapolates(c)]
    table = {c: c.gbs / (measured[c] if c in measured else model.step_time(c)) for c in usable}
    sds = step_time_log_sd(held_out.mape, held_out.max_ape, [False] * len(usable))
    error = np.array([abs(table[c] * step_s[c] / c.gbs - 1.0) for c in usable])
    report = {
        "source": "profile",
        "exact": False,
        "points": len(points),
        "budget_s": p.budget_s,
        "spent_s": spent,
        "timing_noise": p.noise,
        "fit_held_out_mape": held_out.mape,
        "fit_held_out_max_ape": held_out.max_ape,
        # The planner's table against the truth, over every candidate it may choose.
        "table_vs_truth_mape": float(error.mean()),
        "table_vs_truth_max_ape": float(error.max()),
        "candidates": len(usable),
        "left_out_extrapolating": len(cands) - len(usable),
    }
    model_table = {c: model.throughput(c) for c in usable}
    return PlannerView(table, dict(zip(usable, map(float, sds))), report, model_table)


def table_view(
    steps: "MeasuredSteps", cands: list[CandidateConfig], truth: np.ndarray, source: str = ""
) -> PlannerView:
    """The table a real planner reads from a real `copus profile` file (`profile.table`): the
    measured step time where the file measured a candidate, its fitted model elsewhere, each
    weighed with the file's own held-out error, as a run's controller weighs it
    (`copus.cluster.controller_setup.rule_settings`); a candidate the file could not price is left
    out. Its report says how far it is from the simulated truth (`truth`: samples/s)."""
    usable = [c for c in cands if steps.admits(c)]
    table = {c: c.gbs / steps.step_time(c) for c in usable}
    mape, worst = steps.held_out
    sds = step_time_log_sd(mape, worst, [steps.model.extrapolates(c) for c in usable])
    true_step = {c: c.gbs / float(t) for c, t in zip(cands, truth)}
    error = np.array([abs(table[c] * true_step[c] / c.gbs - 1.0) for c in usable])
    report = {
        "source": "table",
        "exact": False,
        "table": source,
        "points": len(steps.measured),
        "fit_held_out_mape": mape,
        "fit_held_out_max_ape": worst,
        "table_vs_truth_mape": float(error.mean()),
        "table_vs_truth_max_ape": float(error.max()),
        # Off by one factor for every candidate (another machine's speed) moves no choice: the
        # spread around that factor is what can.
        "table_vs_truth_median_ratio": float(np.median([table[c] * true_step[c] / c.gbs for c in usable])),
        "candidates": len(usable),
        "left_out_extrapolating": len(cands) - len(usable),
    }
    model_table = {c: steps.model.throughput(c) for c in usable}
    return PlannerView(table, dict(zip(usable, map(float, sds))), report, model_table)
