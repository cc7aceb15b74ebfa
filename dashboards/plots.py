"""The report's figures, drawn with matplotlib and returned as inline SVG text (no files, no
network: the HTML page carries them). The calibration figures take a calibration file's dict
(`copus calibrate`), whose unmeasured values are None."""

from __future__ import annotations

import io
import math

import matplotlib

matplotlib.use("Agg")  # no display; before pyplot is imported
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FormatStrFormatter  # noqa: E402

from dashboards.data import ReportData, RunSeries, audited_changes, changes  # noqa: E402


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]  # drop the XML prolog: the SVG is inlined in HTML


def _label(run: RunSeries) -> str:
    return run.policy if run.policy != "?" else run.name


def _reconfig_marks(ax, run: RunSeries, color) -> None:
    for c in changes(run):
        if c.wall_clock_s is not None:
            ax.axvline(c.wall_clock_s, color=color, linestyle=":" if c.in_place else "--", linewidth=1, alpha=0.8)


def _lines(ax, data: ReportData, key: str, step: bool = False, marks: bool = False) -> None:
    for i, run in enumerate(data.runs):
        xs, ys = run.series(key)
        if not xs:
            continue
        color = f"C{i % 10}"
        (ax.step if step else ax.plot)(xs, ys, label=_label(run), color=color, **({"where": "post"} if step else {}))
        if marks:
            _reconfig_marks(ax, run, color)


def validation_loss(data: ReportData) -> str:
    fig, ax = plt.subplots(figsize=(8, 4.2))
    _lines(ax, data, "val_loss", marks=True)
    if data.target is not None:
        ax.axhline(data.target, color="black", linewidth=1, label=f"target {data.target}")
    ax.set(xlabel="wall-clock (s)", ylabel="validation loss", title="Validation loss against wall-clock")
    ax.legend()
    ax.grid(alpha=0.3)
    return _svg(fig)


def global_batch_size(data: ReportData) -> str:
    fig, ax = plt.subplots(figsize=(8, 3.2))
    _lines(ax, data, "gbs", step=True, marks=True)
    ax.set(
        xlabel="wall-clock (s)",
        ylabel="GBS",
        title="Global batch size over time (dotted: in-place change, dashed: restart)",
    )
    ax.legend()
    ax.grid(alpha=0.3)
    return _svg(fig)


def _stacked(fig, axes, ylabels: tuple[str, ...], title: str) -> str:
    """Finish a column of panels sharing the wall-clock axis."""
    for ax, name in zip(axes, ylabels):
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[0].set_title(title)
    axes[0].legend(fontsize=8)
    axes[-1].set_xlabel("wall-clock (s)")
    return _svg(fig)


def layout(data: ReportData) -> str:
    keys = ("dp", "tp", "pp", "mbs")
    fig, axes = plt.subplots(len(keys), 1, figsize=(8, 6.4), sharex=True)
    for ax, key in zip(axes, keys):
        _lines(ax, data, key, step=True, marks=True)
    return _stacked(fig, axes, keys, "Layout and micro-batch size over time, with reconfigurations")


def goodput(data: ReportData) -> str:
    fig, axes = plt.subplots(3, 1, figsize=(8, 6.4), sharex=True)
    for i, run in enumerate(data.runs):
        tx, thr = run.series("samples_per_s")
        sx, se = run.series("statistical_efficiency")
        color = f"C{i % 10}"
        axes[0].plot(tx, thr, color=color, label=_label(run), linewidth=0.8)
        axes[1].plot(sx, se, color=color, linewidth=0.8)
        by_time = dict(zip(sx, se))
        gx = [t for t in tx if t in by_time]
        axes[2].plot(gx, [v * by_time[t] for t, v in zip(tx, thr) if t in by_time], color=color, linewidth=0.8)
    return _stacked(
        fig,
        axes,
        ("throughput (samples/s)", "statistical efficiency", "goodput"),
        "Goodput = throughput x statistical efficiency (measured)",
    )


def noise_scale(data: ReportData) -> str:
    fig, ax = plt.subplots(figsize=(8, 3.2))
    _lines(ax, data, "b_noise")
    ax.set(xlabel="wall-clock (s)", ylabel="B_noise (samples)", title="Gradient noise scale over time")
    ax.set_yscale("log")
    ax.legend()
    ax.grid(alpha=0.3)
    return _svg(fig)


