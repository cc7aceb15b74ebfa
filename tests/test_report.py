"""`copus report`: a self-contained HTML page from MLflow runs, every plot rendered in
headless Chromium; bad sources give a one-line error."""

from __future__ import annotations

import json
import re
import time

import pytest
from mlflow.entities import Metric

from copus.cli import main
from copus.storage import Location
from copus.tracking import Tracker
from tests.browser import dump_dom

# A reconfiguration as summary.json lists it (copus.core.reconfiguration.Reconfiguration.as_dict).
CHANGE = {
    "step": 20,
    "samples": 320,
    "wall_clock_s": 10.0,
    "from": {"dp": 2, "tp": 1, "pp": 1, "mbs": 4, "gbs": 16},
    "to": {"dp": 2, "tp": 1, "pp": 1, "mbs": 4, "gbs": 32},
    "in_place": True,
}


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
            metrics += [
                Metric("wall_clock_s", step * 0.5, now, step),
                Metric("gbs", gbs, now, step),
                Metric("dp", 2, now, step),
                Metric("tp", 1, now, step),
                Metric("pp", 1, now, step),
                Metric("mbs", 4, now, step),
                Metric("samples_per_s", 100 + 10 * i, now, step),
                Metric("statistical_efficiency", 1.0 / (1 + step / 100), now, step),
                Metric("b_noise", 5 + step, now, step),
                Metric("train_loss", 5 - step / 10, now, step),
            ]
            if step % 5 == 0:
                metrics.append(Metric("val_loss", 5 - step / (10 + i), now, step))
        tracker.log_metrics(run, metrics)
        tracker.log_dict(
            run,
            {
                "reconfigurations": [CHANGE] if policy == "copus" else [],
                "target_val_loss": 2.0,
                "reached_target": True,
                "time_to_target_s": 15.0 + i,
                "final_val_loss": 1.9,
                "samples": 640,
            },
            "summary.json",
        )
        tracker.finish(run)
    tracker.log_dict(
        parent,
        {
            "target_val_loss": 2.0,
            "policies": {
                "copus": {
                    "runs": 1,
                    "reached": 1,
                    "time_to_target_s": 15.0,
                    "final_val_loss": 1.9,
                    "samples": 640,
                    "reconfigurations": 1.0,
                    "speedup_vs_fastest_baseline": 1 / 15,
                    "fastest_baseline": "static",
                },
                "static": {
                    "runs": 1,
                    "reached": 1,
                    "time_to_target_s": 16.0,
                    "final_val_loss": 1.9,
                    "samples": 640,
                    "reconfigurations": 0.0,
                },
            },
        },
        "comparison.json",
    )
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
    dom = dump_dom(out.resolve().as_uri())
    expected = re.search(r'data-plots-expected="(\d+)"', dom)
    rendered = re.search(r'data-plots-rendered="(\d+)"', dom)
    assert expected and rendered, dom[:500]
    assert int(expected.group(1)) == int(rendered.group(1)) == 5


