"""Where a resumed run trains: the configuration it reached, or, when the cluster changed size,
the experiment's start for the new size (the checkpoint reshards across world sizes; the
restart path is the one for a change of world size)."""

from __future__ import annotations

from copus.cluster.run_state import resume_config
from copus.core.layout import CandidateConfig


def test_a_resumed_run_keeps_the_configuration_it_reached():
    start = CandidateConfig(4, 1, 1, 2, 16)
    assert resume_config(None, start) == (start, None)
    reached = CandidateConfig(2, 1, 2, 4, 32)
    assert resume_config(reached.__dict__, start) == (reached, None)


def test_a_cluster_of_another_size_resumes_in_the_start_configuration_for_it():
    start = CandidateConfig(8, 1, 1, 2, 16)
    config, line = resume_config(CandidateConfig(2, 1, 2, 4, 32).__dict__, start)
    assert config == start
    assert (
        line == "the cluster has 8 workers now, 4 before: resuming from the last checkpoint in dp8-tp1-pp1 mbs2 gbs16"
    )


def test_only_a_last_line_cut_short_leaves_the_records_log_silently(tmp_path, capsys):
    """records.jsonl: a driver that died mid-write leaves its last line without a newline, and it
    is dropped without a word. Any other line that is not a record (one in the middle, a whole
    last line that is not JSON, a value that is no record) is left out, counted, and named in a
    warning that gives the file."""
    import json

    from copus.cluster.run_state import RECORDS_LOG, read_records_log
    from copus.storage import Location

    out = Location.parse(str(tmp_path))
    steps = [json.dumps({"kind": "step", "step": s}) + "\n" for s in (1, 2, 3)]
    warnings: list[str] = []
    (tmp_path / RECORDS_LOG).write_text("".join(steps) + '{"kind": "st')
    records = read_records_log(out, warnings.append)
    assert [r["step"] for r in records] == [1, 2, 3] and records.malformed_lines == [] and warnings == []

    (tmp_path / RECORDS_LOG).write_text(steps[0] + '{"kind": "st\n' + steps[1] + "42\n" + steps[2] + "{oops\n")
    records = read_records_log(out, warnings.append)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert records.malformed_lines == [2, 4, 6]
    (warning,) = warnings
    assert warning.startswith(
        f"warning: {out / RECORDS_LOG}: 3 of 6 lines are not records and were left out (line 2, 4, 6)"
    )
    read_records_log(out)  # both audits read it so: the warning goes to stderr, in the run's output
    assert capsys.readouterr().err == warning + "\n"
