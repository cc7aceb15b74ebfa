"""Real runs read for the emulated cluster's simulated setting (copus.sim.fit): a run's records
give its trajectory and the wall-clock it spends outside its steps; `copus simulate --suite`
predicts a comparison suite's runs."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from copus.sim.fit import main as fit_main
from copus.sim.fit import overheads_of, trajectory_of

REPO = Path(__file__).resolve().parents[1]
PROFILE = REPO / "docs" / "results" / "profile-emulated-layout.json"


def _write_run(path: Path, layout=(2, 1, 1), gbs=8) -> Path:
    """A run's records.jsonl: started at 30 s, a step-0 evaluation, three steps of 1 s each
    0.1 s apart, an evaluation of 0.5 s after step 2 (and one GBS change at step 3)."""
    dp, tp, pp = layout

    def step(k: int, wall: float, g: int = gbs) -> dict:
        shape = {"gbs": g, "mbs": 4, "dp": dp, "tp": tp, "pp": pp}
        return {"kind": "step", "step": k, "samples": 8 * k, **shape, "step_time_s": 1.0, "wall_clock_s": wall}

    lines = [
        {"kind": "start", "step": 0, "samples": 0, "wall_clock_s": 30.0},
        {"kind": "eval", "step": 0, "samples": 0, "val_loss": 5.5, "wall_clock_s": 32.0, "eval_time_s": 2.0},
        step(1, 33.0), step(2, 34.1),
        {"kind": "eval", "step": 2, "samples": 16, "val_loss": 4.0, "wall_clock_s": 34.6, "eval_time_s": 0.5},
        step(3, 35.7, 16),
    ]  # fmt: skip
    path.mkdir(parents=True)
    (path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


def test_a_runs_records_give_its_trajectory_and_its_overheads(tmp_path):
    run = _write_run(tmp_path / "a")
    t = trajectory_of(run)
    assert t.gbs_per_step == (8, 8, 16) and t.evals == ((0, 5.5), (16, 4.0))
    o = overheads_of([run, _write_run(tmp_path / "b", layout=(1, 1, 2))])
    assert o["startup_s"] == pytest.approx(32.0)  # first step's end less its time
    assert o["between_steps_s"] == pytest.approx(0.1)  # the gaps, evaluations taken out
    assert o["eval_s"] == {"dp1-tp1-pp2": pytest.approx(0.5), "dp2-tp1-pp1": pytest.approx(0.5)}
    assert o["runs"] == 2 and o["step_time_s"]["dp2-tp1-pp1 mbs4 gbs8"] == pytest.approx(1.0)


def test_the_runs_step_times_over_a_profile_give_the_run_factor_by_layout(tmp_path, capsys):
    from copus.core.layout import CandidateConfig
    from copus.sim.config import read_profile_steps
    from copus.sim.fit import run_factor

    runs = [_write_run(tmp_path / "a"), _write_run(tmp_path / "b", layout=(1, 1, 2))]
    profile = read_profile_steps(PROFILE, "--profile", "tiny", 128, 2)
    factor = run_factor(overheads_of(runs), profile)
    for row in factor["configs"]:  # every step took 1.0 s
        config = CandidateConfig.from_dict({**row, **_fields(row["config"])})
        assert row["ratio"] == pytest.approx(1.0 / profile.profile_step_time(config))
    # Per layout, the configuration that ran the most steps (GBS 8: 2 of 3) decides the median.
    for layout in ("dp2-tp1-pp1", "dp1-tp1-pp2"):
        gbs8 = next(r for r in factor["configs"] if r["layout"] == layout and r["config"].endswith("gbs8"))
        assert factor["by_layout"][layout] == gbs8["ratio"] and gbs8["steps"] == 2
    experiment = str(REPO / "experiments/emulated_layout.yaml")
    assert fit_main([*map(str, runs), "--experiment", experiment, "--profile", str(tmp_path / "none.json")]) == 2
    assert capsys.readouterr().err.startswith(f"copus.sim.fit: --profile: {tmp_path / 'none.json'}: file not found")
    # a profile of another sequence length: the refusal says what the runs' experiment is
    other = yaml.safe_load((REPO / "experiments/quickstart.yaml").read_text())
    other["workload"]["seq_len"] = 64
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(other))
    assert fit_main([*map(str, runs), "--experiment", str(tmp_path / "other.yaml"), "--profile", str(PROFILE)]) == 2
    err = capsys.readouterr().err
    assert "seq_len 128 on 2 workers; the runs' experiment is tiny, seq_len 64 on 2 (cluster.num_workers)" in err, err


def _fields(label: str) -> dict:
    """dp2-tp1-pp1 mbs4 gbs8 -> its fields."""
    layout, mbs, gbs = label.split()
    dp, tp, pp = (int(part[2:]) for part in layout.split("-"))
    return {"dp": dp, "tp": tp, "pp": pp, "mbs": int(mbs[3:]), "gbs": int(gbs[3:])}


def test_a_directory_without_records_is_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "records.jsonl").write_text("")
    assert fit_main([str(tmp_path / "empty"), "--experiment", str(REPO / "experiments/emulated_layout.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "records.jsonl: no step or validation records" in err


def test_simulate_predicts_the_emulated_layout_suite():
    out = subprocess.run(
        [sys.executable, "-m", "copus.cli", "simulate", "experiments/sim/emulated_layout.yaml",
         "--suite", "experiments/compare_emulated_layout.yaml", "--json"],
        cwd=REPO, capture_output=True, text=True, check=True,
    )  # fmt: skip
    p = json.loads(out.stdout)
    assert set(p["policies"]) == {"copus", "copus-gbs", "static", "cbs-pessimistic", "cbs-optimistic"}
    assert all(e["runs"] == 8 for e in p["policies"].values())  # one per evaluation seed
    assert set(p["tuning_candidates"]) == {f"static-gbs{g}" for g in (4, 8, 16, 32, 64)} | {
        f"ramp-{n}" for n in (320, 960, 1920)
    }
    assert all(e["runs"] == 3 for e in p["tuning_candidates"].values())  # one per tuning seed
    assert p["tuned"]["tuned-static"]["candidate"] == p["predicted_picks"]["tuned-static"]
    assert all(e["runs"] == 8 for e in p["tuned"].values())
    assert set(p["ranking"]) == set(p["policies"]) | {"tuned-static", "tuned-ramp"}
    times = [e["time_to_target_s"] for e in (p["policies"] | p["tuned"]).values()]
    assert all(t is None or t > p["overheads"]["startup_s"] for t in times)
    # The prediction committed before the suite's evaluation is what the command gives.
    committed = json.loads((REPO / "docs" / "results" / "sim-emulated-layout-prediction.json").read_text())
    assert p["ranking"] == committed["ranking"]
    for name, e in (committed["policies"] | committed["tuned"]).items():
        assert (p["policies"] | p["tuned"])[name]["time_to_target_s"] == pytest.approx(e["time_to_target_s"], rel=1e-9)


def _entry(time_s: float, samples: float) -> dict:
    return {"time_to_target_s": time_s, "samples": samples, "layout_changes": [0]}


def test_a_prediction_is_set_against_the_measured_suite_and_its_miss_split_in_two():
    from copus.sim.suite import check_prediction

    prediction = {
        "policies": {"copus": _entry(100.0, 2000.0), "static": _entry(120.0, 3000.0)},
        "tuned": {"tuned-static": _entry(90.0, 1800.0)},
        "overheads": {"startup_s": 20.0},
    }
    runs = [
        {"policy": "copus", "time_to_target_s": t, "reached_target": True, "samples": 2400, "reconfigurations": 1}
        for t in (100.0, 134.56)  # geometric mean 116: 20 s of start-up, then 2,400 samples at 25/s
    ] + [
        {"policy": "static", "time_to_target_s": 126.0, "reached_target": True, "samples": 3000},
        {"policy": "tuned-static", "time_to_target_s": 95.0, "reached_target": True, "samples": 1800},
    ]
    c = check_prediction(prediction, {"suite": "s", "runs": runs})
    copus = c["entries"]["copus"]
    assert copus["measured_s"] == pytest.approx(116.0, rel=1e-4) and copus["ratio"] == pytest.approx(1.16, rel=1e-4)
    assert not copus["within_15pct"] and c["entries"]["static"]["within_15pct"]
    m = copus["log_miss"]  # more samples (x1.2) at the predicted speed: all of it statistical
    assert m["samples"] == pytest.approx(math.log(1.2)) and m["throughput"] == pytest.approx(0.0, abs=1e-4)
    assert m["samples"] + m["throughput"] + m["startup"] == pytest.approx(m["time"])
    assert c["predicted_ranking"] == ["tuned-static", "copus", "static"]
    assert c["measured_ranking"] == ["tuned-static", "copus", "static"] and c["same_ranking"]
    assert not c["all_within_15pct"]


def test_measured_without_suite_or_of_another_suite_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    from copus.cli import main as cli_main

    monkeypatch.chdir(REPO)
    sim = "experiments/sim/emulated_layout.yaml"
    other = tmp_path / "comparison.json"
    other.write_text(json.dumps({"suite": "another", "runs": []}))
    for argv, message in (
        (["simulate", sim, "--measured", str(other)], "--measured: needs --suite"),
        (["simulate", sim, "--suite", "experiments/compare_emulated_layout.yaml", "--measured", str(other)],
         "is suite 'another''s, not 'compare-emulated-layout''s"),
    ):  # fmt: skip
        assert cli_main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and message in err
