"""The Goodput planner: score every candidate configuration, pick the best, decide whether a
switch is worth it.

    goodput(cfg) = throughput(cfg) [samples/s, from the step-time model] × SE(cfg.gbs)

SE from the current gradient noise scale through the run's efficiency mapping
(`copus.core.calibration`): the configured factor c × B_noise in the chosen form, or the
critical batch and efficiency curve a calibration measured, at the current loss.
A switch happens only when a candidate beats the current configuration by the threshold
(default 10 %) and its gain over the rest of the run outweighs the cost of getting there
(`SwitchCosts`): a change of GBS alone is made in place (cost ≈ 0); a change of MBS or layout
costs an in-place reshard or a worker-group restart, whichever the run uses (measured,
initially estimated). Switching is worth it when

    goodput_best × (horizon − cost) > goodput_current × horizon

where the horizon is the rest of the run, taken to be as long as the run so far (what a run of
unknown length has left, on average, once it has lasted that long; the probes' price uses the
same, `copus.core.probing`), and at least one decision interval. Counting one interval only
refused a move that repays its cost over the run however long the run had left (a 25 s reshard
4.4% ahead in a 600 s interval, a 440 s restart 275% ahead). Among the candidates that pass both
tests the planner takes the one with the most goodput net of its cost over the horizon.

Pure and vectorised: throughputs of all candidates are computed once per model, each
decision is a few numpy operations (well under a millisecond for thousands of candidates).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from copus.core.calibration import NoiseScaleMapping, mapping_from_calibration
from copus.core.efficiency import DEFAULT_CRITICAL_FACTOR
from copus.core.layout import CandidateConfig


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
    cost_s: float  # its switching cost
    predicted_gain: float  # best goodput / current goodput - 1
    reason: str

    @property
    def target(self) -> CandidateConfig:
        return self.best.config if self.switch else self.current.config


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
    ):
        """`mapping` (a `copus.core.calibration` mapping) turns the live noise scale into SE and a
        critical batch; by default c × B_noise in `form` with `critical_factor`."""
        if not candidates:
            raise ValueError("the search space has no feasible configuration")
        self.candidates = list(candidates)
        self.throughputs = np.asarray(throughput(self.candidates), dtype=float)
        self.gbs = np.array([c.gbs for c in self.candidates], dtype=float)
        self.index = {c: i for i, c in enumerate(self.candidates)}
        self.b0, self.form, self.critical_factor, self.threshold = b0, form, critical_factor, threshold
        self.mapping = mapping if mapping is not None else NoiseScaleMapping(form, critical_factor)

    @classmethod
    def from_table(
        cls,
        throughputs: dict[CandidateConfig, float],
        b0: int,
        form: str,
        critical_factor: float,
        threshold: float,
        calibration: dict | None = None,
    ) -> Planner:
        """The planner over a profiled search space ({config: samples/s}), with the calibrated
        efficiency mapping when a calibration of the workload exists, else c × B_noise in `form`.
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
        )

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
        net = goodput * np.clip(1.0 - cost / horizon_s, 0.0, None)
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
    ) -> Decision:
        """Whether to move from `current`, and where: the candidate with the most goodput over
        the horizon net of its switching cost (or the policy's `target`). `loss`: the run's
        progress (latest validation loss), for a mapping that depends on it. `elapsed_s`: the
        run's time so far, which sets the horizon (`repayment_horizon`)."""
        horizon = repayment_horizon(elapsed_s, interval_s)
        now = (
            self.score(current, b_noise, loss)
            if current in self.index
            else Scored(current, float("nan"), float("nan"), 0.0)
        )
        chosen_by_policy = target is not None  # a policy's own rule (cbs): no goodput criterion
        if target is None:
            target = self._target(current, now.goodput, b_noise, loss, horizon, costs, allowed)
        best = self.score(target, b_noise, loss)
        kind, cost = change_kind(current, best.config), costs.of(current, best.config)
        gain = float(_gain(best.goodput, now.goodput))
        if best.config == current:
            return Decision(now, best, False, kind, cost, 0.0, "current configuration is the best")
        if chosen_by_policy:  # a baseline's own rule (cbs: follow c x B_noise) is followed, not weighed
            return Decision(now, best, True, kind, cost, gain, "the policy's rule")
        if gain < self.threshold:
            return Decision(
                now, best, False, kind, cost, gain, f"gain {gain:.1%} below the {self.threshold:.0%} threshold"
            )
        if _falls_short(best.goodput, cost, now.goodput, horizon):
            return Decision(
                now,
                best,
                False,
                kind,
                cost,
                gain,
                f"gain {gain:.1%} does not repay a {cost:.1f} s reconfiguration within {horizon:.0f} s",
            )
        return Decision(now, best, True, kind, cost, gain, f"predicted goodput +{gain:.1%}")


def repayment_horizon(elapsed_s: float, interval_s: float) -> float:
    """The time a switch has to repay its cost in: the rest of the run, taken to be as long as
    the run so far, and at least one decision interval."""
    return max(interval_s, elapsed_s) if math.isfinite(elapsed_s) else interval_s


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