def test_report_of_a_missing_source_is_one_line(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "no comparison.json or summary.json" in capsys.readouterr().err
    assert main(["report", "0123abc", "--tracking-uri", f"sqlite:///{tmp_path / 'db.sqlite'}"]) == 2
    assert "0123abc: no such output directory or calibration file, and not an MLflow run id" in capsys.readouterr().err
    run_id = "0123456789abcdef0123456789abcdef"
    assert main(["report", run_id, "--tracking-uri", f"sqlite:///{tmp_path / 'db.sqlite'}"]) == 2
    assert f"no MLflow database at sqlite:///{tmp_path / 'db.sqlite'}" in capsys.readouterr().err
    assert not (tmp_path / "db.sqlite").exists()  # a report only reads: it creates no database


def test_report_has_a_predicted_vs_realized_panel_for_audited_changes(tmp_path):
    """A summary whose GBS changes were audited (copus.core.audit) gets the panel: a plot of
    predicted against realized efficiency gain and a table; one without gets neither."""
    from dashboards.data import ReportData, RunSeries
    from dashboards.report import render

    layout = {"dp": 2, "tp": 1, "pp": 1, "mbs": 4}
    audited = [
        {
            "step": 20,
            "samples": 320,
            "wall_clock_s": 10.0,
            "in_place": True,
            "from": {**layout, "gbs": 16},
            "to": {**layout, "gbs": 32},
            "predicted_efficiency_gain": 0.8,
            "realized_efficiency_gain": 0.62,
            "realized_efficiency_interval": [0.55, 0.7],
            "audit_points": {"before": 20, "after": 15},
            "audit_note": "power-law fit of loss against effective samples, 20 points before, 15 after",
        },
        {
            "step": 35,
            "samples": 800,
            "wall_clock_s": 17.5,
            "in_place": True,
            "from": {**layout, "gbs": 32},
            "to": {**layout, "gbs": 64},
            "predicted_efficiency_gain": 0.75,
            "realized_efficiency_gain": None,
            "realized_efficiency_interval": None,
            "audit_points": {"before": 15, "after": 2},
            "audit_note": "too few points after the change (2 < 10 after skipping 5 settling steps)",
        },
        {
            "step": 38,
            "samples": 992,
            "wall_clock_s": 19.0,
            "in_place": True,
            "from": {**layout, "gbs": 64},
            "to": {**layout, "dp": 1, "pp": 2, "gbs": 64},
            "predicted_efficiency_gain": None,
            "realized_efficiency_gain": None,
            "audit_note": "no change of GBS: nothing to audit",
        },
    ]
    metrics = {
        "wall_clock_s": {s: s * 0.5 for s in range(1, 41)},
        "gbs": {s: 16.0 for s in range(1, 41)},
        "val_loss": {s: 5 - s / 10 for s in range(5, 41, 5)},
    }
    copus = RunSeries("demo/copus", "copus", "r1", metrics, {"reconfigurations": audited, "target_val_loss": 2.0})
    static = RunSeries("demo/static", "static", "r2", metrics, {"reconfigurations": [], "target_val_loss": 2.0})
    page = render(ReportData("demo", [copus, static], None, 2.0))
    assert "Predicted vs realized statistical efficiency" in page
    assert page.count('<figure class="plot"') == 6 and 'data-plot="efficiency-audit"' in page
    assert "0.800" in page and "0.620" in page and "0.550 - 0.700" in page and "too few points after" in page
    assert "16 -&gt; 32" in page and "nothing to audit" not in page  # layout-only changes are not listed
    plain = render(ReportData("demo", [static], None, 2.0))
    assert "Predicted vs realized" not in plain and plain.count('<figure class="plot"') == 5
    out = tmp_path / "report.html"
    out.write_text(page)
    dom = dump_dom(out.resolve().as_uri())
    assert 'data-plots-expected="6"' in dom and 'data-plots-rendered="6"' in dom, dom[:500]


def _calibration(path, cal_id: str = "abc123def456") -> dict:
    """A calibration file as `copus calibrate` writes it: one branch point whose linear fit was
    accepted (two seeds, one GBS never reaching the decrement on one seed), one rejected, and
    values not measured as null."""
    fitted = {
        "val_loss": 4.135,
        "decrement": 0.3,
        "samples_seen": 160,
        "gbs": [4, 8, 16, 64],
        "mean_samples": [15.7, 22.8, 34.8, 90.8],
        "sd_samples": [0.5, 0.7, 1.0, None],
        "efficiency": [2.217, 1.526, 1.0, 0.383],
        "b_crit": 8.614,
        "b_crit_low": 6.25,
        "b_crit_high": 11.5,
        "e_min": 11.30,
        "s_min": 1.311,
        "chi2_p": 0.0816,
        "fit_ok": True,
        "b_noise": 0.882,
        "b_noise_adam": None,
        "b_noise_run": 1.083,
        "c": 7.955,
    }
    rejected = {
        **fitted,
        "val_loss": 3.154,
        "samples_seen": 320,
        "mean_samples": [145.3, 195.0, 295.5, 1201.1],
        "efficiency": [2.035, 1.515, 1.0, 0.246],
        "b_crit": 4.639,
        "b_crit_low": 3.1,
        "b_crit_high": None,
        "e_min": 73.41,
        "s_min": 15.82,
        "chi2_p": 0.0077,
        "fit_ok": False,
        "b_noise": 35.62,
        "b_noise_adam": 41.59,
        "b_noise_run": 1.088,
        "c": 4.263,
    }
    points = [
        {
            "branch": i,
            "gbs": g,
            "seed": s,
            "samples": e * (1 + 0.03 * s),
            "steps": e / g,
            "reached": True,
            "val_loss": b["val_loss"],
        }
        for i, b in enumerate((fitted, rejected))
        for g, e in zip(b["gbs"], b["mean_samples"])
        for s in (0, 1)
    ]
    points.append(
        {"branch": 0, "gbs": 64, "seed": 2, "samples": None, "steps": None, "reached": False, "val_loss": 4.135}
    )
    data = {
        "id": cal_id,
        "key": {
            "schema_version": 1,
            "kind": "calibration",
            "workload": {"model": "tiny<b>", "seq_len": 128, "data": "f00"},
        },
        "reference_gbs": 16,
        "decrement": 0.3,
        "branch_points": [fitted, rejected],
        "points": points,
        "wall_clock_s": 289.9,
        "all_fits_ok": False,
        "b_crit_growth": 0.54,
        "settings": {"gbs": [4, 8, 16, 64], "branch_samples": [160, 320], "seeds": 2},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return data


def _rendered_in_chromium(out, expected: int) -> None:
    dom = dump_dom(out.resolve().as_uri())
    assert f'data-plots-expected="{expected}"' in dom and f'data-plots-rendered="{expected}"' in dom, dom[:500]


def test_report_of_a_calibration_file_alone(tmp_path, capsys):
    """`copus report calibration-<id>.json`: no MLflow; a table per branch point (B_crit and its
    interval, the fit's p-value and verdict, the noise scales and c), E(B) by GBS, and two
    figures; the page goes next to the file."""
    path = tmp_path / "profiles" / "calibration-abc123def456.json"
    _calibration(path)
    assert main(["report", str(path)]) == 0
    out = tmp_path / "profiles" / "calibration-abc123def456-report.html"
    assert str(out.resolve()) in capsys.readouterr().out
    page = out.read_text()
    assert not re.search(r"""(src|href)=["']https?://|<link |@import|<script src""", page)
    assert "<h2>Calibration abc123def456</h2>" in page and "tiny&lt;b&gt;" in page and "tiny<b>" not in page
    assert page.count('<figure class="plot"') == 2
    assert 'data-plot="calibration-samples"' in page and 'data-plot="calibration-critical-batch"' in page
    rows = re.findall(r"<tr>(.*?)</tr>", page)
    fitted = [re.sub(r"</?td>", "|", r) for r in rows if r.startswith("<td>0</td><td>160</td>")][0]
    assert "|8.61|" in fitted and "|6.25 - 11.5|" in fitted and "|0.082|" in fitted and "|accepted|" in fitted
    assert "|0.882|" in fitted and "|-|" in fitted and "|1.08|" in fitted and "|2.17|" in fitted and "|7.96|" in fitted
    rejected = [re.sub(r"</?td>", "|", r) for r in rows if r.startswith("<td>1</td><td>320</td>")][0]
    assert "|3.1 - -|" in rejected and "|rejected: curve kept|" in rejected and "|41.6|" in rejected
    assert "|4.26|" in rejected
    assert "<th>B = 64</th>" in page and "<td>1201 (0.25)</td>" in page
    _rendered_in_chromium(out, 2)


def test_report_of_a_calibration_file_that_is_not_one(tmp_path, capsys):
    assert main(["report", str(tmp_path / "calibration-missing.json")]) == 2
    assert "no such calibration file" in capsys.readouterr().err
    other = tmp_path / "summary.json"
    other.write_text(json.dumps({"target_val_loss": 2.0}))
    assert main(["report", str(other)]) == 2
    assert "not a calibration file" in capsys.readouterr().err
    broken = tmp_path / "calibration-broken.json"
    broken.write_text("{")
    assert main(["report", str(broken)]) == 2
    assert "not a readable calibration file" in capsys.readouterr().err


def test_report_of_an_output_directory_appends_its_calibrations(tmp_path):
    """A run's or comparison's output directory whose profiles/ holds calibrations: the report
    gets a calibration section (table and two figures) per calibration after its curves; a
    file there that is not a calibration is passed over."""
    parent = _fake_comparison(tmp_path)
    outdir = tmp_path / "compare-demo"
    outdir.mkdir()
    (outdir / "summary.json").write_text(
        json.dumps({"mlflow_tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "mlflow_run_id": parent})
    )
    _calibration(outdir / "profiles" / "calibration-abc123def456.json")
    (outdir / "profiles" / "calibration-notes.json").write_text("[]")
    rows = [
        {"dp": 2, "tp": 1, "pp": 1, "mbs": 4, "gbs": 8, "status": "ok", "step_time_s": 0.2},
        {"dp": 1, "tp": 1, "pp": 2, "mbs": 8, "gbs": 64, "status": "ok", "step_time_s": 0.4},
        {"dp": 2, "tp": 1, "pp": 1, "mbs": 8, "gbs": 64, "status": "infeasible", "reason": "memory"},
    ]
    (outdir / "profiles" / "profile-0123456789ab.json").write_text(json.dumps({"key_id": "0123456789ab", "rows": rows}))
    assert main(["report", str(outdir)]) == 0
    page = (outdir / "report.html").read_text()
    # What the search space offered: 40 -> 160 samples/s, the fastest shape changes, B_crit's growth.
    assert "<h2>What the search space offers</h2>" in page and "x4.00; fastest layout and MBS change" in page
    assert "measured critical batch" in page
    assert page.count('<figure class="plot"') == 7 and page.count("<h2>Calibration ") == 1
    assert page.index("<h2>Curves</h2>") < page.index("<h2>Calibration abc123def456</h2>")
    assert "rejected: curve kept" in page and "+6.7% vs static" in page
    _rendered_in_chromium(outdir / "report.html", 7)


def test_the_speedup_cell_shows_goodputs_two_sides_against_the_best_baseline():
    from dashboards.report import speedup_cell

    entry = {
        "speedup_vs_fastest_baseline": 0.15,
        "fastest_baseline": "static",
        "paired_speedup_mean": 0.16,
        "paired_speedup_ci95": [0.08, 0.25],
        "vs_best_baseline": {
            "baseline": "tuned-static",
            "samples_ratio": 0.79,
            "samples_ratio_ci95": [0.71, 0.87],
            "speed_ratio": 1.48,
            "speed_ratio_ci95": [1.31, 1.66],
        },
    }
    assert speedup_cell(entry) == (
        "+15.0% vs static; paired +16.0% (95% CI +8.0% .. +25.0%); vs tuned-static: statistical side x0.79 "
        "(0.71 .. 0.87), throughput side x1.48 (1.31 .. 1.66)"
    )
    one_pair = {**entry, "vs_best_baseline": {**entry["vs_best_baseline"], "samples_ratio_ci95": None}}
    assert "statistical side" not in speedup_cell(one_pair)  # no interval, no claim


def test_a_summary_or_comparison_that_cannot_be_read_is_named_in_the_report(tmp_path):
    """A run's summary.json that is not JSON, a run without one, and a comparison.json that is
    not JSON: the page names each file and what failed, and the table shows no outcome for those
    runs where it would otherwise read "reached target: no" with 0 reconfigurations."""
    from dashboards.report import render

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri, "report-test")
    parent = tracker.start_run("compare: broken", {}, {"kind": "comparison"})
    broken = tracker.start_run("broken/copus", {}, {"policy": "copus"}, parent)
    tracker.client.log_text(broken, '{"reached_target": tr', "summary.json")  # cut short
    tracker.finish(broken)
    unfinished = tracker.start_run("broken/static", {}, {"policy": "static"}, parent)
    tracker.client.log_text(parent, "not json", "comparison.json")
    tracker.finish(parent)

    from dashboards.data import load

    data = load(parent, uri)
    page = render(data)
    assert data.comparison is None and len(data.problems) == 3
    assert f"comparison.json of run {parent}: could not be read (JSONDecodeError: " in page
    assert "no paired statistics shown" in page
    assert "run broken/copus: summary.json of run " in page and "could not be read (JSONDecodeError: " in page
    assert "run broken/static: no summary.json (MLflow status RUNNING)" in page
    assert unfinished in {r.run_id for r in data.runs}
    rows = re.findall(r"<tr><td>(copus|static)</td><td>([^<]*)</td>", page)
    assert rows == [(policy, "unknown: no readable summary (see above)") for policy in ("copus", "static")]


def test_the_speedup_cell_says_which_pairs_were_left_out_in_the_words_of_the_cli_table():
    """copus missed the target on one seed: no speedup by mean time, but the paired log-ratio
    against the best baseline stands on the other pairs, and the cell says one was left out, in
    the same words as the printed table (one function writes both)."""
    from copus.cluster.compare import comparison_table
    from copus.core.comparison import summarize
    from dashboards.report import speedup_cell

    def row(policy, repeat, t):
        return {
            "policy": policy,
            "repeat": repeat,
            "seed": 100 + repeat,
            "time_to_target_s": t,
            "reached_target": t is not None,
            "wall_clock_s": t or 300.0,
            "final_val_loss": 2.0,
            "samples": 500,
            "reconfigurations": 1,
            "output_dir": f"runs/s/{policy}/r{repeat}",
        }

    runs = [row("copus", r, t) for r, t in enumerate([80.0, None, 85.0, 82.0])]
    runs += [row("static", r, t) for r, t in enumerate([100.0, 110.0, 95.0, 99.0])]
    policies = summarize(runs, ["copus", "static"])
    cell = speedup_cell(policies["copus"], "copus")
    assert policies["copus"]["speedup_vs_fastest_baseline"] is None
    assert cell.startswith("vs static: ") and "3 pairs, 1 left out: copus missed the target" in cell
    printed = comparison_table({"policies": policies, "runs": runs})
    assert cell.removeprefix("vs static: ").split("; statistical side")[0] in printed


def test_without_chromium_the_browser_check_skips_saying_so_and_fails_where_ci_is_true(monkeypatch):
    import tests.browser

    monkeypatch.setattr(tests.browser, "browser", lambda: None)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no Chromium here"):
        tests.browser.require_browser()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true and no Chromium here"):
        tests.browser.dump_dom("file:///nothing.html")


def test_profile_files_and_reconfigurations_that_cannot_be_read_are_named_not_passed_over(tmp_path):
    """A calibration and a profile table in the output directory's profiles/ that are not what
    their names say, and a summary.json whose reconfigurations hold an entry that is none: each
    is named among the report's problems (shown above its table), not silently left out."""
    from dashboards.data import RunSeries, _summary_problems, calibrations_in, changes, profiles_in

    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "calibration-x.json").write_text('{"points": [')
    (tmp_path / "profiles" / "profile-y.json").write_text('{"rows": 3}')
    problems: list[str] = []
    root = Location.parse(tmp_path)
    assert calibrations_in(root, problems) == [] and profiles_in(root, problems) == []
    assert [p.split("/")[-1] for p in problems] == [
        "calibration-x.json: not a readable calibration file (JSONDecodeError): not shown",
        "profile-y.json: no rows: not shown",
    ]
    run = RunSeries("cmp/copus", "copus", "0" * 32, summary={"reconfigurations": [{"step": 3}, "torn"]})
    assert changes(run) == []
    assert _summary_problems([run]) == [
        "cmp/copus: 2 of 2 reconfigurations in summary.json could not be read: left out"
    ]
