"""The controller's probe side: what the Goodput controller does about probes, behind a narrow
entry, so that its main line (take a record, learn, decide) reads on one screen.

`ControllerProbes` is the run's `Probes` (copus.cluster.probes: the Ray task, the belief about c)
with the controller's part of them:
- `on_record`: every record the controller takes goes here after the controller has learnt from
  it. A branch checkpoint starts the probe asked for; a step collects a finished probe and, once
  the run's own curve is as long, measures it. It answers with a `ProbeNews`: the probe records
  to queue, the belief's new c for the planner, and whether the state must be saved.
- `consider`: after a decision that did not switch, whether the decision hangs on c and a probe
  pays for itself (copus.core.probing), given how the controller would decide at any c
  (`decide_at`). It answers with the evaluation's `probe` entry, or None.
- `settle_run`, `factor_log_sd`, `branch_order`, `snapshot`: the run's end, the sd of log c the
  decision reads, the branch checkpoint to ask rank 0 for, and what summary.json shows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from copus.cluster.probes import NO_DEVICE_FOR_PROBE, Probes
from copus.core.layout import CandidateConfig
from copus.core.planner import Planner
from copus.core.policies import Decision
from copus.core.probing import decision_stake, probe_gbs, probe_length, probe_value
from copus.core.reconfiguration import BranchRequest
from copus.records import CheckpointRecord, ProbeRecord, Record, StepRecord


@dataclass
class ProbeNews:
    """What a record meant for the probes: records to queue (the driver logs and prints them),
    the belief's c when a measurement came in, and whether the controller's state changed."""

    records: list[ProbeRecord] = field(default_factory=list)
    factor: float | None = None
    save: bool = False


class ControllerProbes(Probes):
    def on_record(self, r: Record, history: list[dict]) -> ProbeNews:
        """A branch checkpoint asked for is written: the probe starts from it. A step: a probe that
        finished (or failed), and once the run's own curve is as long, its measurement."""
        if isinstance(r, CheckpointRecord) and r.branch:
            last = history[-1] if history else {}
            started = self.launch(r.step, r.samples or 0, int(last.get("gbs") or 0), r.wall_clock_s)
            return ProbeNews([started] if started is not None else [], save=True)
        if isinstance(r, StepRecord):
            return self._progress(history, r.step, r.wall_clock_s, ended=False)
        return ProbeNews()

    def settle_run(self, timeout_s: float, history: list[dict]) -> ProbeNews:
        """The run ended: a probe still training gets `timeout_s` to finish, then whatever was
        measured is set against the run's curve as far as it went."""
        if not history:
            return ProbeNews()
        self.settle(timeout_s)
        news = self._progress(history, history[-1]["step"], history[-1]["wall_clock_s"], ended=True)
        news.save = True
        return news

    def _progress(self, history: list[dict], step: int, wall_clock_s: float, ended: bool) -> ProbeNews:
        collected = self.collect(step, wall_clock_s)
        news = ProbeNews([collected] if collected is not None else [])
        measured = self.measure(history, step, wall_clock_s, ended=ended)
        if measured is not None:
            news.records.append(measured)
            news.factor, news.save = self.belief.factor, True
        return news

    def factor_log_sd(self, samples: float) -> float:
        """sd of log c now: the belief, drifted to the present."""
        return self.belief.drifted(samples, self.settings.drift_sd).sd

    def consider(
        self,
        r: StepRecord,
        b_noise: float,
        base_planner: Planner,
        decide_at: Callable[[Planner], Decision | None],
        loss: float,
        run_speed: float,
    ) -> dict | None:
        """Probe when the decision hangs on c (at the belief's low and high quantiles of c the
        policy would leave the run at different GBS) and the probe pays for itself; the
        evaluation's `probe` entry saying so (or why not), None when the decision does not hang
        on c. `decide_at(planner)`: the controller's decision with that planner."""
        belief = self.belief.drifted(r.samples, self.settings.drift_sd)
        planners, actions = [], []
        for c in belief.interval(self.settings.quantile_z):
            planner = base_planner.with_critical_factor(c)
            d = decide_at(planner)
            if d is None:
                return None
            planners.append(planner)
            actions.append(d.best.config if d.switch else r.config())  # where the run would be after it
        gbs = probe_gbs(r.gbs, actions[0].gbs, actions[1].gbs)
        if gbs is None:
            return None
        stake = decision_stake(
            tuple(_goodput(p, a, b_noise, loss) for p, a in zip(planners, actions)),
            tuple(_goodput(p, a, b_noise, loss) for p, a in zip(planners, reversed(actions))),
        )
        length = probe_length(self.settings, r.samples, gbs, r.gbs)
        value = probe_value(self.settings, stake, r.wall_clock_s, length, run_speed)
        entry = {"gbs": gbs, **value.as_dict()}
        if value.worth and not self.device_free():
            entry["not_started"] = NO_DEVICE_FOR_PROBE
        elif value.worth:
            self.want(gbs, b_noise)
        return entry

    def branch_order(self) -> BranchRequest | None:
        """The branch checkpoint to ask rank 0 for (once per probe)."""
        return BranchRequest(f"probe at GBS {self.wanted}") if self.branch_request() else None

    def snapshot(self) -> dict:
        return {"belief": self.belief.as_dict(), "probes_started": list(self.started)}


def _goodput(planner: Planner, config: CandidateConfig, b_noise: float, loss: float) -> float:
    try:
        return planner.score(config, b_noise, loss).goodput
    except KeyError:  # not a candidate of the planner's
        return math.nan
