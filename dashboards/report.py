"""`copus report`: one self-contained HTML file (inline SVG plots, inline CSS, no network)
from a comparison's or a run's MLflow data, with a section per calibration found in the output
directory's profiles/; or, given a calibration file (calibration-<id>.json of `copus calibrate`),
a report of that calibration alone (no MLflow).

The page carries a small script that checks, in the browser, that every figure rendered
(an <svg> with a non-empty box) and records the count on <body data-plots-rendered>, which is
how the test checks it in headless Chromium.
"""

from __future__ import annotations

import html
import os
import time
from pathlib import Path

from copus.core.calibration import FIT_P_MIN
from copus.core.comparison import log_ratio_text, paired_speedup_text, sides_text
from copus.core.layout import CandidateConfig
from copus.core.tradeoffs import tradeoff_lines, tradeoffs
from copus.storage import Location, StorageError
from dashboards.data import ReportData, ReportError, RunSeries, audited_changes, load, load_calibration, output_location
from dashboards.plots import CALIBRATION_FIGURES, CONFIGURED_FACTOR, FIGURES, efficiency_audit

CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:960px;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 10px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}figure{margin:1.5em 0}
figure svg{max-width:100%;height:auto}.note{color:#666;font-size:90%}.problem{color:#a00}"""

CHECK = """<script>
window.addEventListener('load', function () {
  var figs = document.querySelectorAll('figure.plot'); var ok = 0;
  figs.forEach(function (f) { var s = f.querySelector('svg');
    if (s) { var b = s.getBBox(); if (b.width > 0 && b.height > 0) { ok++; f.dataset.rendered = 'yes'; } } });
  document.body.dataset.plotsExpected = figs.length; document.body.dataset.plotsRendered = ok;
});
</script>"""


def _fmt(v, spec: str = ".1f", none: str = "-") -> str:
    return none if v is None else format(v, spec)


def _table(head: list[str], rows: list[list]) -> str:
    cells = "".join(f"<tr>{''.join(f'<td>{html.escape(str(c))}</td>' for c in row)}</tr>" for row in rows)
    return f"<table><tr>{''.join(f'<th>{html.escape(h)}</th>' for h in head)}</tr>{cells}</table>"


def results_table(data: ReportData) -> str:
    rows = []
    stats = (data.comparison or {}).get("policies")
    if stats:
        for policy, s in stats.items():
            rows.append(
                [
                    policy,
                    f"{s['reached']}/{s['runs']}",
                    _fmt(s["time_to_target_s"]),
                    _fmt(s["final_val_loss"], ".4f"),
                    _fmt(s["samples"], ".0f"),
                    _fmt(s["reconfigurations"], ".1f"),
                    speedup_cell(s, policy),
                ]
            )
    else:
        rows = [_run_row(r) for r in data.runs]
    head = [
        "policy",
        "reached target",
        "time to target (s)",
        "final val loss",
        "samples",
        "reconfigurations",
        "speedup",
    ]
    cells = "".join(f"<tr>{''.join(f'<td>{html.escape(str(c))}</td>' for c in row)}</tr>" for row in rows)
    return f"<table><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr>{cells}</table>"


def _run_row(r: RunSeries) -> list:
    """A run's row from its summary.json; one whose summary is not there to read says so
    rather than showing an empty summary as a run that missed its target."""
    s = r.summary
    if r.summary_problem:
        return [r.policy, "unknown: no readable summary (see above)", "-", "-", "-", "-", ""]
    return [
        r.policy,
        "yes" if s.get("reached_target") else "no",
        _fmt(s.get("time_to_target_s")),
        _fmt(s.get("final_val_loss"), ".4f"),
        _fmt(s.get("samples"), ".0f"),
        str(len(s.get("reconfigurations", []))),
        "",
    ]


def problems_note(data: ReportData) -> str:
    """What could not be read, each naming its file and what failed, above the results."""
    if not data.problems:
        return ""
    items = "".join(f"<li>{html.escape(p)}</li>" for p in data.problems)
    return f"<div class='problem'><p>Not shown: these inputs could not be read.</p><ul>{items}</ul></div>"


def speedup_cell(s: dict, policy: str = "copus") -> str:
    """An adaptive policy's speedup over the fastest baseline by mean time, with the paired mean
    over repeats and its 95% interval when there are repeats (copus also against copus-gbs); and
    against the best baseline, the paired log-ratio and goodput's two sides of it. Every figure
    in the words the CLI table prints (`copus.core.comparison`), pairs left out included."""
    parts = []
    speed = s.get("speedup_vs_fastest_baseline")
    if speed is not None:
        parts.append(f"{speed:+.1%} vs {s['fastest_baseline']}")
        for label, entry in [("paired", s)] + ([("vs copus-gbs", s["vs_copus_gbs"])] if s.get("vs_copus_gbs") else []):
            text = paired_speedup_text(entry)
            if text is not None:
                parts.append(f"{label} {text}")
    best = s.get("vs_best_baseline") or {}
    against_best = [log_ratio_text(best, policy)] if best.get("log_ratio_mean") is not None else []
    against_best += [t for t in [sides_text(best)] if t is not None]
    if against_best:
        parts.append(f"vs {best['baseline']}: " + "; ".join(against_best))
    return "; ".join(parts)


def audit_section(data: ReportData) -> str:
    """The "predicted vs realized" panel: per audited change of GBS, the controller's predicted
    gain in statistical efficiency against the one read off the loss curve, as a plot and a
    table; empty when no run has an audited change."""
    rows = []
    for run in data.runs:
        for c in audited_changes(run):
            audit, interval = c.audit, c.audit.realized_efficiency_interval
            rows.append(
                [
                    run.policy if run.policy != "?" else run.name,
                    str(c.step),
                    f"{c.from_.gbs} -> {c.to.gbs}",
                    _fmt(audit.predicted_efficiency_gain, ".3f"),
                    _fmt(audit.realized_efficiency_gain, ".3f"),
                    f"{interval[0]:.3f} - {interval[1]:.3f}" if interval else "-",
                    audit.audit_note or "",
                ]
            )
    if not rows:
        return ""
    svg = efficiency_audit(data)
    figure = f'<figure class="plot" data-plot="efficiency-audit">{svg}</figure>' if svg else ""
    head = ["run", "step", "GBS", "predicted gain", "realized gain", "95% interval", "note"]
    cells = "".join(f"<tr>{''.join(f'<td>{html.escape(str(c))}</td>' for c in row)}</tr>" for row in rows)
    return (
        "<h2>Predicted vs realized statistical efficiency</h2><p class='note'>At each change of GBS: the "
        "controller's predicted SE(new)/SE(old) against the realized gain, progress per sample after the "
        "change over before it at matched loss, fitted to the train-loss curve (copus.core.audit).</p>"
        f"{figure}<table><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr>{cells}</table>"
    )


def _size(v) -> str:
    """A batch size or noise scale: three significant digits, whole numbers from 1000 on."""
    return _fmt(v, ".0f" if v is not None and abs(v) >= 1000 else ".3g")


def _branch_row(i: int, b: dict) -> list:
    low, high = b.get("b_crit_low"), b.get("b_crit_high")
    run = b.get("b_noise_run")
    return [
        str(i),
        _fmt(b.get("samples_seen"), ".0f"),
        _fmt(b.get("val_loss"), ".3f"),
        _size(b.get("b_crit")),
        f"{_size(low)} - {_size(high)}" if low is not None or high is not None else "-",
        _fmt(b.get("chi2_p"), ".3f"),
        "accepted" if b.get("fit_ok") else "rejected: curve kept",
        _size(b.get("b_noise")),
        _size(b.get("b_noise_adam")),
        _size(run),
        _size(None if run is None else CONFIGURED_FACTOR * run),
        _fmt(b.get("c"), ".3g"),
    ]


def _samples_table(cal: dict) -> str:
    """E(B) per branch point and GBS, with the measured efficiency E(B0)/E(B) in brackets."""
    grid = sorted({g for b in cal["branch_points"] for g in b.get("gbs") or []})
    rows = []
    for i, b in enumerate(cal["branch_points"]):
        by_gbs = {
            g: (e, se) for g, e, se in zip(b.get("gbs") or [], b.get("mean_samples") or [], b.get("efficiency") or [])
        }
        rows.append(
            [str(i)]
            + [f"{_fmt(by_gbs[g][0], '.0f')} ({_fmt(by_gbs[g][1], '.2f')})" if g in by_gbs else "-" for g in grid]
        )
    return _table(["branch"] + [f"B = {g}" for g in grid], rows)


def calibration_section(cal: dict) -> str:
    """A calibration (`copus calibrate`): what it measured per branch point, as two tables and
    two figures (E(B) against GBS; the critical batch against the loss, beside the noise-scale
    rule)."""
    head = [
        "branch",
        "samples seen",
        "val loss",
        "B_crit",
        "95% interval",
        "fit p",
        "linear form",
        "B_noise raw",
        "B_noise Adam",
        "B_noise run",
        f"{CONFIGURED_FACTOR:g} x B_noise run",
        "c = B_crit / B_noise run",
    ]
    rows = [_branch_row(i, b) for i, b in enumerate(cal["branch_points"])]
    figures = "".join(
        f'<figure class="plot" data-plot="{name}">{draw(cal)}</figure>' for name, draw in CALIBRATION_FIGURES.items()
    )
    key = cal.get("key") or {}
    workload, settings = key.get("workload") or {}, cal.get("settings") or {}
    about = (
        f"Workload {workload.get('model', '?')}, sequence length {workload.get('seq_len', '?')}; reference GBS "
        f"B0 = {cal.get('reference_gbs', '?')}, loss decrement {cal.get('decrement', '?')}, "
        f"{settings.get('seeds', '?')} seed(s) per point; {_fmt(cal.get('wall_clock_s'), '.0f')} s to measure. "
        f"Every linear fit accepted: {'yes' if cal.get('all_fits_ok') else 'no'}. File: {cal.get('path', '')}"
    )
    return (
        f"<h2>Calibration {html.escape(str(cal.get('id', '?')))}</h2><p class='note'>{html.escape(about)}</p>"
        "<p class='note'>Per branch point of a reference run, continuations at every GBS B of the grid ran "
        "until the validation loss dropped by the decrement; E(B) is the samples that took. McCandlish et al. "
        "predict E = E_min (1 + B/B_crit); the fit is rejected (chi-square p &lt; "
        f"{FIT_P_MIN:g}) when the measured points do not follow it, and the measured curve is then what the "
        "planner uses. c is the factor from the run's own noise-scale estimate to the measured critical batch "
        "(the configured rule uses "
        f"{CONFIGURED_FACTOR:g}).</p>{_table(head, rows)}"
        "<p class='note'>Samples to the decrement E(B), mean over seeds (measured efficiency E(B0)/E(B)):</p>"
        f"{_samples_table(cal)}{figures}"
    )


def render_calibration(cal: dict) -> str:
    """The page of a calibration file alone."""
    title = f"calibration {cal.get('id', '?')}"
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>COPUS report: {html.escape(title)}</title>"
        f"<style>{CSS}</style></head><body><h1>COPUS report: {html.escape(title)}</h1>"
        f"<p class='note'>Generated {time.strftime('%Y-%m-%d %H:%M:%S')}.</p>{calibration_section(cal)}{CHECK}"
        "</body></html>"
    )


