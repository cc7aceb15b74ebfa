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
from typing import Callable

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
from copus.storage import RAY_RUN_NAME, ray_storage
from copus.tracking import Tracker, flatten, results_name
from copus.train.faults import FaultSpecError, faults_from_env

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


def start_config(cfg: ExperimentConfig) -> CandidateConfig:
    p, b = cfg.parallel, cfg.batch
    return CandidateConfig(p.dp, p.tp, p.pp, b.mbs, b.gbs)


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
    return spec, initial_config(cfg.policy.name, spec.planner(), start_config(cfg), cfg.policy.layout)


def run_label(cfg: ExperimentConfig, start: CandidateConfig) -> str:
    """A run's default MLflow name: what tells it apart from other runs of the experiment."""
    return f"{cfg.name} {cfg.policy.name} gbs{start.gbs} dp{start.dp}-tp{start.tp}-pp{start.pp} mbs{start.mbs}"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def run_experiment(
    cfg: ExperimentConfig,
    fresh: bool = False,
    echo: Callable[[str], None] = print,
    b_noise_script: tuple | None = None,
    parent_run_id: str | None = None,
) -> dict:
    out = cfg.resolved_output_dir()
    tokens, plan = prepare_plan(cfg)
    try:
        faults = faults_from_env(out / FAULT_MARKERS, cfg.cluster.num_workers)
    except FaultSpecError as err:
        raise ConfigError(str(err)) from None
    record_sample_ids = os.environ.get(SAMPLE_IDS_ENV) == "1"
    if fresh:
        clear_run(out)
    out.mkdir(parents=True, exist_ok=True)
    state = load_run_state(out, resume_key(cfg, tokens.fingerprint))
    ensure_ray(cfg)
    spec, start = (
        controller_setup(cfg, echo, b_noise_script, tokens.fingerprint) if cfg.adaptive else (None, start_config(cfg))
    )
    current, moved = resume_config(state.current, start)
    if moved:
        echo(moved)

    tracker = Tracker(cfg.resolved_tracking_uri(), cfg.tracking.experiment, warn=echo)
    if state.mlflow_run_id is None:
        params = flatten(cfg.model_dump(mode="json"))
        params.update({"data.fingerprint": tokens.fingerprint, "data.description": tokens.description})
        state.mlflow_run_id = tracker.start_run(
            cfg.tracking.run_name or run_label(cfg, current),
            params,
            {
                "policy": cfg.policy.name,
                "layout": f"dp{current.dp}-tp{current.tp}-pp{current.pp}",
                "copus.output_dir": str(out),
            },
            parent_run_id,
        )
        tracker.log_dict(state.mlflow_run_id, cfg.model_dump(mode="json"), "config.json")
    else:
        tracker.resume_run(state.mlflow_run_id)
        echo(
            f"resuming run in {out} (launch {state.launches + 1}, {state.elapsed_s:.1f} s already spent, "
            f"{current.label()})"
        )
    run_id = state.mlflow_run_id
    state.current = current.as_dict()
    save_run_state(out, state)

    # The controller outlives every worker group of this run: its history and restart-cost
    # estimate carry over relaunches.
    # Ray restarts a controller that crashes (max_restarts); it recovers its state from
    # CONTROLLER_STATE, which it rewrites after every decision.
    actor = (
        GoodputController.options(name=f"copus-controller-{run_id}", max_restarts=-1).remote(
            spec, state.restart_cost_s, state.in_place_cost_s, state.reconfigure, str(out / CONTROLLER_STATE)
        )
        if spec is not None
        else RunMonitor.remote()
    )
    records_log = open(out / RECORDS_LOG, "a")
    clock_origin = time.time() - state.elapsed_s
    view = {
        "last_val": None,
        "final": None,
        "last_print": 0.0,
        "awaiting": None,
        "cursor": (None, 0),
        "starts": 0,
        "last_step": 0,
    }

    def on_records(records: list[dict]) -> None:
        tracker.log_records(run_id, records)
        for record in records:
            records_log.write(json.dumps(record) + "\n")
            kind = record["kind"]
            if kind == "step":
                view["last_step"] = record["step"]
            if kind == "start":
                view["starts"] += 1
                if view["starts"] > 1:  # Ray Train restarted a failed worker group within this launch
                    lost = max(view["last_step"] - record["step"], 0)
                    state.worker_failures.append(
                        {
                            "wall_clock_s": record["wall_clock_s"],
                            "resumed_at_step": record["step"],
                            "last_step_before": view["last_step"],
                            "steps_lost": lost,
                        }
                    )
                    echo(
                        f"[{record['wall_clock_s']:.0f} s] a worker failed: Ray Train restarted the worker group, "
                        f"resumed from the checkpoint at step {record['step']} in "
                        f"dp{record['layout']['dp']}-tp{record['layout']['tp']}-pp{record['layout']['pp']} "
                        f"({lost} steps to redo)"
                    )
            elif kind == "checkpoint_refused":
                echo(
                    f"warning: checkpoint {record['path']} refused ({record['reason']}); resuming from the newest "
                    f"complete one before it"
                )
            elif kind == "eval":
                view["last_val"] = record["val_loss"]
            elif kind == "end":
                view["final"] = record
            elif kind == "nonfinite":
                echo(
                    f"warning: step {record['step']}: non-finite loss {record['train_loss']} or gradient norm "
                    f"{record['grad_norm']}: update skipped ({record['consecutive']} in a row, "
                    f"{record['nonfinite_steps']} in this run)"
                )
            elif kind == "reconfigure":
                entry = {
                    k: record.get(k)
                    for k in (
                        "step",
                        "samples",
                        "wall_clock_s",
                        "from",
                        "to",
                        "in_place",
                        "fell_back",
                        "reshard",
                        "predicted_gain",
                        "reason",
                        "b_noise",
                    )
                }
                entry["change"] = change_kind(
                    CandidateConfig.from_dict(entry["from"]), CandidateConfig.from_dict(entry["to"])
                )
                entry["downtime_s"] = None
                state.reconfigurations.append(entry)
                view["awaiting"] = entry
                if entry["in_place"]:  # the run goes on in the new GBS: a resumed driver must know it
                    state.current = dict(entry["to"])
                if entry["predicted_gain"] is not None:
                    tracker.log_values(run_id, {"predicted_goodput_gain": entry["predicted_gain"]}, step=entry["step"])
                echo(reconfiguration_line(entry))
                continue
            elif kind == "step" and view["awaiting"] is not None:
                # Downtime: from the decision to the start of the first step in the new configuration.
                entry, view["awaiting"] = view["awaiting"], None
                entry["downtime_s"] = record["wall_clock_s"] - record["step_time_s"] - entry["wall_clock_s"]
                tracker.log_values(run_id, {"reconfiguration_downtime_s": entry["downtime_s"]}, step=entry["step"])
                if spec is not None:
                    actor.observed_downtime.remote(
                        entry["downtime_s"], entry["in_place"], entry["change"], bool(entry["fell_back"])
                    )
                if not entry["in_place"]:
                    state.restart_cost_s = entry["downtime_s"]
                elif entry["change"] == "layout":
                    state.in_place_cost_s = entry["downtime_s"]
                echo(f"  downtime {entry['downtime_s']:.1f} s")
            # Every validation, but at most one step line per PRINT_EVERY_S: readable on any speed.
            if kind == "step" and time.time() - view["last_print"] < PRINT_EVERY_S:
                continue
            line = progress_line(record, plan.stop, view["last_val"])
            if line:
                echo(line)
                if kind == "step":
                    view["last_print"] = time.time()
        state.elapsed_s = time.time() - clock_origin
        save_run_state(out, state)

    try:
        while True:
            state.launches += 1
            save_run_state(out, state)
            launch_plan = plan.replaced(
                dp=current.dp,
                tp=current.tp,
                pp=current.pp,
                gbs=current.gbs,
                mbs=current.mbs,
                reconfigure=state.reconfigure or cfg.reconfigure,
            )
            trainer = make_trainer(
                cfg,
                train_worker,
                {
                    "plan": launch_plan,
                    "monitor": actor,
                    "clock_origin": clock_origin,
                    "adaptive": spec is not None,
                    "faults": faults,
                    "record_sample_ids": record_sample_ids,
                    "controller_timeout_s": cfg.policy.controller_timeout_s,
                    "checkpoint_root": str(ray_storage(out) / RAY_RUN_NAME),
                },
                RunConfig(
                    name=RAY_RUN_NAME,
                    storage_path=str(ray_storage(out)),
                    checkpoint_config=CheckpointConfig(num_to_keep=cfg.checkpoint.keep),
                    failure_config=FailureConfig(max_failures=cfg.cluster.max_failures),
                ),
            )
            echo(
                f"training {cfg.workload.model} on {cfg.cluster.num_workers} Ray workers ({current.label()}, "
                f"policy {cfg.policy.name}); MLflow run {run_id}"
            )
            view["final"], view["starts"] = None, 0
            outcome = fit_and_drain(trainer, actor, on_records, view["cursor"])
            view["cursor"] = outcome["cursor"]
            if "error" in outcome:
                tracker.finish(run_id, "FAILED")
                raise outcome["error"]
            final = view["final"] or outcome["result"].return_value
            if final["stop_reason"] != "reconfigure":
                break
            target = dict(final["reconfigure"])  # the workers checkpointed; relaunch in the new layout
            if target.pop("fell_back", False):
                state.reconfigure = "restart"  # the in-place path failed once in this run: restart from now on
            current = CandidateConfig.from_dict(target)
            state.current = current.as_dict()
            save_run_state(out, state)
        controller_state = ray.get(actor.snapshot.remote()) if spec is not None else None
    finally:
        ray.kill(actor)
        records_log.close()

    # The workers' own list is the reference: a record that never reached the driver (the
    # controller, which carries records, crashed with it in its queue) is added from it.
    seen = {(r["step"], json.dumps(r["to"], sort_keys=True)) for r in state.reconfigurations}
    for r in final.get("reconfigurations", []):
        if (r["step"], json.dumps(r["to"], sort_keys=True)) not in seen:
            state.reconfigurations.append(
                {
                    **r,
                    "change": change_kind(CandidateConfig.from_dict(r["from"]), CandidateConfig.from_dict(r["to"])),
                    "downtime_s": None,
                    "record_lost": True,
                }
            )
    state.reconfigurations.sort(key=lambda r: r["step"])
    state.reconfigurations = audit_changes(
        out, state.reconfigurations, cfg.schedule.warmup_samples, tracker, run_id, echo
    )

    # The final configuration: the layout and batch shape of the last step (in-place changes
    # happen inside a launch), or the last launch's when it took no step.
    layout = final.get("layout") or {"dp": current.dp, "tp": current.tp, "pp": current.pp}
    final_config = CandidateConfig(
        layout["dp"], layout["tp"], layout["pp"], final.get("mbs") or current.mbs, final.get("gbs") or current.gbs
    )
    summary = {
        "policy": cfg.policy.name,
        "reached_target": final["time_to_target_s"] is not None,
        "time_to_target_s": final["time_to_target_s"],
        "target_val_loss": cfg.stop.target_val_loss,
        "final_val_loss": final["last_val_loss"],
        "best_val_loss": final["best_val_loss"],
        "steps": final["step"],
        "samples": final["samples"],
        "wall_clock_s": final["wall_clock_s"],
        "stop_reason": final["stop_reason"],
        "nonfinite_steps": final.get("nonfinite_steps", 0),
        "worker_failures": state.worker_failures,
        "skipped_samples": final.get("skipped_samples", 0),
        "mlflow_run_id": run_id,
        "mlflow_tracking_uri": tracker.uri,
        "mlflow_experiment_id": tracker.experiment_id,
        "initial_layout": start.as_dict(),
        "layout": final_config.as_dict(),
        "reconfigurations": state.reconfigurations,
        "controller": controller_state,
        "launches": state.launches,
        "data_fingerprint": tokens.fingerprint,
        "output_dir": str(out),
    }
    final_metrics = {
        "final_val_loss": summary["final_val_loss"],
        "total_wall_clock_s": summary["wall_clock_s"],
        "reconfigurations": float(len(state.reconfigurations)),
    }
    if summary["reached_target"]:
        final_metrics["time_to_target_s"] = summary["time_to_target_s"]
    tracker.log_values(run_id, final_metrics, step=int(final["step"]))
    tracker.set_tags(
        run_id,
        {
            "reached_target": summary["reached_target"],
            "stop_reason": summary["stop_reason"],
            "final_config": final_config.label(),
        },
    )
    tracker.rename(
        run_id,
        results_name(cfg.tracking.run_name or run_label(cfg, start), summary["time_to_target_s"], final_config.label()),
    )
    tracker.log_dict(run_id, {"reconfigurations": state.reconfigurations}, "reconfigurations.json")
    tracker.finish(run_id)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    tracker.log_dict(run_id, summary, "summary.json")
    echo(summary_text(summary))
    return summary


def audit_changes(
    out: os.PathLike,
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
        with open(os.path.join(out, RECORDS_LOG)) as fh:
            for line in fh:
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
