"""The Goodput planner: score every candidate configuration, pick the best, decide whether a
switch is worth it.

    goodput(cfg) = throughput(cfg) [samples/s, from the step-time model] × SE(cfg.gbs)

SE from the current gradient noise scale through the run's efficiency mapping
(`copus.core.calibration`): the configured factor c × B_noise in the chosen form, or the
critical batch and efficiency curve a calibration measured, at the current loss.
Two switching rules (`policy.decision_rule`):

- **quantile** (the default): each candidate's gain is weighed at a lower quantile of what the
  planner knows of it (`copus.core.decision_rule`: the critical batch's uncertainty, from the
  belief on c, a calibration's interval or the prior, and the noise estimate's; the step-time
  model's held-out error), and the move is made when that pessimistic gain repays the move's
  full cost (a reshard or restart for another layout or MBS, the switch's transient for
  another GBS) over the rest of the run, which `copus.core.horizon` reads off the validation
  curve and the target (else as long as the run so far):

      goodput_current × e^(r − z·sd) × (horizon − cost) > goodput_current × horizon,

  and the pessimistic gain is at least `gain_floor` (0 by default). Among the moves that pass,
  the planner takes the one with the most pessimistic goodput over the horizon net of its cost;
  the test and the choice are one number, so no alternative shadows a move that passes.
- **threshold** (the rule before, kept for comparison): a candidate must beat the current
  goodput by `threshold` (10%) at the central estimate and repay its cost (a GBS change priced
  at 0) over the rest of the run taken as long as the run so far, at least one decision
  interval. Among those that pass, the most goodput net of its cost.

Pure and vectorised: throughputs of all candidates are computed once per model, each
decision is a few numpy operations (well under a millisecond for thousands of candidates).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Callable

import numpy as np

from copus.core.calibration import NoiseScaleMapping, mapping_from_calibration
from copus.core.decision_rule import (
    DEFAULT_PROFILE_POINT_LOG_SD,
    DEFAULT_QUANTILE_Z,
    DEFAULT_TRANSIENT_STEPS,
    pessimistic_log_gain,
    transient_depth,
)
from copus.core.efficiency import DEFAULT_CRITICAL_FACTOR
from copus.core.horizon import Horizon, elapsed_horizon
from copus.core.layout import CandidateConfig

RULES = ("quantile", "threshold")
RUN_SPEED_READINGS = ("median", "mean")


def check_run_speed_band(band: tuple[float, float]) -> tuple[float, float]:
    """`policy.run_speed_band` as given, or a ValueError saying what it must be: a factor of 1 (a
    run at its table's speed) has to lie inside it."""
    low, high = band
    if not (math.isfinite(low) and math.isfinite(high) and 0.0 < low <= 1.0 <= high):
        raise ValueError(f"expected [low, high] with 0 < low <= 1 <= high, got [{low:g}, {high:g}]")
    return (float(low), float(high))


def same_shape(a: CandidateConfig, b: CandidateConfig) -> bool:
    """Same replica and MBS: only the GBS differs, a change made in place."""
    return a.replica() == b.replica() and a.mbs == b.mbs


def change_kind(a: CandidateConfig, b: CandidateConfig) -> str:
    """What a move from a to b changes, the most expensive part: "layout" (another replica: layout,
    sharding or recomputation), "mbs", "gbs" or "none"."""
    if a.replica() != b.replica():
        return "layout"
    if a.mbs != b.mbs:
        return "mbs"
    return "gbs" if a.gbs != b.gbs else "none"


@dataclass(frozen=True)
class SwitchCosts:
    """Seconds of training a switch costs, by what it changes (a GBS change costs nothing)."""

    layout_s: float  # another (dp, tp, pp): an in-place reshard, or a worker-group restart
    mbs_s: float = 0.0  # another MBS in the same layout: a pipeline schedule rebuild, or a restart

    def of(self, a: CandidateConfig, b: CandidateConfig) -> float:
        return {"layout": self.layout_s, "mbs": self.mbs_s}.get(change_kind(a, b), 0.0)


@dataclass(frozen=True)
class Scored:
    config: CandidateConfig
    throughput: float  # samples/s predicted
    efficiency: float  # SE(gbs)
    goodput: float

    def as_dict(self) -> dict:
        return {
            "config": self.config.as_dict(),
            "throughput": self.throughput,
            "efficiency": self.efficiency,
            "goodput": self.goodput,
        }


@dataclass(frozen=True)
class Decision:
    current: Scored
    best: Scored
    switch: bool
    kind: str  # what the move changes: change_kind(current, best)
    cost_s: float  # its switching cost, the transient of a GBS change included
    predicted_gain: float  # best goodput / current goodput - 1
    reason: str
    rule: str = "threshold"
    gain_low: float | None = None  # the gain at the rule's lower quantile (quantile rule)
    gain_log_sd: float | None = None  # sd of log(best / current goodput) it was read from
    transient_s: float = 0.0  # of cost_s, the GBS change's transient
    horizon: Horizon | None = None  # the rest of the run the cost was weighed over

    def figures(self) -> dict:
        """What the decision weighed, for the controller's evaluations and the switch order."""
        return {
            "rule": self.rule,
            "predicted_gain": self.predicted_gain,
            "gain_low": self.gain_low,
            "gain_log_sd": self.gain_log_sd,
            "cost_s": self.cost_s,
            "transient_s": self.transient_s,
            **(self.horizon.as_dict() if self.horizon is not None else {}),
        }

    @property
    def target(self) -> CandidateConfig:
        return self.best.config if self.switch else self.current.config


@dataclass(frozen=True)
class RuleSettings:
    """How the planner decides to switch (module docstring). `throughput_log_sd`: per candidate,
    the relative sd of its predicted throughput (`copus.core.decision_rule.step_time_log_sd`), None
    for none; `transient_steps`: steps of the new GBS a switch's transient costs;
    `horizon_points`: the horizon's fit window (`copus.core.horizon.fit_window`); `read_run_speed`:
    whether a decision reads the candidates at the run's own speed (`Planner.at_run_speed`);
    `profile_point_log_sd`: the sd of log of a measured profile point against what a run in it
    pays, beyond a factor common to every point (what `at_run_speed` weighs a point against the
    model's prediction with); `run_speed_band`: (low, high), how far a run's speed may depart from
    the table through a cause every candidate shares (`Planner.at_run_speed`), None: no bound;
    `run_speed_reading`: how the run's speed in a configuration is read off its step times,
    "median" or "mean" (`copus.cluster.controller.current_speed`)."""

    rule: str = "quantile"
    quantile_z: float = DEFAULT_QUANTILE_Z
    gain_floor: float = 0.0
    transient_steps: float = DEFAULT_TRANSIENT_STEPS
    throughput_log_sd: dict | None = None
    horizon_points: int | None = None
    read_run_speed: bool = True
    profile_point_log_sd: float = DEFAULT_PROFILE_POINT_LOG_SD
    run_speed_band: tuple[float, float] | None = None
    run_speed_reading: str = "median"

    def __post_init__(self):
        if self.rule not in RULES:
            raise ValueError(f"policy.decision_rule: unknown rule {self.rule!r} (known: {', '.join(RULES)})")
        if self.run_speed_band is not None:
            check_run_speed_band(self.run_speed_band)
        if self.run_speed_reading not in RUN_SPEED_READINGS:
            raise ValueError(f"policy.run_speed_reading: expected one of {', '.join(RUN_SPEED_READINGS)}")


class Planner:
    def __init__(
        self,
        candidates: list[CandidateConfig],
        throughput: Callable[[list[CandidateConfig]], np.ndarray],
        b0: int,
        form: str = "pollux",
        critical_factor: float = DEFAULT_CRITICAL_FACTOR,
        threshold: float = 0.10,
        mapping=None,
        rule: RuleSettings = RuleSettings(rule="threshold"),
        model_throughput: Callable[[list[CandidateConfig]], np.ndarray] | None = None,
    ):
        """`mapping` (a `copus.core.calibration` mapping) turns the live noise scale into SE and a
        critical batch; by default c × B_noise in `form` with `critical_factor`. `threshold`: the
        threshold rule's; `rule`: which rule decides, and its settings. `model_throughput`: the
        step-time model's samples/s of each candidate, where `throughput` reads measured points
        (what `at_run_speed` scales); None: no model."""
        if not candidates:
            raise ValueError("the search space has no feasible configuration")
        self.candidates = list(candidates)
        self.throughputs = np.asarray(throughput(self.candidates), dtype=float)
        self.gbs = np.array([c.gbs for c in self.candidates], dtype=float)
        self.index = {c: i for i, c in enumerate(self.candidates)}
        self.b0, self.form, self.critical_factor, self.threshold = b0, form, critical_factor, threshold
        self.mapping = mapping if mapping is not None else NoiseScaleMapping(form, critical_factor)
        self.rule = rule
        sds = rule.throughput_log_sd or {}
        self.throughput_sd = np.array([float(sds.get(c, 0.0)) for c in self.candidates])
        self.model_throughputs = (
            np.asarray(model_throughput(self.candidates), dtype=float) if model_throughput is not None else None
        )
        # set by `at_run_speed`: the current configuration's run/table factor and the one carried to the others
        self.run_speed_figures: dict[str, float] = {}

    @classmethod
    def from_table(
        cls,
        throughputs: dict[CandidateConfig, float],
        b0: int,
        form: str,
        critical_factor: float,
        threshold: float,
        calibration: dict | None = None,
        rule: RuleSettings = RuleSettings(rule="threshold"),
        model: dict[CandidateConfig, float] | None = None,
    ) -> Planner:
        """The planner over a profiled search space ({config: samples/s}), with the calibrated
        efficiency mapping when a calibration of the workload exists, else c × B_noise in `form`;
        `model`: the step-time model's samples/s of the same configurations, if there is one.
        The one way a run, the controller and the simulator build their planner."""
        mapping = (
            mapping_from_calibration(calibration, b0, critical_factor)
            if calibration is not None
            else NoiseScaleMapping(form, critical_factor)
        )
        return cls(
            list(throughputs),
            lambda cfgs: [throughputs[c] for c in cfgs],
            b0,
            form,
            critical_factor,
            threshold,
            mapping,
            rule,
            (lambda cfgs: [model[c] for c in cfgs]) if model is not None else None,
        )

    def at_run_speed(
        self, current: CandidateConfig, samples_per_s: float, measured: dict[CandidateConfig, float] | None = None
    ) -> Planner:
        """The planner as a decision in `current` reads it once the run has measured its own speed
        there: `current` at `samples_per_s`, every other candidate at that speed times its ratio
        to `current` (`speed_ratios`).

        Why: a profile times a step 3-10% faster than a run pays for it, and one point can read
        20-30% fast (docs/profile.md, "What a run pays"). Read as they are, the current
        configuration at its profile point and a candidate at its own, that point decides the
        move: an outlier at the current configuration holds the run where it is. The run's own
        speed replaces the current figure and carries every candidate with it, so a profile off by
        one factor everywhere changes no choice. The same planner when the rule does not read the
        run's speed, without a model or a measured speed, or for a configuration outside the
        search space.

        With `rule.run_speed_band` (low, high), the factor carried to the others is bounded: a run
        that pays x0.5 of its table in one configuration (pp2 with four micro-batches on the
        emulated cluster, in one of two timing modes) is not evidence that every configuration
        got twice as slow. Beyond the band the departure is the configuration's own; the others
        read at the band's edge, and those the run has `measured` (samples/s, this run) at their
        own speed, so a move made on the bound is not undone by it."""
        if not (self.rule.read_run_speed and self.model_throughputs is not None and current in self.index):
            return self
        if not (math.isfinite(samples_per_s) and samples_per_s > 0):
            return self
        i = self.index[current]
        other = copy.copy(self)
        other.throughputs = samples_per_s * self.speed_ratios(i)
        own = samples_per_s / float(self.throughputs[i])
        other.run_speed_figures = {"run_speed_factor": own, "shared_speed_factor": own}
        if self.rule.run_speed_band is not None:
            low, high = self.rule.run_speed_band
            shared = other.run_speed_figures["shared_speed_factor"] = min(max(own, low), high)
            other.throughputs = self._with_measured(
                other.throughputs * (shared / own), i, samples_per_s, measured or {}
            )
        return other

    def _with_measured(self, read: np.ndarray, i: int, samples_per_s: float, measured: dict) -> np.ndarray:
        """`read` with the run's own speed in each configuration it has `measured`, and in the
        current one (`i`)."""
        out = read.copy()
        for cfg, speed in measured.items():
            j = self.index.get(cfg)
            if j is not None and math.isfinite(speed) and speed > 0:
                out[j] = speed
        out[i] = samples_per_s
        return out

    def speed_ratios(self, i: int) -> np.ndarray:
        """Each candidate's samples/s over candidate `i`'s, read in the source that has both: the
        step-time model's ratio, and where the profile measured both, the points' ratio too,
        weighed with the model's by precision (weight on the points: the model ratio's variance,
        sd_i² + sd_c² of its held-out error, over that plus the points', 2 sd_point², with sd_point
        `rule.profile_point_log_sd`). Neither a noisy point (where the model fits well) nor the
        model's misfit (where points are precise: one link per collective on a cluster whose
        groups span nodes unevenly put the 13B setting's current configuration 6% high, which read
        through the model alone held that run at GBS 16 for 59 hours) is carried into every
        candidate; an unmeasured candidate is read against the current one through the model,
        whose terms they share. Where the model's error is unknown, the model's ratio alone."""
        table, model = np.log(self.throughputs), np.log(self.model_throughputs)
        # a measured candidate's table figure is its point; an unmeasured one's, the model's own
        measured = ~np.isclose(table, model, rtol=0.0, atol=1e-12)
        model_var = self.throughput_sd**2 + self.throughput_sd[i] ** 2
        total = model_var + 2.0 * self.rule.profile_point_log_sd**2
        w = np.divide(model_var, total, out=np.ones_like(total), where=total > 0)  # both 0: the points
        both = measured & measured[i]
        w = np.where(both & ((model_var > 0) | (total == 0)), w, 0.0)
        return np.exp(w * (table - table[i]) + (1.0 - w) * (model - model[i]))

    def with_critical_factor(self, critical_factor: float) -> Planner:
        """The same planner with the configured mapping at another c (the controller's belief
        about c after its probes, `copus.core.belief`); its tables are shared, not rebuilt. A
        calibrated mapping has c per progress level of its own and is kept."""
        other = copy.copy(self)
        other.critical_factor = critical_factor
        if isinstance(self.mapping, NoiseScaleMapping):
            other.mapping = NoiseScaleMapping(self.form, critical_factor)
        return other

    def critical_batch(self, b_noise: float, loss: float = float("nan")) -> float:
        return self.mapping.critical_batch(b_noise, loss)

    def _efficiency(self, b_noise: float, loss: float = float("nan")) -> np.ndarray:
        se = self.mapping.efficiency(b_noise, loss, self.b0, self.gbs)
        # Before the noise scale is known, treat every batch size as equally efficient only at
        # B0 and let larger ones pay fully (SE = B0/B): no evidence, no credit.
        return np.where(np.isnan(se), np.minimum(1.0, self.b0 / self.gbs), se)

    def goodputs(self, b_noise: float, loss: float = float("nan")) -> np.ndarray:
        return self.throughputs * self._efficiency(b_noise, loss)

    def score(self, cfg: CandidateConfig, b_noise: float, loss: float = float("nan")) -> Scored:
        i = self.index[cfg]
        se = float(self._efficiency(b_noise, loss)[i])
        return Scored(cfg, float(self.throughputs[i]), se, float(self.throughputs[i]) * se)

    def best(
        self,
        b_noise: float,
        allowed: Callable[[CandidateConfig], bool] | None = None,
        by: str = "goodput",
        loss: float = float("nan"),
    ) -> Scored:
        """The best candidate by goodput (or by throughput alone), among `allowed` ones."""
        values = self.goodputs(b_noise, loss) if by == "goodput" else self.throughputs.copy()
        if allowed is not None:
            mask = np.array([allowed(c) for c in self.candidates])
            if not mask.any():
                raise ValueError("no candidate satisfies the policy's constraint")
            values = np.where(mask, values, -np.inf)
        return self.score(self.candidates[int(np.argmax(values))], b_noise, loss)

    def _target(
        self,
        current: CandidateConfig,
        now_goodput: float,
        b_noise: float,
        loss: float,
        horizon_s: float,
        costs: SwitchCosts,
        allowed: Callable[[CandidateConfig], bool] | None,
    ) -> CandidateConfig:
        """The candidate with the most goodput over the horizon net of its switching cost,
        among those that pass both tests of `decide` (the threshold and the repayment), or among
        all when none does (then `decide` says which test refused it).

        Why not simply the best by net goodput: a free move whose gain is below the threshold
        (another GBS in the same layout) can have more net goodput than a costlier move that clears
        both tests (another layout, 10.2% ahead, its 25 s cost 4% of a 600 s interval); picking
        it and then refusing it for the threshold kept the run where it was, so whether a move
        that satisfies the rule was made depended on an alternative that does not."""
        goodput = self.goodputs(b_noise, loss)
        cost = np.array([costs.of(current, c) for c in self.candidates])
        net = goodput * np.clip(1.0 - cost / max(horizon_s, 1e-9), 0.0, None)
        if allowed is not None:
            net = np.where([allowed(c) for c in self.candidates], net, -np.inf)
        passes = (_gain(goodput, now_goodput) >= self.threshold) & ~_falls_short(goodput, cost, now_goodput, horizon_s)
        passes &= np.isfinite(net)
        return self.candidates[int(np.argmax(np.where(passes, net, -np.inf) if passes.any() else net))]

    def decide(
        self,
        current: CandidateConfig,
        b_noise: float,
        interval_s: float,
        costs: SwitchCosts,
        allowed: Callable[[CandidateConfig], bool] | None = None,
        target: CandidateConfig | None = None,
        loss: float = float("nan"),
        elapsed_s: float = 0.0,
        horizon: Horizon | None = None,
        log_b_crit_sd: float = 0.0,
    ) -> Decision:
        """Whether to move from `current`, and where (or to the policy's `target`). `loss`: the
        run's progress (latest validation loss), for a mapping that depends on it. `horizon`: the
        rest of the run (`copus.core.horizon`); None: as long as `elapsed_s`, the run so far.
        `log_b_crit_sd`: the sd of the log critical batch the quantile rule weighs."""
        if horizon is None or self.rule.rule == "threshold":  # the threshold rule reads the run so far
            horizon = elapsed_horizon(elapsed_s, interval_s)
        now = (
            self.score(current, b_noise, loss)
            if current in self.index
            else Scored(current, float("nan"), float("nan"), 0.0)
        )
        if target is not None:  # a baseline's own rule (cbs: follow c x B_noise) is followed, not weighed
            best = self.score(target, b_noise, loss)
            kind, cost = change_kind(current, target), costs.of(current, target)
            if target == current:
                return Decision(now, best, False, kind, cost, 0.0, "current configuration is the best")
            return Decision(now, best, True, kind, cost, float(_gain(best.goodput, now.goodput)), "the policy's rule")
        if self.rule.rule == "quantile" and now.goodput > 0:
            return self._decide_quantile(now, b_noise, loss, horizon, costs, allowed, log_b_crit_sd)
        return self._decide_threshold(now, b_noise, loss, horizon, costs, allowed)

    def _decide_threshold(
        self, now: Scored, b_noise: float, loss: float, horizon: Horizon, costs: SwitchCosts, allowed
    ) -> Decision:
        """The threshold rule: `threshold` ahead at the central estimate, and repaying its cost
        (a GBS change free) over the horizon. Also where the current configuration is no
        candidate (its gain over nothing is infinite: the best that repays is taken)."""
        current, seconds = now.config, horizon.seconds
        best = self.score(self._target(current, now.goodput, b_noise, loss, seconds, costs, allowed), b_noise, loss)
        kind, cost = change_kind(current, best.config), costs.of(current, best.config)
        gain = float(_gain(best.goodput, now.goodput))
        decided = lambda switch, why: Decision(now, best, switch, kind, cost, gain, why, horizon=horizon)  # noqa: E731
        if best.config == current:
            return Decision(now, best, False, kind, cost, 0.0, "current configuration is the best", horizon=horizon)
        if gain < self.threshold:
            return decided(False, f"gain {gain:.1%} below the {self.threshold:.0%} threshold")
        if _falls_short(best.goodput, cost, now.goodput, seconds):
            return decided(
                False, f"gain {gain:.1%} does not repay a {cost:.1f} s reconfiguration within {seconds:.0f} s"
            )
        return decided(True, f"predicted goodput +{gain:.1%}")

    def _switch_seconds(self, current: CandidateConfig, costs: SwitchCosts) -> tuple[np.ndarray, np.ndarray]:
        """Per candidate, the full cost of moving there from `current` and its transient part:
        a reshard or restart by what changes, plus the transient of a GBS change, its steps
        (times the change's depth) at the candidate's step time."""
        moved = np.array([costs.of(current, c) for c in self.candidates])
        step_s = self.gbs / self.throughputs
        transient = self.rule.transient_steps * transient_depth(current.gbs, self.gbs) * step_s
        return moved + transient, transient

    def _decide_quantile(
        self,
        now: Scored,
        b_noise: float,
        loss: float,
        horizon: Horizon,
        costs: SwitchCosts,
        allowed,
        log_b_crit_sd: float,
    ) -> Decision:
        """The quantile rule (module docstring): the candidate whose pessimistic goodput over the
        horizon, net of its full cost, beats staying by the most; stay when none does."""
        current, z, seconds = now.config, self.rule.quantile_z, horizon.seconds
        i = self.index[current]
        log_gain = lambda g: np.log(g / g[i])  # noqa: E731
        r = log_gain(self.goodputs(b_noise, loss))
        r_low_b, r_high_b = r, r
        if log_b_crit_sd > 0 and math.isfinite(b_noise) and b_noise > 0 and z > 0:
            k = math.exp(z * log_b_crit_sd)
            r_low_b, r_high_b = log_gain(self.goodputs(b_noise / k, loss)), log_gain(self.goodputs(b_noise * k, loss))
        shared = np.array([same_shape(c, current) for c in self.candidates])
        t_sd = np.where(shared, 0.0, np.hypot(self.throughput_sd, self.throughput_sd[i]))
        r_low, r_sd = pessimistic_log_gain(r, r_low_b, r_high_b, t_sd, z)
        cost, transient = self._switch_seconds(current, costs)
        value = np.exp(r_low) * np.maximum(seconds - cost, 0.0)  # pessimistic goodput over the horizon, net
        ok = np.ones(len(self.candidates), bool) if allowed is None else np.array([allowed(c) for c in self.candidates])
        ok[i] = False
        passes = ok & (value > seconds) & (np.expm1(r_low) >= self.rule.gain_floor)
        j = int(np.argmax(np.where(passes, value, -np.inf))) if passes.any() else None
        shown = j if j is not None else (int(np.argmax(np.where(ok, value, -np.inf))) if ok.any() else i)
        best = self.score(self.candidates[shown], b_noise, loss)
        gain, low = float(np.expm1(r[shown])), float(np.expm1(r_low[shown]))
        figures = dict(rule="quantile", gain_low=low, gain_log_sd=float(r_sd[shown]), horizon=horizon)
        figures["transient_s"] = float(transient[shown])
        kind, c = change_kind(current, best.config), float(cost[shown])
        if j is not None:
            why = f"predicted goodput +{gain:.1%}, +{low:.1%} at the {self._quantile_name()}"
            return Decision(now, best, True, kind, c, gain, why, **figures)
        if shown == i:
            return Decision(now, best, False, kind, 0.0, 0.0, "current configuration is the best", **figures)
        if low < self.rule.gain_floor and value[shown] > seconds:
            why = f"gain {low:+.1%} at the {self._quantile_name()} below the {self.rule.gain_floor:.0%} floor"
        else:
            why = (
                f"gain {gain:+.1%} ({low:+.1%} at the {self._quantile_name()}) does not repay {c:.1f} s "
                f"within the {seconds:.0f} s left ({horizon.source})"
            )
        return Decision(now, best, False, kind, c, gain, why, **figures)

    def _quantile_name(self) -> str:
        """The lower quantile the rule reads the gain at, in words: "16% quantile" at z 1."""
        return f"{NormalDist().cdf(-self.rule.quantile_z):.0%} quantile"


def repayment_horizon(elapsed_s: float, interval_s: float) -> float:
    """The threshold rule's horizon in seconds (`copus.core.horizon.elapsed_horizon`)."""
    return elapsed_horizon(elapsed_s, interval_s).seconds


def _gain(goodput, now_goodput: float):
    """A move's relative goodput gain over staying (infinite when the current configuration has
    none); scalar or per candidate. The threshold test of `Planner.decide`."""
    if not now_goodput > 0:  # also NaN: the current configuration is not a candidate
        return np.full_like(np.asarray(goodput, dtype=float), np.inf)
    return np.asarray(goodput, dtype=float) / now_goodput - 1


def _falls_short(goodput, cost, now_goodput: float, horizon_s: float):
    """Whether a move's goodput over the horizon, net of its switching cost, fails to beat
    staying: the repayment test of `Planner.decide`; scalar or per candidate."""
    return np.asarray(goodput, dtype=float) * np.maximum(horizon_s - np.asarray(cost), 0.0) <= now_goodput * horizon_s
