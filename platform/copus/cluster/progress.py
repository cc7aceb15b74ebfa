"""Human-readable live progress and the closing summary (pure formatting, no I/O)."""

from __future__ import annotations

from copus.core.horizon import samples_to_target
from copus.core.reconfiguration import Reconfiguration
from copus.records import EvalRecord, Record, StepRecord
from copus.train.worker_plan import StopRule


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rem = divmod(seconds, 3600)
    return f"{h}:{rem // 60:02d}:{rem % 60:02d}" if h else f"{rem // 60:02d}:{rem % 60:02d}"


def eta_to_budget(record: StepRecord, stop: StopRule) -> float | None:
    """Seconds until the first budget (steps, samples, wall-clock) runs out at the current rate."""
    left = []
    if stop.max_steps is not None:
        left.append((stop.max_steps - record.step) * record.step_time_s)
    if stop.max_samples is not None:
        left.append((stop.max_samples - record.samples) / record.samples_per_s)
    if stop.max_wall_clock_s is not None:
        left.append(stop.max_wall_clock_s - record.wall_clock_s)
    return max(0.0, min(left)) if left else None


def eta_to_target(record: StepRecord, stop: StopRule, curve: list[tuple[float, float]]) -> float | None:
    """Seconds until the validation loss reaches the target at the current rate: the samples at
    which the power law fitted to the validation curve (samples, loss) crosses it, its central
    estimate (`copus.core.horizon`, the curve the planner weighs a switch's horizon by); None
    without a target, or while the curve cannot say (too few evaluations, not falling)."""
    if stop.target_val_loss is None or not record.samples_per_s > 0:
        return None
    fit = samples_to_target([s for s, _ in curve], [v for _, v in curve], stop.target_val_loss, 0.0)
    if fit is None:
        return None
    return max(fit[1] - record.samples, 0.0) / record.samples_per_s


def progress_line(
    record: Record, stop: StopRule, last_val: float | None, curve: list[tuple[float, float]] = ()
) -> str | None:
    """The live line of a step or a validation record; None for other kinds. `curve`: the
    validation losses so far with the samples they were read at, for the ETA to the target."""
    if isinstance(record, StepRecord):
        budget = eta_to_budget(record, stop)
        target = eta_to_target(record, stop, list(curve))
        val = f" | val {last_val:.4f}" if last_val is not None else ""
        return (
            f"[{_clock(record.wall_clock_s)}] step {record.step:>5} | loss {record.train_loss:.4f}{val}"
            f" | {record.samples_per_s:.1f} samples/s | dp{record.dp}-tp{record.tp}-pp{record.pp}"
            f" gbs {record.gbs} mbs {record.mbs}"
            f" | ETA to target {_clock(target) if target is not None else 'n/a'}"
            f", to budget {_clock(budget) if budget is not None else 'n/a'}"
        )
    if isinstance(record, EvalRecord):
        target = f" (target {stop.target_val_loss})" if stop.target_val_loss is not None else ""
        return f"[{_clock(record.wall_clock_s)}] step {record.step:>5} | validation loss {record.val_loss:.4f}{target}"
    return None


def _label(c: dict) -> str:
    return f"dp{c['dp']}-tp{c['tp']}-pp{c['pp']} mbs{c['mbs']} gbs{c['gbs']}"


def reconfiguration_line(change: Reconfiguration) -> str:
    how = "in place" if change.in_place else "restart"
    if change.reshard:
        how += f", {change.reshard['bytes_moved'] / 2**20:.1f} MiB moved"
    if change.fell_back:
        how += f" after the in-place path failed: {change.fell_back}"
    order = change.order
    gain = f"; predicted goodput {order.predicted_gain:+.1%}" if order and order.predicted_gain is not None else ""
    noise = f"; B_noise {order.b_noise:.1f}" if order and order.b_noise is not None else ""
    return (
        f"[{_clock(change.wall_clock_s)}] step {change.step:>5} | reconfigure {change.from_.label()} -> "
        f"{change.to.label()} ({how}{gain}{noise})"
    )


def summary_text(summary: dict) -> str:
    ttt = summary.get("time_to_target_s")
    reached = f"reached in {ttt:.1f} s" if summary["reached_target"] else "not reached"
    val = summary["final_val_loss"]
    return "\n".join(
        [
            f"policy {summary['policy']}: {summary['steps']} steps, {summary['samples']} samples, {summary['wall_clock_s']:.1f} s wall-clock",
            f"final validation loss {val:.4f}; target {summary.get('target_val_loss')}: {reached} (stopped by {summary['stop_reason']})",
            f"{len(summary.get('reconfigurations', []))} reconfiguration(s); final configuration {_label(summary['layout'])}",
        ]
    )
