"""What a resumed suite keeps (copus.cluster.compare_resume): whole units only, and only its own."""

import json

import pytest

from copus.cluster.compare_resume import resume_point
from copus.config import ConfigError
from copus.storage import Location


def _row(policy, repeat):
    return {"policy": policy, "repeat": repeat, "seed": 7 + repeat}


def _write(tmp_path, document):
    (tmp_path / "comparison.json").write_text(json.dumps(document))
    return Location.parse(str(tmp_path))


def test_only_whole_repeats_and_a_written_choice_are_kept(tmp_path):
    orders = [["copus", "static"], ["static", "copus"], ["copus", "static"]]
    runs = [_row("copus", 0), _row("static", 0), _row("static", 1)]  # repeat 1 cut after its first run
    tuning = {"run_order": [["a", "b"], ["b", "a"]], "runs": [_row("static", 0), _row("static", 0), _row("static", 1)]}
    doc = {"suite_fingerprint": "f", "run_order": {"repeats": orders}, "runs": runs, "tuning": tuning}
    point = resume_point(_write(tmp_path, doc), "f")
    assert point.repeats == {0: runs[:2]} and point.tuning is None and point.tuning_rows == {0: tuning["runs"][:2]}
    chosen = {**tuning, "chosen": {"tuned-static": "a"}, "chosen_at": 1.0}
    point = resume_point(_write(tmp_path, {**doc, "tuning": chosen}), "f")
    assert point.tuning == chosen and "kept the tuning choice and 1 complete repeat(s)" == point.kept()


def test_nothing_to_resume_from_is_a_fresh_start_and_another_suites_file_is_refused(tmp_path):
    assert resume_point(Location.parse(str(tmp_path)), "f").repeats == {}
    with pytest.raises(ConfigError, match="written by another suite definition"):
        resume_point(_write(tmp_path, {"suite_fingerprint": "g", "runs": []}), "f")
    (tmp_path / "comparison.json").write_text("{cut sh")
    with pytest.raises(ConfigError, match="cannot resume from it"):
        resume_point(Location.parse(str(tmp_path)), "f")
