"""The driver: config in, a Ray Train run, MLflow and summary.json out.

It starts (or joins, via RAY_ADDRESS) a Ray cluster and launches a TorchTrainer with one
worker per rank. Rank 0 reports to the run's Goodput controller actor (a RecordQueue plus the
policy's decisions; a plain RunMonitor for the static policy), which the driver drains while
training runs (live progress and MLflow). A change of GBS, MBS or layout is made by the
workers in place (`reconfigure: auto` or `in_place`: the ranks reshard model and optimiser
among themselves). With `reconfigure: restart`, or when the in-place path fails under `auto`,
the worker group ends instead (checkpoint, return) and the driver relaunches the TorchTrainer
in the new configuration under the same Ray run, so the workers resume from that checkpoint,
resharded, at the same sample; after such a fallback the run restarts for every later change.
Each reconfiguration is logged with its measured downtime. OUTPUT_DIR/summary.json is written at the end; a relaunch of the
command with the same output_dir resumes (in the configuration the run had reached).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import ray
from ray.train import CheckpointConfig, FailureConfig, RunConfig

from copus.cluster.calibrate import calibration_path, load_calibration
from copus.cluster.controller import ControllerSpec, GoodputController
from copus.cluster.launch import ensure_ray, fit_and_drain, make_trainer, prepare_plan
from copus.cluster.monitor import RunMonitor
from copus.cluster.profiler import feasible_space, load_or_profile, predicted_throughputs
from copus.cluster.progress import progress_line, reconfiguration_line, summary_text
from copus.cluster.run_state import (
    CONTROLLER_STATE,
    FAULT_MARKERS,
    RECORDS_LOG,
    RunState,
    clear_run,
    load_run_state,
    resume_config,
    resume_key,
    save_run_state,
)
from copus.cluster.worker import gns_worker, train_worker
from copus.config import ConfigError, ExperimentConfig
from copus.core.layout import CandidateConfig
from copus.core.planner import change_kind
from copus.core.policies import initial_config
from copus.records import (
    CheckpointRecord,
    CheckpointRefusedRecord,
    EndRecord,
    EvalRecord,
    NonfiniteRecord,
    ReconfigureRecord,
    StartRecord,
    StepRecord,
    parse_record,
)
from copus.storage import RAY_RUN_NAME, AppendLog, Location, StorageError, ray_storage, ray_storage_args, read_lines
from copus.tracking import Tracker, flatten, results_name
from copus.train.faults import Faults, FaultSpecError, faults_from_env
from copus.train.plan import WorkerPlan
from workloads.corpus import TokenFiles

if TYPE_CHECKING:
    from ray.train.torch import TorchTrainer

PRINT_EVERY_S = 5.0
SAMPLE_IDS_ENV = "COPUS_RECORD_SAMPLE_IDS"  # "1": step records carry the global batch's sample ids


def measure_experiment_gns(cfg: ExperimentConfig, steps: int) -> dict:
    """`copus gns`: B_noise at the experiment's initial weights, measured on its Ray workers."""
    _, plan = prepare_plan(cfg)
    ensure_ray(cfg)
    with tempfile.TemporaryDirectory(prefix="copus-gns-") as storage:
        result = make_trainer(
            cfg,
            gns_worker,
            {"plan": plan, "steps": steps},
            RunConfig(name="gns", storage_path=storage, failure_config=FailureConfig(max_failures=0)),
        ).fit()
    return result.return_value


def controller_setup(
    cfg: ExperimentConfig,
    echo: Callable[[str], None],
    b_noise_script: tuple | None = None,
    data_fingerprint: str | None = None,
) -> tuple[ControllerSpec, CandidateConfig]:
    """The controller's inputs (profile table → step-time model, memory-feasible search
    space, the workload's calibration when one exists) and the policy's starting
    configuration. Profiles first when no table exists. B0 of the efficiency and of the noise
    scale is optimizer.reference_gbs, the GBS the base LR is right for."""
    table, model = load_or_profile(cfg, echo)
    throughputs = predicted_throughputs(table, model, feasible_space(cfg, table))
    calibration = load_calibration(cfg, data_fingerprint) if data_fingerprint is not None else None
    if calibration is not None:
        levels = ", ".join(f"{_fmt(b['b_crit'])} at val loss {b['val_loss']:.2f}" for b in calibration["branch_points"])
        echo(
            f"efficiency from the calibration {calibration_path(cfg, data_fingerprint).name} (measured critical "
            f"batch {levels})"
        )
    b0 = cfg.optimizer.reference_gbs
    spec = ControllerSpec(
        cfg.policy.name,
        tuple(throughputs.items()),
        b0,
        cfg.policy.efficiency,
        cfg.gns.critical_factor,
        cfg.policy.threshold,
        cfg.policy.interval_s,
        cfg.policy.restart_cost_s,
        cfg.policy.in_place_cost_s,
        cfg.reconfigure,
        b_noise_script,
        calibration,
    )
    return spec, initial_config(cfg.policy.name, spec.planner(), cfg.start_config(), cfg.policy.layout)


