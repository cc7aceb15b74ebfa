"""The Goodput controller: a named Ray actor per run that rank 0 reports to.

It is the run's record queue (the driver drains it for MLflow and progress, as it drains a
RunMonitor) and it keeps the history of what rank 0 reports every interval: GNS statistics,
step times, losses, samples seen. Every decision interval it asks the policy (through the
planner) for a decision; a switch waits in `pending` until rank 0 collects it at the next
step boundary (actor calls from one caller run in order, so a decision made on step N's
report is seen before step N + 1). Rank 0 broadcasts it to all ranks. The actor lives as long
as the driver's run, across worker-group relaunches; the driver keeps its snapshot in the
output directory for a driver restart.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import ray

from copus.cluster.controller_probes import ControllerProbes, ProbeNews
from copus.cluster.monitor import RecordQueue
from copus.cluster.probes import ProbeSource
from copus.core.decision_rule import critical_batch_log_sd, factor_log_sd_at
from copus.core.finite import finite_json
from copus.core.horizon import fit_window, rest_of_run
from copus.core.layout import CandidateConfig
from copus.core.planner import Decision, Planner, RuleSettings, SwitchCosts
from copus.core.policies import decide
from copus.core.probing import ProbeSettings
from copus.core.reconfiguration import (
    BranchRequest,
    Reconfiguration,
    SwitchCostBook,
    SwitchOrder,
    order_from_decision,
)
from copus.records import EvalRecord, ReconfigureRecord, StepRecord, parse_record
from copus.storage import Location


@dataclass(frozen=True, kw_only=True)
class ControllerSpec:
    policy: str
    throughputs: tuple[tuple[CandidateConfig, float], ...]  # memory-feasible search space, samples/s of each
    # the step-time model's samples/s of the same configurations (Planner.at_run_speed); None: no model
    model_throughputs: tuple[tuple[CandidateConfig, float], ...] | None = None
    b0: int  # reference GBS of the noise scale and the efficiency
    efficiency: str
    critical_factor: float
    threshold: float
    interval_s: float
    restart_cost_s: float  # estimates until a switch of the kind has been measured
    in_place_cost_s: float
    reconfigure: str = "auto"  # how workers change layout or MBS: in_place | restart | auto
    # Tests and benchmarks only: the noise scale the k-th decision sees (the last one repeats),
    # instead of the measured one.
    b_noise_script: tuple[float, ...] | None = None
    # The workload's calibration (`copus calibrate`), when one exists: the measured mapping from
    # noise scale and progress to efficiency, instead of the configured factor.
    calibration: dict | None = None
    # The controller measures c during the run (copus.cluster.probes); None: it does not.
    probes: ProbeSettings | None = None
    rule: RuleSettings = RuleSettings()  # how the planner decides to switch (copus.core.planner)
    target_loss: float | None = None  # the run's target validation loss: the rest of the run is read against it
    factor_log_sd: float = 0.69  # sd of log c without probes or a calibration (the prior's)

    def planner(self) -> Planner:
        return Planner.from_table(
            dict(self.throughputs),
            self.b0,
            self.efficiency,
            self.critical_factor,
            self.threshold,
            self.calibration,
            self.rule,
            dict(self.model_throughputs) if self.model_throughputs is not None else None,
        )


class Controller(RecordQueue):
    # What a restarted controller recovers from its state file (the profile is in its spec).
    HISTORY_KEPT = 5000
    EVALUATIONS_KEPT = 500

    def __init__(
        self, spec: ControllerSpec, state_path: Location | str | None = None, probe_source: ProbeSource | None = None
    ):
        """`state_path`: where the controller keeps its state (history, decisions, what switches
        cost, its belief about c) after every decision and every measured switch; a controller
        that finds it there (Ray restarted the actor after a crash, or the driver was run again)
        goes on from it. `probe_source`: what probes train from (with `spec.probes`)."""
        super().__init__()
        self.spec = spec
        self.base_planner = spec.planner()
        self.planner = self.base_planner
        on = spec.probes is not None and probe_source is not None
        self.probes = ControllerProbes(spec.probes, probe_source, spec.critical_factor) if on else None
        self.last_val_loss = float("nan")  # the run's progress, for a mapping that depends on it
        self.curve: list[tuple[float, float]] = []  # (samples, validation loss): the rest of the run is read off it
        # The one owner of what a switch costs: the planner charges it, measured switches update it.
        self.book = SwitchCostBook(spec.restart_cost_s, spec.in_place_cost_s, spec.reconfigure)
        self.history: list[dict] = []
        self.evaluations: list[dict] = []
        self.pending: SwitchOrder | None = None
        self.awaiting: Reconfiguration | None = None  # a switch whose downtime the next step gives
        self._interval_start: float | None = None
        self.restarts = 0
        self.state_path = Location.parse(state_path) if state_path else None
        if self.state_path is not None and self.state_path.is_file():
            self._recover(self.state_path.read_json())
        # Kept from the start: a controller restarted before its first decision finds a state too,
        # and counts the restart (nothing else to recover then).
        self._save()

    def _recover(self, saved: dict) -> None:
        self.history, self.evaluations = saved["history"], saved["evaluations"]
        self.book = SwitchCostBook(saved["restart_cost_s"], saved["in_place_cost_s"], saved["reconfigure"])
        self._interval_start = saved["interval_start"]
        self.pending = SwitchOrder.from_dict(saved["pending"]) if saved["pending"] else None
        self.restarts = saved["restarts"] + 1
        self.awaiting = Reconfiguration.from_dict(saved["awaiting"]) if saved.get("awaiting") else None
        self.last_val_loss = saved.get("last_val_loss") or float("nan")
        self.curve = [tuple(p) for p in saved.get("curve", [])]
        if self.probes is not None and saved.get("probes"):
            self.probes.recover(saved["probes"])
            self.planner = self.base_planner.with_critical_factor(self.probes.belief.factor)

    def _save(self) -> None:
        if self.state_path is None:
            return
        state = {
            "history": self.history[-self.HISTORY_KEPT :],
            "evaluations": self.evaluations[-self.EVALUATIONS_KEPT :],
            **self.book.as_dict(),
            "interval_start": self._interval_start,
            "restarts": self.restarts,
            "pending": self.pending.as_dict() if self.pending else None,
            "awaiting": self.awaiting.as_dict() if self.awaiting else None,
            "last_val_loss": finite_json(self.last_val_loss),
            "curve": self.curve[-self.EVALUATIONS_KEPT :],
            "probes": self.probes.state() if self.probes is not None else None,
        }
        self.state_path.write_json(state, indent=None)

    def _decision_b_noise(self, measured: float) -> float:
        script = self.spec.b_noise_script
        if script:
            return float(script[min(len(self.evaluations), len(script) - 1)])
        return measured

    def push(self, record: dict) -> None:
        """Take one of rank 0's records: learn from it, decide when an interval has passed, and
        hand it to the probes."""
        super().push(record)
        r = parse_record(record)
        if isinstance(r, EvalRecord):
            self.last_val_loss = float(r.val_loss)
            if r.samples is not None:
                self.curve.append((float(r.samples), float(r.val_loss)))
        elif isinstance(r, ReconfigureRecord):
            self.awaiting = r.reconfiguration()
            self._learn(self.awaiting)
        elif isinstance(r, StepRecord):
            if self.awaiting is not None:
                self.awaiting.measure_downtime(r.wall_clock_s, r.step_time_s)
                self._learn(self.awaiting)
                self.awaiting = None
            self._observe(r)
        if self.probes is not None:
            self._take(self.probes.on_record(r, self.history))

    def settle_probes(self, timeout_s: float) -> None:
        """The run ended: a probe still training gets `timeout_s` to finish, then whatever was
        measured is set against the run's curve as far as it went (summary.json's belief then has
        every probe the run paid for; its time to target is already taken)."""
        if self.probes is not None:
            self._take(self.probes.settle_run(timeout_s, self.history))

    def _take(self, news: ProbeNews) -> None:
        """The probes' records into the queue (the driver logs and prints them), the planner at
        the belief's c when a measurement came in."""
        for record in news.records:
            RecordQueue.push(self, record.as_dict())
        if news.factor is not None:
            self.planner = self.base_planner.with_critical_factor(news.factor)
        if news.save:
            self._save()

    def _learn(self, change: Reconfiguration) -> None:
        """A switch the workers made (the records rank 0 sends): what it says about the next."""
        self.book.observe(change)
        self._save()

    def _observe(self, r: StepRecord) -> None:
        """Keep the step in the history; once per decision interval (and no switch pending), ask
        the policy."""
        b_noise = float(r.b_noise) if r.b_noise is not None else float("nan")
        self.history.append(
            {
                "step": r.step,
                "samples": r.samples,
                "wall_clock_s": r.wall_clock_s,
                "step_time_s": r.step_time_s,
                "train_loss": r.train_loss,
                "b_noise": b_noise,
                "gbs": r.gbs,
                "config": r.config().label(),
            }
        )
        if self._interval_start is None:
            self._interval_start = r.wall_clock_s
        if self.pending is not None or r.wall_clock_s - self._interval_start < self.spec.interval_s:
            return
        self._interval_start = r.wall_clock_s
        self._evaluate(r, self._decision_b_noise(b_noise))
        self._save()

    def _evaluate(self, r: StepRecord, b_noise: float) -> None:
        """The policy's decision at this step: an evaluation in the history, and a pending switch
        when it says to switch."""
        context = self._decision_context(r, b_noise, self._factor_log_sd(r.samples or 0))
        planner = self._at_run_speed(self.planner, r)
        d = decide(self.spec.policy, planner, r.config(), b_noise, self.spec.interval_s, self.costs(), **context)
        entry = {"step": r.step, "wall_clock_s": r.wall_clock_s, "b_noise": b_noise}
        if d is None:
            self.evaluations.append({**entry, "switch": False, "reason": "nothing to decide"})
            return
        self.evaluations.append(
            {**entry, "switch": d.switch, "reason": d.reason, "current": d.current.as_dict(), "best": d.best.as_dict()}
            | finite_json({**d.figures(), **planner.run_speed_figures, "log_b_crit_sd": context["log_b_crit_sd"]})
        )
        if d.switch:  # what rank 0 collects: the target and why (the reconfigure record carries it)
            critical = self.planner.critical_batch(b_noise, self.last_val_loss)
            source = self.planner.mapping.source
            self.pending = order_from_decision(d, b_noise, critical, self.last_val_loss, source, self.book.way)
        elif self.probes is not None and self.probes.may_start(r.samples):
            probe = self.probes.consider(
                r, b_noise, self.base_planner, self._decide_at(r, b_noise), self.last_val_loss, self._run_speed()
            )
            if probe is not None:
                self.evaluations[-1]["probe"] = probe

    def _decide_at(self, r: StepRecord, b_noise: float):
        """The decision now with another planner (c set at one end of the belief: only the noise
        estimate's uncertainty is left)."""

        context = self._decision_context(r, b_noise, 0.0)  # the same whatever the planner: read once
        speed, measured = self._current_speed(r), self._measured()

        def decide_at(planner: Planner) -> Decision | None:
            planner = planner.at_run_speed(r.config(), speed, measured)
            return decide(self.spec.policy, planner, r.config(), b_noise, self.spec.interval_s, self.costs(), **context)

        return decide_at

    def _factor_log_sd(self, samples: float) -> float:
        """sd of log c now: the probes' belief (drifted to the present), a calibration's interval
        at the run's progress, else the prior's."""
        if self.probes is not None:
            return self.probes.factor_log_sd(samples)
        return factor_log_sd_at(self.planner.mapping, self.last_val_loss, self.spec.factor_log_sd)

    def _decision_context(self, r: StepRecord, b_noise: float, factor_log_sd: float) -> dict:
        """What the decision weighs besides the noise scale: the run's progress, the rest of the
        run (off the validation curve against the target, else as long as the run so far) and
        the critical batch's uncertainty (c's and the noise estimate's)."""
        horizon = rest_of_run(
            [p[0] for p in self.curve],
            [p[1] for p in self.curve],
            self.spec.target_loss,
            float(r.samples or 0),
            self._run_speed(),
            r.wall_clock_s,
            self.spec.interval_s,
            self.spec.rule.quantile_z,
            fit_window(self.spec.rule.horizon_points),
        )
        sd = critical_batch_log_sd(factor_log_sd) if math.isfinite(b_noise) else 0.0
        return {"loss": self.last_val_loss, "elapsed_s": r.wall_clock_s, "horizon": horizon, "log_b_crit_sd": sd}

    def _at_run_speed(self, planner: Planner, r: StepRecord) -> Planner:
        """`planner` reading the candidates at the run's own speed in its current configuration
        (`Planner.at_run_speed`), once the run has measured it."""
        return planner.at_run_speed(r.config(), self._current_speed(r), self._measured())

    def _current_speed(self, r: StepRecord) -> float:
        return current_speed(self.history, r.config().label(), self.spec.rule.run_speed_reading)

    def _measured(self) -> dict[CandidateConfig, float]:
        """Samples/s of each candidate the run has trained in (`measured_speeds`), by configuration;
        none without a band, the only rule that reads them (no walk of the history per decision)."""
        if self.spec.rule.run_speed_band is None:
            return {}
        by_label = {c.label(): c for c in self.planner.candidates}
        speeds = measured_speeds(self.history, self.spec.rule.run_speed_reading)
        return {by_label[k]: v for k, v in speeds.items() if k in by_label}

    def _run_speed(self, steps: int = 20) -> float:
        """The run's samples per second of training over its last `steps` steps (NaN unknown)."""
        recent = [h for h in self.history[-steps:] if h.get("step_time_s")]
        seconds = sum(h["step_time_s"] for h in recent)
        return sum(h["gbs"] for h in recent) / seconds if seconds > 0 else math.nan

    def decision(self) -> SwitchOrder | BranchRequest | None:
        """The switch decided since the last call, if any, or a request for a probe's branch
        checkpoint (rank 0, at a step boundary)."""
        out, self.pending = self.pending, None
        if out is not None:
            self._save()
            return out
        return self.probes.branch_order() if self.probes is not None else None

    def costs(self) -> SwitchCosts:
        return self.book.costs()

    def snapshot(self) -> dict:
        return {
            "restart_cost_s": self.book.restart_cost_s,
            "in_place_cost_s": self.book.in_place_cost_s,
            "restarts": self.restarts,
            "reconfigure": self.book.way,
            "decisions": len(self.evaluations),
            "steps_observed": len(self.history),
            "evaluations": self.evaluations[-200:],
            # The belief about c the probes built (copus.core.belief), with every measurement.
            **(self.probes.snapshot() if self.probes is not None else {"belief": None, "probes_started": []}),
            # Decisions that hung on c where a probe would not have paid for itself (copus.core.probing).
            "probes_declined": sum(1 for e in self.evaluations if e.get("probe", {}).get("worth") is False),
        }


