"""A run's decisions replayed (copus.cluster.replay): tests/data/replay is a copus run of the CPU
rule suite (experiments/compare_cpu_rule.yaml, seed 7300, no calibration, the quantile rule),
recorded by the controller as it was before its probe side moved to cluster/controller_probes.py,
and before the horizon's fit window and the run's own speed changed (Dec 2026: the run's rules
then are `policy.horizon_points=8`, `policy.read_run_speed=false`). Fed its records, today's
controller with those two settings makes the same decisions, field for field."""

import json
from pathlib import Path

from copus.cluster.profile_table import ProfileTable
from copus.cluster.replay import first_difference, main, replay_records
from copus.config import load_config
from tests.conftest import REPO

DATA = Path(__file__).parent / "data" / "replay"
EXPERIMENT = REPO / "experiments" / "tradeoff_cpu.yaml"
RECORDED_RULES = ["policy.horizon_points=8", "policy.read_run_speed=false"]  # the rules the run was made with


def _records() -> list[dict]:
    return [json.loads(line) for line in (DATA / "records.jsonl").read_text().splitlines() if line.strip()]


def _recorded() -> list[dict]:
    return json.loads((DATA / "summary.json").read_text())["controller"]["evaluations"]


def test_the_recorded_runs_decisions_are_made_again_field_for_field(tmp_path):
    cfg = load_config(EXPERIMENT, ["policy.name=copus", *RECORDED_RULES, f"output_dir={tmp_path}"])
    replay = replay_records(cfg, ProfileTable.load(DATA / "profile.json"), _records())
    recorded = _recorded()
    assert replay.stopped_at_probe is None
    assert any(e["switch"] for e in recorded) and any(not e["switch"] for e in recorded)
    assert replay.evaluations == recorded
    assert first_difference(replay.evaluations, recorded) is None


def test_another_rule_on_the_same_records_is_told_apart(tmp_path, capsys):
    """The threshold rule weighs no quantile and no horizon: the replay says where it parts."""
    cfg = load_config(
        EXPERIMENT, ["policy.name=copus", "policy.decision_rule=threshold", *RECORDED_RULES, f"output_dir={tmp_path}"]
    )
    replay = replay_records(cfg, ProfileTable.load(DATA / "profile.json"), _records())
    diff = first_difference(replay.evaluations, _recorded())
    assert diff is not None and diff.startswith("decision 0 ") and "rule" in diff
    sets = [x for rule in RECORDED_RULES for x in ("--set", rule)]
    args = [str(EXPERIMENT), str(DATA), "--table", str(DATA / "profile.json"), *sets, "--set", f"output_dir={tmp_path}"]
    assert main(args) == 0
    assert capsys.readouterr().out.strip().endswith("identical to the run's")
    assert main([*args, "--set", "policy.decision_rule=threshold"]) == 1
    assert "not the run's: decision 0 " in capsys.readouterr().out


def test_a_replay_stops_at_a_probes_branch_checkpoint(tmp_path):
    records = _records()
    at = next(i for i, r in enumerate(records) if r["kind"] == "step" and r["step"] == 50)
    branch = {"kind": "checkpoint", "step": 50, "samples": records[at]["samples"], "branch": True}
    cfg = load_config(EXPERIMENT, ["policy.name=copus", *RECORDED_RULES, f"output_dir={tmp_path}"])
    replay = replay_records(
        cfg, ProfileTable.load(DATA / "profile.json"), [*records[: at + 1], branch, *records[at + 1 :]]
    )
    assert replay.stopped_at_probe == 50
    assert replay.evaluations == _recorded()[: len(replay.evaluations)]