def run_label(cfg: ExperimentConfig, start: CandidateConfig) -> str:
    """A run's default MLflow name: what tells it apart from other runs of the experiment."""
    return f"{cfg.name} {cfg.policy.name} gbs{start.gbs} dp{start.dp}-tp{start.tp}-pp{start.pp} mbs{start.mbs}"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


@dataclass
class DriverRun:
    """What the launches of one run share: its inputs, its state in the output directory
    (run_state.json), its MLflow run, and the configuration the next launch trains in."""

    cfg: ExperimentConfig
    out: Location  # the output directory: a path or an object-store URI (copus.storage)
    tokens: TokenFiles
    plan: WorkerPlan
    faults: Faults
    record_sample_ids: bool  # step records carry the global batch's sample ids (SAMPLE_IDS_ENV)
    state: RunState
    spec: ControllerSpec | None  # None: a static run, without a controller
    start: CandidateConfig
    current: CandidateConfig
    tracker: Tracker
    echo: Callable[[str], None]
    run_id: str = ""
    clock_origin: float = 0.0  # time.time() at which the run (all its launches) started


def run_experiment(
    cfg: ExperimentConfig,
    fresh: bool = False,
    echo: Callable[[str], None] = print,
    b_noise_script: tuple | None = None,
    parent_run_id: str | None = None,
) -> dict:
    """`copus train`: the experiment as one run of one or more worker-group launches; returns
    its summary (also OUTPUT_DIR/summary.json)."""
    run = open_run(cfg, fresh, echo, b_noise_script)
    start_tracking(run, parent_run_id)
    controller = start_controller(run)
    run.clock_origin = time.time() - run.state.elapsed_s
    handler = RecordHandler(run, controller)
    try:
        final = launch_until_done(run, controller, handler)
        controller_state = ray.get(controller.snapshot.remote()) if run.spec is not None else None
    finally:
        ray.kill(controller)
        handler.close()
    add_lost_reconfigurations(run.state, final)
    run.state.reconfigurations = audit_changes(
        run.out, run.state.reconfigurations, cfg.schedule.warmup_samples, run.tracker, run.run_id, echo
    )
    return finish_run(run, final, controller_state)


def open_run(
    cfg: ExperimentConfig, fresh: bool, echo: Callable[[str], None], b_noise_script: tuple | None
) -> DriverRun:
    """Check the inputs (a bad one is refused before Ray starts), open the output directory's
    run state, start Ray and set up the controller's inputs."""
    try:
        out = cfg.resolved_output_dir()
    except StorageError as err:
        raise ConfigError(f"output_dir: {err}") from None
    tokens, plan = prepare_plan(cfg)
    try:
        faults = faults_from_env(out / FAULT_MARKERS, cfg.cluster.num_workers)
    except FaultSpecError as err:
        raise ConfigError(str(err)) from None
    if fresh:
        clear_run(out)
    out.mkdir()
    state = load_run_state(out, resume_key(cfg, tokens.fingerprint))
    ensure_ray(cfg)
    spec, start = (
        controller_setup(cfg, echo, b_noise_script, tokens.fingerprint) if cfg.adaptive else (None, cfg.start_config())
    )
    current, moved = resume_config(state.current, start)
    if moved:
        echo(moved)
    return DriverRun(
        cfg=cfg,
        out=out,
        tokens=tokens,
        plan=plan,
        faults=faults,
        record_sample_ids=os.environ.get(SAMPLE_IDS_ENV) == "1",
        state=state,
        spec=spec,
        start=start,
        current=current,
        tracker=Tracker(cfg.resolved_tracking_uri(), cfg.tracking.experiment, warn=echo),
        echo=echo,
    )


