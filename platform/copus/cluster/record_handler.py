"""The driver's side of rank 0's records: MLflow, OUTPUT_DIR/records.jsonl, the run's state and
its live progress lines, one method per record kind."""

from __future__ import annotations

import json
import time

from copus.cluster.driver_run import DriverRun
from copus.cluster.progress import progress_line, reconfiguration_line
from copus.cluster.run_state import RECORDS_LOG, save_run_state
from copus.core.reconfiguration import Reconfiguration
from copus.records import (
    CheckpointRecord,
    CheckpointRefusedRecord,
    EndRecord,
    EvalRecord,
    NonfiniteRecord,
    ProbeRecord,
    ReconfigureRecord,
    StartRecord,
    StepRecord,
    parse_record,
)
from copus.storage import AppendLog

PRINT_EVERY_S = 5.0


class RecordHandler:
    """The driver's side of rank 0's records, called with each batch of them as they arrive
    (`fit_and_drain`). Every record goes to MLflow and OUTPUT_DIR/records.jsonl as it came, then
    to the method of its kind, `on_<kind>`, which keeps the run's state and prints progress;
    the run state is saved after each batch."""

    def __init__(self, run: DriverRun, controller):
        self.run, self.controller = run, controller
        self.log = AppendLog(run.out / RECORDS_LOG)
        self.cursor: tuple[str | None, int] = (None, 0)  # how far the controller's queue was drained
        self.final: EndRecord | None = None  # this launch's end record
        self.starts = 0  # worker-group starts in this launch (a second one: Ray Train restarted a failed group)
        self.last_step = 0
        self.last_val: float | None = None  # the latest validation loss, shown on step lines
        self.val_curve: list[tuple[float, float]] = []  # (samples, validation loss): the ETA to the target
        self.last_print = 0.0  # time.time() of the last step line
        self.awaiting: Reconfiguration | None = None  # a reconfiguration whose downtime the next step record gives

    def new_launch(self) -> None:
        self.final, self.starts = None, 0

    def close(self) -> None:
        self.log.close()

    def __call__(self, records: list[dict]) -> None:
        run = self.run
        run.tracker.log_records(run.run_id, records)
        for raw in records:
            self.log.write(json.dumps(raw) + "\n")
            record = parse_record(raw)
            handle = getattr(self, f"on_{record.kind}", None)  # profiling records never come here
            if handle is not None:
                handle(record)
        self.log.flush()
        run.state.elapsed_s = time.time() - run.clock_origin
        save_run_state(run.out, run.state)

    def on_start(self, r: StartRecord) -> None:
        self.starts += 1
        if self.starts == 1:
            return
        # Ray Train restarted a failed worker group within this launch.
        lost = max(self.last_step - r.step, 0)
        self.run.state.worker_failures.append(
            {
                "wall_clock_s": r.wall_clock_s,
                "resumed_at_step": r.step,
                "last_step_before": self.last_step,
                "steps_lost": lost,
            }
        )
        self.run.echo(
            f"[{r.wall_clock_s:.0f} s] a worker failed: Ray Train restarted the worker group, "
            f"resumed from the checkpoint at step {r.step} in "
            f"dp{r.layout['dp']}-tp{r.layout['tp']}-pp{r.layout['pp']} ({lost} steps to redo)"
        )

    def on_step(self, r: StepRecord) -> None:
        self.last_step = r.step
        if self.awaiting is not None:
            self._measure_downtime(r)
        # At most one step line per PRINT_EVERY_S (and every validation): readable on any speed.
        if time.time() - self.last_print >= PRINT_EVERY_S:
            self.run.echo(progress_line(r, self.run.plan.stop, self.last_val, self.val_curve))
            self.last_print = time.time()

    def _measure_downtime(self, r: StepRecord) -> None:
        """A reconfiguration's downtime (`Reconfiguration.measure_downtime`). The controller, which
        sees the same records, prices the next switch by it."""
        change, self.awaiting = self.awaiting, None
        change.measure_downtime(r.wall_clock_s, r.step_time_s)
        run = self.run
        run.tracker.log_values(run.run_id, {"reconfiguration_downtime_s": change.downtime_s}, step=change.step)
        run.echo(f"  downtime {change.downtime_s:.1f} s")

    def on_eval(self, r: EvalRecord) -> None:
        self.last_val = r.val_loss
        if r.samples is not None:
            self.val_curve.append((float(r.samples), r.val_loss))
        self.run.echo(progress_line(r, self.run.plan.stop, self.last_val))

    def on_checkpoint(self, r: CheckpointRecord) -> None:
        """Its time is an MLflow metric; nothing more to do."""

    def on_checkpoint_refused(self, r: CheckpointRefusedRecord) -> None:
        self.run.echo(
            f"warning: checkpoint {r.path} refused ({r.reason}); resuming from the newest complete one before it"
        )

    def on_nonfinite(self, r: NonfiniteRecord) -> None:
        self.run.echo(
            f"warning: step {r.step}: non-finite loss {r.train_loss} or gradient norm {r.grad_norm}: update "
            f"skipped ({r.consecutive} in a row, {r.nonfinite_steps} in this run)"
        )

    def on_reconfigure(self, r: ReconfigureRecord) -> None:
        change = r.reconfiguration()
        run = self.run
        run.state.reconfigurations.append(change)
        self.awaiting = change
        if change.in_place:  # the run goes on in the new configuration: a resumed driver must know it
            run.state.current = change.to.as_dict()
        if change.order is not None and change.order.predicted_gain is not None:
            run.tracker.log_values(run.run_id, decision_metrics(change.order), step=change.step)
        run.echo(reconfiguration_line(change))

    def on_probe(self, r: ProbeRecord) -> None:
        """The controller measured c with a probe: say what it found and where its belief is now."""
        gain = (
            "unmeasurable"
            if r.probe_gain is None
            else f"gain {r.probe_gain:.2f} [{r.probe_gain_low:.2f}, {r.probe_gain_high:.2f}]"
        )
        self.run.echo(
            f"[{r.wall_clock_s:.0f} s] probe at GBS {r.probe_gbs} from {r.start_samples} samples (run at GBS "
            f"{r.run_gbs}; {r.probe_time_s:.1f} s of training beside the run): {gain}; critical-batch factor now "
            f"{r.belief_c:.2f} [{r.belief_c_low:.2f}, {r.belief_c_high:.2f}]"
        )

    def on_end(self, r: EndRecord) -> None:
        self.final = r


def decision_metrics(order) -> dict[str, float]:
    """The figures a switch was decided on, as MLflow metrics at its step: the predicted gain, its
    lower quantile, the full cost (the transient included) and the rest of the run it was weighed
    over (the quantile rule's; the threshold rule has only the gain and the cost)."""
    figures = {
        "predicted_goodput_gain": order.predicted_gain,
        "predicted_goodput_gain_low": order.gain_low,
        "switch_cost_s": order.cost_s,
        "switch_transient_s": order.transient_s,
        "switch_horizon_s": order.horizon_s,
    }
    return {k: float(v) for k, v in figures.items() if v is not None}
