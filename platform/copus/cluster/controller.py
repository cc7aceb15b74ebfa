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
from dataclasses import dataclass

import ray

from copus.cluster.monitor import RecordQueue
from copus.core.layout import CandidateConfig
from copus.core.planner import Decision, Planner, SwitchCosts
from copus.core.policies import decide
from copus.records import EvalRecord, StepRecord, parse_record
from copus.storage import Location


@dataclass(frozen=True)
class ControllerSpec:
    policy: str
    throughputs: tuple[tuple[CandidateConfig, float], ...]  # memory-feasible search space, samples/s of each
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

    def planner(self) -> Planner:
        return Planner.from_table(
            dict(self.throughputs), self.b0, self.efficiency, self.critical_factor, self.threshold, self.calibration
        )


class Controller(RecordQueue):
    # What a restarted controller recovers from its state file (the profile is in its spec).
    HISTORY_KEPT = 5000
    EVALUATIONS_KEPT = 500

    def __init__(
        self,
        spec: ControllerSpec,
        restart_cost_s: float | None = None,
        in_place_cost_s: float | None = None,
        reconfigure: str | None = None,
        state_path: Location | str | None = None,
    ):
        """The optional arguments carry what an earlier driver of the same run measured.
        `state_path`: where the controller keeps its state after every decision; a controller
        that finds it there (Ray restarted the actor after a crash, or the driver was run again)
        goes on from it."""
        super().__init__()
        self.spec = spec
        self.planner = spec.planner()
        self.last_val_loss = float("nan")  # the run's progress, for a mapping that depends on it
        self.restart_cost_s = spec.restart_cost_s if restart_cost_s is None else restart_cost_s
        self.in_place_cost_s = spec.in_place_cost_s if in_place_cost_s is None else in_place_cost_s
        self.reconfigure = reconfigure or spec.reconfigure
        self.history: list[dict] = []
        self.evaluations: list[dict] = []
        self.pending: dict | None = None
        self._interval_start: float | None = None
        self.restarts = 0
        self.state_path = Location.parse(state_path) if state_path else None
        if self.state_path is not None and self.state_path.is_file():
            self._recover(self.state_path.read_json())

    def _recover(self, saved: dict) -> None:
        self.history, self.evaluations = saved["history"], saved["evaluations"]
        self.restart_cost_s, self.in_place_cost_s = saved["restart_cost_s"], saved["in_place_cost_s"]
        self.reconfigure, self._interval_start = saved["reconfigure"], saved["interval_start"]
        self.pending, self.restarts = saved["pending"], saved["restarts"] + 1
        self.last_val_loss = saved.get("last_val_loss") or float("nan")

    def _save(self) -> None:
        if self.state_path is None:
            return
        state = {
            "history": self.history[-self.HISTORY_KEPT :],
            "evaluations": self.evaluations[-self.EVALUATIONS_KEPT :],
            "restart_cost_s": self.restart_cost_s,
            "in_place_cost_s": self.in_place_cost_s,
            "reconfigure": self.reconfigure,
            "interval_start": self._interval_start,
            "restarts": self.restarts,
            "pending": self.pending,
            "last_val_loss": _finite(self.last_val_loss),
        }
        self.state_path.write_json(state, indent=None)

    def _decision_b_noise(self, measured: float) -> float:
        script = self.spec.b_noise_script
        if script:
            return float(script[min(len(self.evaluations), len(script) - 1)])
        return measured

    def push(self, record: dict) -> None:
        super().push(record)
        r = parse_record(record)
        if isinstance(r, EvalRecord):
            self.last_val_loss = float(r.val_loss)
        elif isinstance(r, StepRecord):
            self._observe(r)

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
        d = decide(
            self.spec.policy,
            self.planner,
            r.config(),
            b_noise,
            self.spec.critical_factor,
            self.spec.interval_s,
            self.costs(),
            loss=self.last_val_loss,
        )
        entry = {"step": r.step, "wall_clock_s": r.wall_clock_s, "b_noise": b_noise}
        if d is None:
            self.evaluations.append({**entry, "switch": False, "reason": "nothing to decide"})
            return
        self.evaluations.append(
            {**entry, "switch": d.switch, "reason": d.reason, "current": d.current.as_dict(), "best": d.best.as_dict()}
        )
        if d.switch:
            self.pending = self._pending_switch(d, b_noise)

    def _pending_switch(self, d: Decision, b_noise: float) -> dict:
        """What rank 0 collects: the target configuration and why (the reconfigure record carries it)."""
        return {
            "config": d.target.as_dict(),
            "change": d.kind,
            "cost_s": d.cost_s,
            "reason": d.reason,
            "b_noise": b_noise if math.isfinite(b_noise) else None,
            "predicted_gain": d.predicted_gain if math.isfinite(d.predicted_gain) else None,
            "predicted_goodput": d.best.goodput,
            "current_predicted_goodput": d.current.goodput,
            "predicted_throughput": d.best.throughput,
            "predicted_efficiency": d.best.efficiency,
            "current_predicted_efficiency": d.current.efficiency,
            "predicted_efficiency_gain": _ratio(d.best.efficiency, d.current.efficiency),
            "critical_batch": _finite(self.planner.critical_batch(b_noise, self.last_val_loss)),
            "val_loss": _finite(self.last_val_loss),
            "efficiency_source": self.planner.mapping.source,
        }

    def decision(self) -> dict | None:
        """The switch decided since the last call, if any (rank 0, at a step boundary)."""
        out, self.pending = self.pending, None
        if out is not None:
            self._save()
        return out

    def costs(self) -> SwitchCosts:
        """What a switch costs the way this run makes it. An MBS change in place only rebuilds
        the pipeline schedule."""
        if self.reconfigure == "restart":
            return SwitchCosts(self.restart_cost_s, self.restart_cost_s)
        return SwitchCosts(self.in_place_cost_s, 0.0)

    def observed_downtime(self, seconds: float, in_place: bool, kind: str, fell_back: bool = False) -> None:
        """The driver measured a reconfiguration: the next one of its way costs the same. After
        an in-place change fell back to a restart, the run restarts for every later change."""
        if not in_place:
            self.restart_cost_s = seconds
        elif kind == "layout":
            self.in_place_cost_s = seconds
        if fell_back:
            self.reconfigure = "restart"
        self._save()

    def snapshot(self) -> dict:
        return {
            "restart_cost_s": self.restart_cost_s,
            "in_place_cost_s": self.in_place_cost_s,
            "restarts": self.restarts,
            "reconfigure": self.reconfigure,
            "decisions": len(self.evaluations),
            "steps_observed": len(self.history),
            "evaluations": self.evaluations[-200:],
        }


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _ratio(a: float, b: float) -> float | None:
    return _finite(a / b) if b and math.isfinite(b) and b > 0 else None


GoodputController = ray.remote(num_cpus=0)(Controller)