def start_tracking(run: DriverRun, parent_run_id: str | None) -> None:
    """The run's MLflow run: a new one, or the one an earlier driver of the same output
    directory started."""
    cfg, state, current, tracker = run.cfg, run.state, run.current, run.tracker
    if state.mlflow_run_id is None:
        params = flatten(cfg.model_dump(mode="json"))
        params.update({"data.fingerprint": run.tokens.fingerprint, "data.description": run.tokens.description})
        state.mlflow_run_id = tracker.start_run(
            cfg.tracking.run_name or run_label(cfg, current),
            params,
            {
                "policy": cfg.policy.name,
                "layout": f"dp{current.dp}-tp{current.tp}-pp{current.pp}",
                "copus.output_dir": str(run.out),
            },
            parent_run_id,
        )
        tracker.log_dict(state.mlflow_run_id, cfg.model_dump(mode="json"), "config.json")
    else:
        tracker.resume_run(state.mlflow_run_id)
        run.echo(
            f"resuming run in {run.out} (launch {state.launches + 1}, {state.elapsed_s:.1f} s already spent, "
            f"{current.label()})"
        )
    run.run_id = state.mlflow_run_id
    state.current = current.as_dict()
    save_run_state(run.out, state)


def start_controller(run: DriverRun):
    """The actor rank 0 reports to: the Goodput controller, or a plain record queue for a static
    run. It outlives every worker group of this run, so its history and restart-cost estimate
    carry over relaunches. Ray restarts a controller that crashes (max_restarts); it recovers its
    state from CONTROLLER_STATE, which it rewrites after every decision."""
    if run.spec is None:
        return RunMonitor.remote()
    s = run.state
    return GoodputController.options(name=f"copus-controller-{run.run_id}", max_restarts=-1).remote(
        run.spec, s.restart_cost_s, s.in_place_cost_s, s.reconfigure, run.out / CONTROLLER_STATE
    )


def launch_until_done(run: DriverRun, controller, handler: RecordHandler) -> EndRecord:
    """Launch worker groups, one after the other, until one stops for another reason than to
    restart in a new configuration; returns its end record."""
    while True:
        run.state.launches += 1
        save_run_state(run.out, run.state)
        trainer = launch_trainer(run, controller)
        run.echo(
            f"training {run.cfg.workload.model} on {run.cfg.cluster.num_workers} Ray workers "
            f"({run.current.label()}, policy {run.cfg.policy.name}); MLflow run {run.run_id}"
        )
        handler.new_launch()
        outcome = fit_and_drain(trainer, controller, handler, handler.cursor)
        handler.cursor = outcome["cursor"]
        if "error" in outcome:
            run.tracker.finish(run.run_id, "FAILED")
            raise outcome["error"]
        final = handler.final or EndRecord.from_dict(outcome["result"].return_value)
        if final.stop_reason != "reconfigure":
            return final
        restart_in(run, final.reconfigure)


def launch_trainer(run: DriverRun, controller) -> TorchTrainer:
    """A TorchTrainer for the run's current configuration, its workers reporting to `controller`."""
    cfg, storage = run.cfg, ray_storage(run.out)
    plan = run.plan.replaced(**run.current.as_dict(), reconfigure=run.state.reconfigure or cfg.reconfigure)
    return make_trainer(
        cfg,
        train_worker,
        {
            "plan": plan,
            "monitor": controller,
            "clock_origin": run.clock_origin,
            "adaptive": run.spec is not None,
            "faults": run.faults,
            "record_sample_ids": run.record_sample_ids,
            "controller_timeout_s": cfg.policy.controller_timeout_s,
            "checkpoint_root": storage / RAY_RUN_NAME,
        },
        RunConfig(
            name=RAY_RUN_NAME,
            **ray_storage_args(storage),
            checkpoint_config=CheckpointConfig(num_to_keep=cfg.checkpoint.keep),
            failure_config=FailureConfig(max_failures=cfg.cluster.max_failures),
        ),
    )


