"""`copus report`: a self-contained HTML page from MLflow runs, every plot rendered in
headless Chromium; bad sources give a one-line error."""

from __future__ import annotations

import re
import shutil
import subprocess
import time

import pytest
from mlflow.entities import Metric

from copus.cli import main
from copus.tracking import Tracker

BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")


def _browser() -> str | None:
    found = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if found is None:
        for candidate in ("/usr/lib/chromium/chromium-headless-shell", "/usr/lib/chromium/chromium"):
            if shutil.which(candidate):
                return candidate
    return found


def _fake_comparison(tmp_path) -> str:
    """A parent run with two policy runs whose metrics look like training (logged through the
    same Tracker as `copus run`)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri, "report-test")
    parent = tracker.start_run("compare: demo", {}, {"kind": "comparison"})
    now = int(time.time() * 1000)
    for i, policy in enumerate(("copus", "static")):
        run = tracker.start_run(f"demo/{policy}", {}, {"policy": policy}, parent)
        metrics = []
        for step in range(1, 41):
            gbs = 16 if (policy == "static" or step < 20) else 32
            metrics += [Metric("wall_clock_s", step * 0.5, now, step), Metric("gbs", gbs, now, step),
                        Metric("dp", 2, now, step), Metric("tp", 1, now, step), Metric("pp", 1, now, step),
                        Metric("mbs", 4, now, step), Metric("samples_per_s", 100 + 10 * i, now, step),
                        Metric("statistical_efficiency", 1.0 / (1 + step / 100), now, step),
                        Metric("b_noise", 5 + step, now, step), Metric("train_loss", 5 - step / 10, now, step)]
            if step % 5 == 0:
                metrics.append(Metric("val_loss", 5 - step / (10 + i), now, step))
        tracker.log_metrics(run, metrics)
        tracker.log_dict(run, {"reconfigurations": [{"wall_clock_s": 10.0, "in_place": True}] if policy == "copus" else [],
                               "target_val_loss": 2.0, "reached_target": True, "time_to_target_s": 15.0 + i,
                               "final_val_loss": 1.9, "samples": 640}, "summary.json")
        tracker.finish(run)
    tracker.log_dict(parent, {"target_val_loss": 2.0, "policies": {
        "copus": {"runs": 1, "reached": 1, "time_to_target_s": 15.0, "final_val_loss": 1.9, "samples": 640,
                  "reconfigurations": 1.0, "speedup_vs_fastest_baseline": 1 / 15, "fastest_baseline": "static"},
        "static": {"runs": 1, "reached": 1, "time_to_target_s": 16.0, "final_val_loss": 1.9, "samples": 640,
                   "reconfigurations": 0.0}}}, "comparison.json")
    tracker.finish(parent)
    return parent


def test_report_renders_every_plot_in_headless_chromium(tmp_path, capsys):
    parent = _fake_comparison(tmp_path)
    out = tmp_path / "report.html"
    assert main(["report", parent, "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", "--out", str(out)]) == 0
    page = out.read_text()
    # Self-contained: nothing is fetched (namespace URIs inside the SVG are names, not loads).
    assert not re.search(r"""(src|href)=["']https?://|<link |@import|<script src""", page)
    assert page.count('<figure class="plot"') == 5 and "+6.7% vs static" in page
    browser = _browser()
    if browser is None:
        pytest.skip("no Chromium here (make test installs chromium-headless-shell where it can)")
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
                          "--dump-dom", out.resolve().as_uri()], capture_output=True, text=True, timeout=120).stdout
    expected = re.search(r'data-plots-expected="(\d+)"', dom)
    rendered = re.search(r'data-plots-rendered="(\d+)"', dom)
    assert expected and rendered, dom[:500]
    assert int(expected.group(1)) == int(rendered.group(1)) == 5


def test_report_of_a_missing_source_is_one_line(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "no comparison.json or summary.json" in capsys.readouterr().err
    assert main(["report", "0123abc", "--tracking-uri", f"sqlite:///{tmp_path / 'db.sqlite'}"]) == 2
    assert "no MLflow run 0123abc" in capsys.readouterr().err