def efficiency_audit(data: ReportData) -> str | None:
    """Predicted against realized statistical-efficiency gain of every audited change of GBS
    (log-log, y = x: the prediction was right; the bars are the 95% interval of the realized
    gain). None when no change has both numbers."""
    points = [
        (i, run, c.audit, f"{c.from_.gbs}->{c.to.gbs}")
        for i, run in enumerate(data.runs)
        for c in audited_changes(run)
        if (c.audit.predicted_efficiency_gain or 0) > 0 and (c.audit.realized_efficiency_gain or 0) > 0
    ]
    if not points:
        return None
    fig, ax = plt.subplots(figsize=(6, 5))
    seen = set()
    for i, run, a, gbs in points:
        x, y = a.predicted_efficiency_gain, a.realized_efficiency_gain
        lo, hi = a.realized_efficiency_interval or (y, y)
        label = None if i in seen else _label(run)
        seen.add(i)
        ax.errorbar(
            [x], [y], yerr=[[max(y - lo, 0.0)], [max(hi - y, 0.0)]], fmt="o", color=f"C{i % 10}", capsize=3, label=label
        )
        ax.annotate(gbs, (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
    values = [
        v
        for _, _, a, _ in points
        for v in (a.predicted_efficiency_gain, a.realized_efficiency_gain, *(a.realized_efficiency_interval or ()))
    ]
    lo, hi = min(values) / 1.3, max(values) * 1.3
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=1, linestyle="--", label="y = x")
    ax.set(
        xscale="log",
        yscale="log",
        xlim=(lo, hi),
        ylim=(lo, hi),
        xlabel="predicted SE(new GBS)/SE(old GBS)",
        ylabel="realized gain (progress per sample after/before)",
        title="Statistical efficiency gain at each GBS change: predicted vs realized",
    )
    for axis in (ax.xaxis, ax.yaxis):  # plain ratios, not powers of ten
        axis.set_major_formatter(FormatStrFormatter("%g"))
        axis.set_minor_formatter(FormatStrFormatter("%g"))
    ax.tick_params(which="minor", labelsize=7)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return _svg(fig)


# The configured mapping a calibration is checked against: critical batch = 2 x B_noise
# (`efficiency.critical_factor`'s default, the COPUS rule).
CONFIGURED_FACTOR = 2.0


def _num(v) -> float | None:
    """A positive finite number, or None (null, NaN, infinite, zero: nothing to put on a log axis)."""
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) and v > 0 else None


def _branch_label(i: int, b: dict) -> str:
    loss = f"{b['val_loss']:.3f}" if _num(b.get("val_loss")) else "?"
    return f"branch {i}: loss {loss} at {b.get('samples_seen', '?')} samples"


def _samples_branch(ax, i: int, b: dict, points: list[dict]) -> list[float]:
    """One branch point on the E(B) panel: seeds as dots, means as markers, the fit dashed (or
    the measured curve, kept, as a thin line); returns the GBS values drawn."""
    color = f"C{i % 10}"
    seeds = [
        (p["gbs"], p["samples"])
        for p in points
        if p.get("branch") == i and p.get("reached", True) and _num(p.get("gbs")) and _num(p.get("samples"))
    ]
    if seeds:
        ax.scatter(*zip(*seeds), s=12, color=color, alpha=0.45, linewidths=0)
    means = [(g, e) for g, e in zip(b.get("gbs") or [], b.get("mean_samples") or []) if _num(g) and _num(e)]
    fit = b.get("fit_ok") and b.get("e_min") is not None and _num(b.get("s_min"))
    label = _branch_label(i, b) + ("" if fit else " (linear form rejected: curve kept)")
    if means:
        ax.plot(
            *zip(*means),
            marker="o",
            markersize=6,
            linestyle="none" if fit else "-",
            linewidth=1,
            color=color,
            label=label,
        )
    gbs = [g for g, _ in means + seeds]
    if fit and gbs:
        xs = [min(gbs) / 1.5 * (max(gbs) * 2.25 / min(gbs)) ** (k / 60) for k in range(61)]
        crit = _num(b.get("b_crit"))
        ax.plot(
            xs,
            [b["e_min"] + b["s_min"] * x for x in xs],
            linestyle="--",
            linewidth=1.2,
            color=color,
            label=f"fit E_min(1 + B/B_crit), B_crit = {crit:.3g}" if crit else "fit E_min + S_min B",
        )
    return gbs