def restart_in(run: DriverRun, reconfigure: dict) -> None:
    """The workers checkpointed to hand over to another configuration: the next launch trains in it."""
    target = dict(reconfigure)
    if target.pop("fell_back", False):
        run.state.reconfigure = "restart"  # the in-place path failed once in this run: restart from now on
    run.current = CandidateConfig.from_dict(target)
    run.state.current = run.current.as_dict()
    save_run_state(run.out, run.state)


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
        self.last_print = 0.0  # time.time() of the last step line
        self.awaiting: dict | None = None  # a reconfiguration whose downtime the next step record gives

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
            self.run.echo(progress_line(r, self.run.plan.stop, self.last_val))
            self.last_print = time.time()

    def _measure_downtime(self, r: StepRecord) -> None:
        """A reconfiguration's downtime: from the decision to the start of the first step in the
        new configuration. The controller and a relaunched driver price the next one by it."""
        entry, self.awaiting = self.awaiting, None
        entry["downtime_s"] = r.wall_clock_s - r.step_time_s - entry["wall_clock_s"]
        run = self.run
        run.tracker.log_values(run.run_id, {"reconfiguration_downtime_s": entry["downtime_s"]}, step=entry["step"])
        if run.spec is not None:
            self.controller.observed_downtime.remote(
                entry["downtime_s"], entry["in_place"], entry["change"], bool(entry["fell_back"])
            )
        if not entry["in_place"]:
            run.state.restart_cost_s = entry["downtime_s"]
        elif entry["change"] == "layout":
            run.state.in_place_cost_s = entry["downtime_s"]
        run.echo(f"  downtime {entry['downtime_s']:.1f} s")

    def on_eval(self, r: EvalRecord) -> None:
        self.last_val = r.val_loss
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
        entry = reconfiguration_entry(r)
        run = self.run
        run.state.reconfigurations.append(entry)
        self.awaiting = entry
        if entry["in_place"]:  # the run goes on in the new configuration: a resumed driver must know it
            run.state.current = dict(entry["to"])
        if entry["predicted_gain"] is not None:
            run.tracker.log_values(run.run_id, {"predicted_goodput_gain": entry["predicted_gain"]}, step=entry["step"])
        run.echo(reconfiguration_line(entry))

    def on_end(self, r: EndRecord) -> None:
        self.final = r


def reconfiguration_entry(r: ReconfigureRecord) -> dict:
    """A reconfiguration as run_state.json and summary.json list it (its downtime comes with the
    next step record)."""
    return {
        "step": r.step,
        "samples": r.samples,
        "wall_clock_s": r.wall_clock_s,
        "from": r.from_,
        "to": r.to,
        "in_place": r.in_place,
        "fell_back": r.fell_back,
        "reshard": r.reshard,
        "predicted_gain": r.decision.get("predicted_gain"),
        "reason": r.decision.get("reason"),
        "b_noise": r.decision.get("b_noise"),
        "change": _change(r.from_, r.to),
        "downtime_s": None,
    }


def _change(before: dict, after: dict) -> str:
    return change_kind(CandidateConfig.from_dict(before), CandidateConfig.from_dict(after))


def add_lost_reconfigurations(state: RunState, final: EndRecord) -> None:
    """The workers' own list is the reference: a record that never reached the driver (the
    controller, which carries records, crashed with it in its queue) is added from it."""
    seen = {(r["step"], json.dumps(r["to"], sort_keys=True)) for r in state.reconfigurations}
    for r in final.reconfigurations:
        if (r["step"], json.dumps(r["to"], sort_keys=True)) not in seen:
            state.reconfigurations.append(
                {**r, "change": _change(r["from"], r["to"]), "downtime_s": None, "record_lost": True}
            )
    state.reconfigurations.sort(key=lambda r: r["step"])


def finish_run(run: DriverRun, final: EndRecord, controller_state: dict | None) -> dict:
    """summary.json, the run's closing MLflow metrics, tags and name; prints the summary."""
    ended = final_config(run, final)
    summary = run_summary(run, final, ended, controller_state)
    log_results(run, summary, ended, final.step)
    (run.out / "summary.json").write_json(summary)
    run.tracker.log_dict(run.run_id, summary, "summary.json")
    run.echo(summary_text(summary))
    return summary


def final_config(run: DriverRun, final: EndRecord) -> CandidateConfig:
    """The layout and batch shape of the last step (in-place changes happen inside a launch),
    or the last launch's when it took no step."""
    c = run.current
    return CandidateConfig.from_dict(
        {**c.as_dict(), **(final.layout or {}), "mbs": final.mbs or c.mbs, "gbs": final.gbs or c.gbs}
    )