def tradeoff_section(data: ReportData) -> str:
    """What the search space offered: the fastest configuration per GBS of each profile table
    (measured points) and the trade-off figures, with the calibration's critical-batch growth."""
    parts = []
    branches = data.calibrations[0].get("branch_points") if data.calibrations else None
    for table in data.profiles:
        measured = {
            CandidateConfig.from_dict(r): r["gbs"] / r["step_time_s"]
            for r in table["rows"]
            if r.get("status") == "ok" and r.get("step_time_s")
        }
        if not measured:
            continue
        t = tradeoffs(measured, branches)
        rows = [[str(r["gbs"]), r["shape"], _fmt(r["samples_per_s"])] for r in t["fastest_by_gbs"]]
        notes = "".join(f"<p>{html.escape(line)}</p>" for line in tradeoff_lines(t))
        parts.append(
            f"<h3>profile {html.escape(str(table.get('key_id', '')))}</h3>{notes}"
            f"{_table(['GBS', 'fastest layout and MBS (measured)', 'samples/s'], rows)}"
        )
    return "<h2>What the search space offers</h2>" + "".join(parts) if parts else ""


def render(data: ReportData) -> str:
    figures = "".join(
        f'<figure class="plot" data-plot="{name}">{draw(data)}</figure>' for name, draw in FIGURES.items()
    )
    target = f"target validation loss {data.target}" if data.target is not None else "no target"
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>COPUS report: {html.escape(data.title)}</title>"
        f"<style>{CSS}</style></head><body><h1>COPUS report: {html.escape(data.title)}</h1>"
        f"<p class='note'>{len(data.runs)} run(s), {target}; generated {time.strftime('%Y-%m-%d %H:%M:%S')}. "
        "Dotted vertical lines: in-place GBS changes; dashed: layout changes with a restart.</p>"
        f"<h2>Time to target</h2>{problems_note(data)}{results_table(data)}<h2>Curves</h2>{figures}{audit_section(data)}"
        f"{tradeoff_section(data)}"
        f"{''.join(calibration_section(cal) for cal in data.calibrations)}{CHECK}"
        "</body></html>"
    )


