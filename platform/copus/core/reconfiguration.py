"""The adaptive loop's vocabulary: what the controller orders, what the workers did, and what a
switch costs.

- `SwitchOrder`: a switch as the controller decided it and sends it to rank 0 (the target
  configuration and why: the planner's figures at the decision).
- `Reconfiguration`: a switch as it happened (where in the run, from what to what, in place or
  by a restart, the reshard's figures, its measured downtime) with the order's reasons and, after
  the run, its audit (`EfficiencyAudit`: predicted against realized statistical efficiency).
- `SwitchCostBook`: what the next switch of each way costs, and the one rule by which a measured
  downtime updates it. The controller owns it; the driver keeps a copy in run_state.json for a
  relaunched controller.

Dicts appear only at the JSON edge: `as_dict` writes the shapes records.jsonl, run_state.json and
summary.json have always had, `from_dict` reads them back (keys it does not know are ignored, so
older files still load). Pure: no torch, no Ray.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

from copus.core.finite import finite_json
from copus.core.layout import CandidateConfig
from copus.core.planner import SwitchCosts, change_kind

# How a run makes a switch (`reconfigure`): in place, falling back to a restart when that fails
# (auto, after which the run restarts for every later change), in place or fail, or by a restart.
WAYS = ("auto", "in_place", "restart")
RESTART = "restart"


@dataclass(frozen=True)
class BranchRequest:
    """The controller asks every rank for a checkpoint at this step boundary, with no change: a
    probe (`copus.cluster.probes`) trains a branch from it at another GBS while the run goes on."""

    reason: str


@dataclass(frozen=True)
class SwitchOrder:
    """A switch the controller decided: the configuration to move to, what kind of change it is,
    what the planner expected of it and why."""

    config: CandidateConfig
    change: str  # change_kind(current, config): "layout", "mbs" or "gbs"
    cost_s: float  # the switching cost the planner charged
    reason: str
    b_noise: float | None = None  # the noise scale the decision saw
    predicted_gain: float | None = None  # goodput of the target over the current one, less 1
    predicted_goodput: float | None = None
    current_predicted_goodput: float | None = None
    predicted_throughput: float | None = None
    predicted_efficiency: float | None = None
    current_predicted_efficiency: float | None = None
    predicted_efficiency_gain: float | None = None  # SE(target) / SE(current)
    critical_batch: float | None = None
    val_loss: float | None = None  # the run's progress at the decision
    efficiency_source: str | None = None  # "configured" or the calibration's id
    way: str = "auto"  # how the workers make it (WAYS): the controller's SwitchCostBook.way
    rule: str | None = None  # the planner's decision rule (copus.core.planner)
    gain_low: float | None = None  # the gain at the rule's lower quantile
    gain_log_sd: float | None = None  # sd of the log goodput ratio it was read from
    transient_s: float | None = None  # of cost_s, the GBS change's transient
    horizon_s: float | None = None  # the rest of the run the cost was weighed over
    horizon_source: str | None = None  # "target" (off the validation curve) or "elapsed" (as long as the run so far)

    def reasons(self) -> dict[str, Any]:
        """Everything but the target, in order: what a reconfigure record carries beside `to`."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "config"}

    def as_dict(self) -> dict[str, Any]:
        return {"config": self.config.as_dict(), **self.reasons()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SwitchOrder:
        return cls(config=CandidateConfig.from_dict(data["config"]), **_known(cls, data, skip={"config"}))

    @classmethod
    def from_reasons(cls, config: CandidateConfig, data: dict[str, Any]) -> SwitchOrder | None:
        """The order behind a reconfigure record's reasons; None for a change nobody ordered
        (a scripted batch shape in tests, a record from before orders were kept)."""
        if not data or "reason" not in data:
            return None
        known = _known(cls, data, skip={"config"})
        return cls(config=config, **{"change": "", "cost_s": 0.0, **known})


@dataclass(frozen=True)
class EfficiencyAudit:
    """A GBS change's statistical efficiency after the run: the controller's prediction
    SE(new)/SE(old) against the realized progress per sample (`copus.core.audit`)."""

    predicted_efficiency_gain: float | None = None
    realized_efficiency_gain: float | None = None
    realized_efficiency_interval: list[float] | None = None  # 95%
    audit_points: dict | None = None  # {"before": n, "after": n}
    audit_note: str | None = None  # how it was estimated, or why not

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class Reconfiguration:
    """A switch as it happened, at a step boundary. `downtime_s` (decision to the start of the
    first step in the new configuration) arrives with the next step record; `audit` after the
    run. `record_lost`: the driver never got its record (the controller, which carries records,
    crashed with it queued) and took it from the workers' own list."""

    step: int
    samples: int
    wall_clock_s: float | None
    from_: CandidateConfig
    to: CandidateConfig
    in_place: bool
    fell_back: str | None = None  # why the in-place path failed, when it fell back to a restart
    reshard: dict | None = None  # the in-place reshard's figures (bytes moved, times)
    order: SwitchOrder | None = None
    downtime_s: float | None = None
    record_lost: bool = False
    audit: EfficiencyAudit | None = None

    @property
    def change(self) -> str:
        return change_kind(self.from_, self.to)

    @property
    def changes_gbs(self) -> bool:
        return self.from_.gbs != self.to.gbs

    def key(self) -> tuple[int, CandidateConfig]:
        """What identifies it in a run: the step and the target."""
        return self.step, self.to

    def measure_downtime(self, step_wall_clock_s: float, step_time_s: float) -> float:
        """The downtime, given the first step taken in the new configuration: from the decision
        at the step boundary to that step's start (its end on the run's clock less its time)."""
        self.downtime_s = step_wall_clock_s - step_time_s - (self.wall_clock_s or 0.0)
        return self.downtime_s

    def audited(self, audit: EfficiencyAudit) -> Reconfiguration:
        return replace(self, audit=audit)

    def as_dict(self) -> dict[str, Any]:
        """As run_state.json and summary.json list it."""
        order = self.order
        out = {
            "step": self.step,
            "samples": self.samples,
            "wall_clock_s": self.wall_clock_s,
            "from": self.from_.as_dict(),
            "to": self.to.as_dict(),
            "in_place": self.in_place,
            "fell_back": self.fell_back,
            "reshard": self.reshard,
            "predicted_gain": order.predicted_gain if order else None,
            "reason": order.reason if order else None,
            "b_noise": order.b_noise if order else None,
            "change": self.change,
            "downtime_s": self.downtime_s,
            "order": order.reasons() if order else None,  # the whole order; the three above predate it
        }
        if self.record_lost:
            out["record_lost"] = True
        if self.audit is not None:
            out.update(self.audit.as_dict())
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Reconfiguration:
        """From an entry of run_state.json or summary.json, or a reconfigure record's dict."""
        to = CandidateConfig.from_dict(data["to"])
        audit = EfficiencyAudit(**_known(EfficiencyAudit, data)) if "audit_note" in data else None
        return cls(
            step=data["step"],
            samples=data["samples"],
            wall_clock_s=data.get("wall_clock_s"),
            from_=CandidateConfig.from_dict(data["from"]),
            to=to,
            in_place=data["in_place"],
            fell_back=data.get("fell_back"),
            reshard=data.get("reshard"),
            order=SwitchOrder.from_reasons(to, data["order"] if "order" in data else data),
            downtime_s=data.get("downtime_s"),
            record_lost=bool(data.get("record_lost", False)),
            audit=audit,
        )


@dataclass(frozen=True)
class Relaunch:
    """A worker group stopped to be relaunched in another configuration (its stop reason is
    "reconfigure"): the configuration, and whether the in-place path had failed (then the run
    restarts for every later change)."""

    config: CandidateConfig
    fell_back: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {**self.config.as_dict(), "fell_back": self.fell_back}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Relaunch:
        return cls(CandidateConfig.from_dict(data), bool(data.get("fell_back", False)))


@dataclass
class SwitchCostBook:
    """What the next switch costs the way this run makes it, learned from the ones measured:
    configured estimates until a switch of the kind has been measured, then the last measured
    downtime. `way` is how the run reconfigures (in_place | restart | auto); it becomes
    "restart" for good once the in-place path fell back."""

    restart_cost_s: float
    in_place_cost_s: float
    way: str = "auto"

    def observe(self, change: Reconfiguration) -> None:
        """What a switch that happened says: once its in-place path fell back, the run restarts
        for every later change; once its downtime is measured, the next switch of its way costs
        the same (an in-place change of GBS or MBS is no layout reshard and says nothing of one)."""
        if change.fell_back:
            self.way = RESTART
        if change.downtime_s is None:
            return
        if not change.in_place:
            self.restart_cost_s = change.downtime_s
        elif change.change == "layout":
            self.in_place_cost_s = change.downtime_s

    def costs(self) -> SwitchCosts:
        """What the planner charges a switch. An MBS change in place only rebuilds the pipeline
        schedule; a restart costs the same whatever it changes."""
        if self.way == RESTART:
            return SwitchCosts(self.restart_cost_s, self.restart_cost_s)
        return SwitchCosts(self.in_place_cost_s, 0.0)

    def as_dict(self) -> dict[str, Any]:
        return {"restart_cost_s": self.restart_cost_s, "in_place_cost_s": self.in_place_cost_s, "reconfigure": self.way}


def reversed_switches(changes: list[dict], interval_s: float, clock: str) -> int:
    """Switches undone at the next decision: a change back to where the one before it came from,
    less than two decision intervals after it (the next decision comes one interval after a
    switch, plus its downtime). `changes`: dicts with "from", "to" and the time under `clock`
    ("t" in the simulator, "wall_clock_s" in a run's summary.json)."""
    undone = 0
    for a, b in zip(changes, changes[1:]):
        ta, tb = a.get(clock), b.get(clock)
        if ta is None or tb is None:
            continue
        if b["to"] == a["from"] and tb - ta < 2 * interval_s:
            undone += 1
    return undone


def order_from_decision(
    decision, b_noise: float, critical_batch: float, val_loss: float, source: str, way: str
) -> SwitchOrder:
    """The order for a planner's switch decision (`copus.core.planner.Decision`)."""
    best, current = decision.best, decision.current
    return SwitchOrder(
        config=decision.target,
        change=decision.kind,
        cost_s=decision.cost_s,
        reason=decision.reason,
        b_noise=finite_json(b_noise),
        predicted_gain=finite_json(decision.predicted_gain),
        predicted_goodput=best.goodput,
        current_predicted_goodput=current.goodput,
        predicted_throughput=best.throughput,
        predicted_efficiency=best.efficiency,
        current_predicted_efficiency=current.efficiency,
        predicted_efficiency_gain=_ratio(best.efficiency, current.efficiency),
        critical_batch=finite_json(critical_batch),
        val_loss=finite_json(val_loss),
        efficiency_source=source,
        way=way,
        rule=decision.rule,
        gain_low=finite_json(decision.gain_low),
        gain_log_sd=finite_json(decision.gain_log_sd),
        transient_s=finite_json(decision.transient_s),
        horizon_s=finite_json(decision.horizon.seconds) if decision.horizon is not None else None,
        horizon_source=decision.horizon.source if decision.horizon is not None else None,
    )


def _ratio(a: float, b: float) -> float | None:
    return finite_json(a / b) if b and math.isfinite(b) and b > 0 else None


def _known(cls, data: dict[str, Any], skip: set[str] = frozenset()) -> dict[str, Any]:
    names = {f.name for f in fields(cls)} - skip
    return {k: v for k, v in data.items() if k in names}
