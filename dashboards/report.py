"""`copus report`: one self-contained HTML file (inline SVG plots, inline CSS, no network)
from a comparison's or a run's MLflow data.

The page carries a small script that checks, in the browser, that every figure rendered
(an <svg> with a non-empty box) and records the count on <body data-plots-rendered>, which is
how the test checks it in headless Chromium.
"""

from __future__ import annotations

import html
import time
from pathlib import Path

from dashboards.data import ReportData, load
from dashboards.plots import FIGURES

CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:960px;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 10px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}figure{margin:1.5em 0}
figure svg{max-width:100%;height:auto}.note{color:#666;font-size:90%}"""

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


def results_table(data: ReportData) -> str:
    rows = []
    stats = (data.comparison or {}).get("policies")
    if stats:
        for policy, s in stats.items():
            speed = s.get("speedup_vs_fastest_baseline")
            rows.append([policy, f"{s['reached']}/{s['runs']}", _fmt(s["time_to_target_s"]), _fmt(s["final_val_loss"], ".4f"),
                         _fmt(s["samples"], ".0f"), _fmt(s["reconfigurations"], ".1f"),
                         f"{speed:+.1%} vs {s['fastest_baseline']}" if speed is not None else ""])
    else:
        for r in data.runs:
            s = r.summary
            rows.append([r.policy, "yes" if s.get("reached_target") else "no", _fmt(s.get("time_to_target_s")),
                         _fmt(s.get("final_val_loss"), ".4f"), _fmt(s.get("samples"), ".0f"),
                         str(len(s.get("reconfigurations", []))), ""])
    head = ["policy", "reached target", "time to target (s)", "final val loss", "samples", "reconfigurations",
            "speedup"]
    cells = "".join(f"<tr>{''.join(f'<td>{html.escape(str(c))}</td>' for c in row)}</tr>" for row in rows)
    return f"<table><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr>{cells}</table>"


def render(data: ReportData) -> str:
    figures = "".join(f'<figure class="plot" data-plot="{name}">{draw(data)}</figure>' for name, draw in FIGURES.items())
    target = f"target validation loss {data.target}" if data.target is not None else "no target"
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>COPUS report: {html.escape(data.title)}</title>"
            f"<style>{CSS}</style></head><body><h1>COPUS report: {html.escape(data.title)}</h1>"
            f"<p class='note'>{len(data.runs)} run(s), {target}; generated {time.strftime('%Y-%m-%d %H:%M:%S')}. "
            "Dotted vertical lines: in-place GBS changes; dashed: layout changes with a restart.</p>"
            f"<h2>Time to target</h2>{results_table(data)}<h2>Curves</h2>{figures}{CHECK}</body></html>")


def build_report(source: str, out: str | None = None, tracking_uri: str | None = None) -> Path:
    data = load(source, tracking_uri)
    path = Path(out) if out else (Path(source) / "report.html" if Path(source).is_dir() else Path("dashboards") / f"report-{source}.html")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(data))
    return path