# A configuration's speed is read once the run has taken this many steps in it, after the first
# few (the first steps after a switch pay for warming up: allocator, pipeline schedule, caches).
SPEED_MIN_STEPS = 10
SPEED_SETTLE_STEPS = 3
SPEED_MAX_STEPS = 50  # the latest steps read: the speed now, not the run's average


def current_speed(history: list[dict], label: str, reading: str = "median") -> float:
    """Samples/s of the configuration `label` over the run's latest unbroken stretch in it (its
    latest steps, the first `SPEED_SETTLE_STEPS` left out, read by `reading`: `_stretch_speed`);
    NaN before `SPEED_MIN_STEPS` such steps, or when the run is not in `label` now."""
    stretch = next(_stretches(history), [])
    return _stretch_speed(stretch, reading) if stretch and stretch[-1].get("config") == label else math.nan


def measured_speeds(history: list[dict], reading: str = "median") -> dict[str, float]:
    """Samples/s of every configuration the run has trained in long enough to read it, each over
    its latest unbroken stretch (as `current_speed`), by configuration label."""
    speeds: dict[str, float] = {}
    for stretch in _stretches(history):
        label = stretch[-1].get("config")
        if label not in speeds:
            speeds[label] = _stretch_speed(stretch, reading)
    return {label: v for label, v in speeds.items() if math.isfinite(v)}


