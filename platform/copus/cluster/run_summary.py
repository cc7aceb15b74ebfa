"""How a run ends: the reconfigurations completed from the workers' own list and audited
(predicted against realized statistical efficiency), `summary.json` (its schema is here), and
the run's closing MLflow metrics, tags and name."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from copus.cluster.driver_run import DriverRun, run_label
from copus.cluster.launch import crossing_of, run_topology
from copus.cluster.progress import summary_text
from copus.cluster.run_state import RunState, read_records_log
from copus.core.layout import CandidateConfig
from copus.core.reconfiguration import EfficiencyAudit, Reconfiguration, reversed_switches
from copus.records import EndRecord
from copus.storage import Location
from copus.tracking import Tracker, results_name


def add_lost_reconfigurations(state: RunState, final: EndRecord) -> None:
    """The workers' own list is the reference: a record that never reached the driver (the
    controller, which carries records, crashed with it in its queue) is added from it."""
    seen = {r.key() for r in state.reconfigurations}
    for r in final.reconfigurations:
        if r.key() not in seen:
            state.reconfigurations.append(replace(r, downtime_s=None, record_lost=True))
    state.reconfigurations.sort(key=lambda r: r.step)


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


def _with_crossing(change: dict, topology: dict) -> dict:
    return {
        **change,
        "crossing_from": crossing_of(topology, change["from"]),
        "crossing_to": crossing_of(topology, change["to"]),
    }


def run_summary(run: DriverRun, final: EndRecord, ended: CandidateConfig, controller_state: dict | None) -> dict:
    """summary.json."""
    topology = run_topology(run.cfg)
    return {
        "policy": run.cfg.policy.name,
        "reached_target": final.time_to_target_s is not None,
        "time_to_target_s": final.time_to_target_s,
        # Less the validation before the target (evaluation cadence differs between policies).
        "time_to_target_without_eval_s": final.time_to_target_without_eval_s,
        "eval_time_s": final.eval_time_s,  # validation time of the whole run
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
        "reconfigurations": [_with_crossing(r.as_dict(), topology) for r in run.state.reconfigurations],
        # Switches undone at the next decision (thrashing; copus.core.reconfiguration.reversed_switches).
        "reversed_switches": reversed_switches(
            [r.as_dict() for r in run.state.reconfigurations], run.cfg.policy.interval_s, "wall_clock_s"
        ),
        # Which parallel dimensions cross nodes, at the start, the end and each change.
        "topology": {
            **topology,
            "initial_crossing": crossing_of(topology, run.start.as_dict()),
            "crossing": crossing_of(topology, ended.as_dict()),
        },
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
    tracker.log_dict(run_id, {"reconfigurations": summary["reconfigurations"]}, "reconfigurations.json")
    tracker.finish(run_id)


def audit_changes(
    out: Location,
    changes: list[Reconfiguration],
    warmup_samples: int,
    tracker: Tracker,
    run_id: str,
    echo: Callable[[str], None],
) -> list[Reconfiguration]:
    """The reconfigurations, each with its audit: predicted and realized statistical-efficiency
    gain (`copus.core.audit.audit_reconfigurations`: ρ = progress per sample after the change over
    before it, at matched loss, from the step records of OUTPUT_DIR/records.jsonl, against the
    controller's SE(new GBS)/SE(old GBS)); both logged to MLflow at the change's step. The first
    window before a change starts after the LR warm-up. An audit that fails leaves the run's
    results as they are, with `audit_note` saying why."""
    from copus.core.audit import audit_reconfigurations  # pure numpy/scipy

    if not changes:
        return changes
    try:
        audited = audit_reconfigurations(changes, read_records_log(out), run_start_samples=warmup_samples)
    except Exception as err:  # the audit is a by-product: never lose a run's summary to it
        echo(f"warning: could not audit the reconfigurations ({type(err).__name__}: {err})")
        note = f"audit failed: {type(err).__name__}"
        return [c.audited(EfficiencyAudit(audit_note=note)) for c in changes]
    for change in audited:
        _log_audit(change, tracker, run_id, echo)
    return audited


def _log_audit(change: Reconfiguration, tracker: Tracker, run_id: str, echo: Callable[[str], None]) -> None:
    audit = change.audit
    values = {
        k: v
        for k, v in (
            ("predicted_efficiency_gain", audit.predicted_efficiency_gain),
            ("realized_efficiency_gain", audit.realized_efficiency_gain),
        )
        if v is not None
    }
    if values:
        tracker.log_values(run_id, values, step=int(change.step))
    if audit.audit_points is not None:
        echo(
            f"audit step {change.step}: GBS {change.from_.gbs} -> {change.to.gbs}, statistical "
            f"efficiency x{_fmt_gain(audit.predicted_efficiency_gain)} predicted, "
            f"x{_fmt_gain(audit.realized_efficiency_gain)} realized{_fmt_interval(audit)} "
            f"({audit.audit_note})"
        )


def _fmt_gain(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f}"


def _fmt_interval(audit: EfficiencyAudit) -> str:
    """The realized gain's 95% interval; an interval that reaches the search bounds (1/20, 20)
    says the loss curve could not tell."""
    interval = audit.realized_efficiency_interval
    if not interval:
        return ""
    low, high = interval
    return f" [95% {low:.2f}..{high:.2f}{', not determined by the curve' if low <= 0.051 or high >= 19.9 else ''}]"
