"""The report's figures, drawn with matplotlib and returned as inline SVG text (no files, no
network: the HTML page carries them)."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")  # no display; before pyplot is imported
import matplotlib.pyplot as plt  # noqa: E402

from dashboards.data import ReportData, RunSeries  # noqa: E402


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]  # drop the XML prolog: the SVG is inlined in HTML


def _label(run: RunSeries) -> str:
    return run.policy if run.policy != "?" else run.name


def _reconfig_marks(ax, run: RunSeries, color) -> None:
    for r in run.summary.get("reconfigurations", []):
        ax.axvline(r["wall_clock_s"], color=color, linestyle=":" if r.get("in_place") else "--", linewidth=1, alpha=0.8)


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
    ax.set(xlabel="wall-clock (s)", ylabel="GBS", title="Global batch size over time (dotted: in-place change, dashed: restart)")
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
    return _stacked(fig, axes, ("throughput (samples/s)", "statistical efficiency", "goodput"),
                    "Goodput = throughput x statistical efficiency (measured)")


def noise_scale(data: ReportData) -> str:
    fig, ax = plt.subplots(figsize=(8, 3.2))
    _lines(ax, data, "b_noise")
    ax.set(xlabel="wall-clock (s)", ylabel="B_noise (samples)", title="Gradient noise scale over time")
    ax.set_yscale("log")
    ax.legend()
    ax.grid(alpha=0.3)
    return _svg(fig)


FIGURES = {"validation-loss": validation_loss, "gbs": global_batch_size, "layout": layout, "goodput": goodput,
           "noise-scale": noise_scale}