def _stretches(history: list[dict]):
    """The run's unbroken stretches in one configuration, the latest first, each in step order and
    cut to the steps a speed reads (the settling ones and the latest `SPEED_MAX_STEPS`)."""
    stretch: list[dict] = []
    for h in reversed(history):
        if stretch and h.get("config") != stretch[-1].get("config"):
            yield stretch[::-1]
            stretch = []
        if len(stretch) < SPEED_SETTLE_STEPS + SPEED_MAX_STEPS:
            stretch.append(h)
    if stretch:
        yield stretch[::-1]


def _stretch_speed(stretch: list[dict], reading: str = "median") -> float:
    """GBS over the stretch's typical step time: the median (`policy.run_speed_reading: median`,
    deaf to a rare slow step), or the mean (`mean`: what the run pays, slow steps and all; pp2
    with four micro-batches on the emulated cluster read 0.12 s by the median and paid 0.16 s,
    its steps bimodal)."""
    times = [h["step_time_s"] for h in stretch[SPEED_SETTLE_STEPS:][-SPEED_MAX_STEPS:] if h.get("step_time_s")]
    if len(times) < SPEED_MIN_STEPS:
        return math.nan
    return stretch[-1]["gbs"] / (statistics.fmean(times) if reading == "mean" else statistics.median(times))


GoodputController = ray.remote(num_cpus=0)(Controller)
