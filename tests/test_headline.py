"""The README's headline table and figure (dashboards/headline.py) say what the committed results
files say."""

import json
import shutil

from dashboards.headline import FIGURE, HEADLINES, README, RESULTS, figure_says, headline_rows, main, readme_block


def test_the_readme_table_and_the_figure_are_the_committed_results():
    rows = headline_rows()
    assert [r.headline for r in rows] == [h for h in HEADLINES if all((RESULTS / f).is_file() for f in h.files)]
    assert readme_block(rows) in README.read_text()
    assert figure_says(FIGURE, rows)
    assert main(["--check"]) == 0


def test_the_first_headline_is_the_suites_own_paired_figure():
    """The row is comparison.json's own paired log-ratio against the named baseline, not a copy."""
    row = headline_rows()[0]
    paired = json.loads((RESULTS / row.headline.files[0]).read_text())["policies"][row.headline.ours]
    block = paired["paired_log_ratio"][row.headline.reference]
    assert abs(row.speedup - block["speedup"]) < 1e-12
    assert row.ci95 == tuple(block["speedup_ci95"])
    assert len(row.seeds) == block["n_pairs"]


def test_a_changed_result_makes_the_committed_figure_stale(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(RESULTS, results)
    path = results / HEADLINES[0].files[0]
    data = json.loads(path.read_text())
    for run in data["runs"]:
        if run["policy"] == HEADLINES[0].ours and run["repeat"] == 0:
            run["time_to_target_s"] *= 0.5  # ours twice as fast on one seed
    path.write_text(json.dumps(data))
    rows = headline_rows(results)
    assert rows[0].speedup > headline_rows()[0].speedup
    assert not figure_says(FIGURE, rows)
    assert readme_block(rows) not in README.read_text()