def run_summary(run: DriverRun, final: EndRecord, ended: CandidateConfig, controller_state: dict | None) -> dict:
    """summary.json."""
    return {
        "policy": run.cfg.policy.name,
        "reached_target": final.time_to_target_s is not None,
        "time_to_target_s": final.time_to_target_s,
        "target_val_loss": run.cfg.stop.target_val_loss,
        "final_val_loss": final.last_val_loss,
        "best_val_loss": final.best_val_loss,
        "steps": final.step,
        "samples": final.samples,
        "wall_clock_s": final.wall_clock_s,
        "stop_reason": final.stop_reason,
        "nonfinite_steps": final.nonfinite_steps,
        "worker_failures": run.state.worker_failures,
        "skipped_samples": final.skipped_samples,
        "mlflow_run_id": run.run_id,
        "mlflow_tracking_uri": run.tracker.uri,
        "mlflow_experiment_id": run.tracker.experiment_id,
        "initial_layout": run.start.as_dict(),
        "layout": ended.as_dict(),
        "reconfigurations": run.state.reconfigurations,
        "controller": controller_state,
        "launches": run.state.launches,
        "data_fingerprint": run.tokens.fingerprint,
        "output_dir": str(run.out),
    }


def log_results(run: DriverRun, summary: dict, ended: CandidateConfig, step: int) -> None:
    """The run's closing figures in MLflow: final metrics, outcome tags, a name that says the
    outcome, the reconfigurations; then the run is finished."""
    tracker, run_id, cfg = run.tracker, run.run_id, run.cfg
    final_metrics = {
        "final_val_loss": summary["final_val_loss"],
        "total_wall_clock_s": summary["wall_clock_s"],
        "reconfigurations": float(len(run.state.reconfigurations)),
    }
    if summary["reached_target"]:
        final_metrics["time_to_target_s"] = summary["time_to_target_s"]
    tracker.log_values(run_id, final_metrics, step=int(step))
    tracker.set_tags(
        run_id,
        {
            "reached_target": summary["reached_target"],
            "stop_reason": summary["stop_reason"],
            "final_config": ended.label(),
        },
    )
    name = cfg.tracking.run_name or run_label(cfg, run.start)
    tracker.rename(run_id, results_name(name, summary["time_to_target_s"], ended.label()))
    tracker.log_dict(run_id, {"reconfigurations": run.state.reconfigurations}, "reconfigurations.json")
    tracker.finish(run_id)


def audit_changes(
    out: Location,
    entries: list[dict],
    warmup_samples: int,
    tracker: Tracker,
    run_id: str,
    echo: Callable[[str], None],
) -> list[dict]:
    """The reconfigurations, each with its predicted and realized statistical-efficiency gain
    (`copus.core.audit.audit_reconfigurations`: ρ = progress per sample after the change over
    before it, at matched loss, from the step records of OUTPUT_DIR/records.jsonl, against the
    controller's SE(new GBS)/SE(old GBS)); both logged to MLflow at the change's step. The first
    window before a change starts after the LR warm-up. An audit that fails leaves the run's
    results as they are, with `audit_note` saying why."""
    from copus.core.audit import audit_reconfigurations  # pure numpy/scipy

    if not entries:
        return entries
    records = []
    try:
        for line in read_lines(out / RECORDS_LOG):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut short when a driver died mid-write
                continue
        audited = audit_reconfigurations(entries, records, run_start_samples=warmup_samples)
    except Exception as err:  # the audit is a by-product: never lose a run's summary to it
        echo(f"warning: could not audit the reconfigurations ({type(err).__name__}: {err})")
        note = f"audit failed: {type(err).__name__}"
        return [
            {
                **e,
                "predicted_efficiency_gain": e.get("predicted_efficiency_gain"),
                "realized_efficiency_gain": None,
                "realized_efficiency_interval": None,
                "audit_points": None,
                "audit_note": note,
            }
            for e in entries
        ]
    for entry in audited:
        values = {
            k: entry[k] for k in ("predicted_efficiency_gain", "realized_efficiency_gain") if entry[k] is not None
        }
        if values and entry.get("step") is not None:
            tracker.log_values(run_id, values, step=int(entry["step"]))
        if entry["audit_points"] is not None:
            echo(
                f"audit step {entry['step']}: GBS {entry['from']['gbs']} -> {entry['to']['gbs']}, statistical "
                f"efficiency x{_fmt_gain(entry['predicted_efficiency_gain'])} predicted, "
                f"x{_fmt_gain(entry['realized_efficiency_gain'])} realized{_fmt_interval(entry)} "
                f"({entry['audit_note']})"
            )
    return audited


def _fmt_gain(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f}"


def _fmt_interval(entry: dict) -> str:
    """The realized gain's 95% interval; an interval that reaches the search bounds (1/20, 20)
    says the loss curve could not tell."""
    interval = entry.get("realized_efficiency_interval")
    if not interval:
        return ""
    low, high = interval
    return f" [95% {low:.2f}..{high:.2f}{', not determined by the curve' if low <= 0.051 or high >= 19.9 else ''}]"