def calibration_samples(cal: dict) -> str:
    """Samples to the loss decrement E(B) against GBS, log-log, a colour per branch point: the
    seeds as dots, their mean as markers, the McCandlish fit E = E_min + S_min B dashed where
    the chi-square test accepted it (else the measured curve, which the planner keeps)."""
    fig, ax = plt.subplots(figsize=(8, 4.8))
    drawn = [g for i, b in enumerate(cal["branch_points"]) for g in _samples_branch(ax, i, b, cal.get("points") or [])]
    b0 = _num(cal.get("reference_gbs"))
    if b0:
        ax.axvline(b0, color="grey", linewidth=1, linestyle=":", label=f"reference GBS B0 = {b0:g}")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="global batch size B",
        ylabel=f"samples to a loss drop of {cal.get('decrement', '?')}",
        title="Samples to the loss decrement E(B) per branch point (dots: seeds; dashed: linear fit)",
    )
    if drawn:
        ax.set_xticks(sorted(set(drawn)))
    ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.xaxis.set_minor_formatter(FormatStrFormatter(""))
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return _svg(fig)


def _once(seen: set, label: str) -> str | None:
    """A legend label the first time it is drawn, None after."""
    if label in seen:
        return None
    seen.add(label)
    return label


def _crit_point(ax, x: float, dodge: float, b: dict, seen: set) -> None:
    """One branch point on the critical-batch panel: the measurement with its interval, and,
    beside it, the configured rule 2 x the run's B_noise and the raw and Adam noise scales."""
    crit = _num(b.get("b_crit"))
    if crit:
        lo, hi = _num(b.get("b_crit_low")) or crit, _num(b.get("b_crit_high")) or crit
        ax.errorbar(
            [x + dodge],
            [crit],
            yerr=[[max(crit - lo, 0.0)], [max(hi - crit, 0.0)]],
            capsize=4,
            color="C0",
            fmt="o" if b.get("fit_ok") else "s",
            mfc="C0" if b.get("fit_ok") else "white",
            label=_once(seen, "B_crit measured, 95% interval (square: fit rejected, curve kept)"),
        )
        if _num(b.get("c")):
            ax.annotate(f"c = {b['c']:.3g}", (x + dodge, crit), textcoords="offset points", xytext=(6, 6), fontsize=8)
    run = _num(b.get("b_noise_run"))
    if run:
        ax.plot(
            [x - dodge],
            [CONFIGURED_FACTOR * run],
            "D",
            color="C3",
            label=_once(seen, f"configured rule: {CONFIGURED_FACTOR:g} x run's B_noise"),
        )
    for key, marker, name in (("b_noise", "^", "B_noise raw (branch weights)"), ("b_noise_adam", "v", "B_noise Adam")):
        if _num(b.get(key)):
            ax.plot([x - dodge], [b[key]], marker, color="grey", mfc="none", label=_once(seen, name))


def calibration_critical_batch(cal: dict) -> str:
    """The measured critical batch against the validation loss of each branch point (training
    goes left to right: the loss axis is inverted), next to the noise-scale proxies a run
    without a calibration would have used."""
    branches = [b for b in cal["branch_points"] if _num(b.get("val_loss"))]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    losses = [b["val_loss"] for b in branches]
    dodge = 0.02 * ((max(losses) - min(losses)) if len(losses) > 1 else 1.0) if losses else 0.0
    seen: set = set()
    for b in branches:
        _crit_point(ax, b["val_loss"], dodge, b, seen)  # the measurement left of its proxies
    if losses:
        ax.set_xlim(max(losses) + 6 * dodge, min(losses) - 6 * dodge)
    ax.set(
        yscale="log",
        xlabel="validation loss at the branch point (training progresses to the right)",
        ylabel="batch size (samples)",
        title="Critical batch: measured against the noise-scale rule",
    )
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return _svg(fig)


CALIBRATION_FIGURES = {
    "calibration-samples": calibration_samples,
    "calibration-critical-batch": calibration_critical_batch,
}


FIGURES = {
    "validation-loss": validation_loss,
    "gbs": global_batch_size,
    "layout": layout,
    "goodput": goodput,
    "noise-scale": noise_scale,
}