def check_out(target: Location) -> None:
    """--out must name a file that can be written: not a directory, not under a file."""
    if target.is_dir():
        raise ReportError(f"{target}: a directory; --out names the HTML file to write")
    if not target.is_local:
        return
    parent = target.local_path().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ReportError(f"{target}: cannot be written ({parent} is not a writable directory)")


def build_report(source: str, out: str | None = None, tracking_uri: str | None = None) -> Path | Location:
    """SOURCE: an output directory (a path or an object-store URI), an MLflow run id, or a
    calibration file (its report goes next to it, <stem>-report.html, unless `out` says otherwise).
    Returns where the report was written (a Path when that is local)."""
    if out is not None:  # refused before anything is read
        check_out(Location.parse(out))
    src = output_location(source)
    if source.partition("?")[0].endswith(".json") or (src is not None and src.is_file()):
        if src is None or not src.is_file():
            raise ReportError(f"{source}: no such calibration file")
        page = render_calibration(load_calibration(src))
        default = src.parent / f"{src.name.removesuffix('.json')}-report.html"
    else:
        page = render(load(source, tracking_uri))
        on_disk = src is not None and src.is_dir()
        default = src / "report.html" if on_disk else Location.parse(Path("dashboards") / f"report-{source}.html")
    target = Location.parse(out) if out else default
    try:
        target.write_text(page)
    except IsADirectoryError:
        raise ReportError(f"{target}: a directory; --out names the HTML file to write") from None
    except OSError as err:  # StoreUnreachable is a StorageError: the command names it as it is
        if isinstance(err, StorageError):
            raise
        raise ReportError(f"{target}: cannot be written ({err.strerror or err})") from None
    return target.local_path() if target.is_local else target
