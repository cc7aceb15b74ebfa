"""What a resumed suite keeps (copus.cluster.compare_resume): whole units only, and only its own."""

import json

import pytest

from copus.cluster.compare_resume import resume_point
from copus.config import ConfigError, load_config
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


def _recorded_suite(tmp_path, suite_doc: dict, seconds=lambda cfg: 1.0):
    """A suite of `copus compare` whose runs are replaced by a recorder (what is tested is which
    runs it makes, not training; each run takes `seconds(cfg)` to the target). Returns the suite,
    a function giving its context resumed from what its comparison.json holds, and the names of
    the runs started."""
    import yaml

    from copus.cluster.compare import _Suite
    from copus.cluster.compare_resume import suite_fingerprint
    from copus.config import load_suite
    from tests.conftest import REPO

    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({**suite_doc, "output_dir": str(tmp_path / "out")}))
    suite, experiment = load_suite(path)
    fingerprint = suite_fingerprint(suite, experiment, [])
    started: list[str] = []

    class Recorded(_Suite):
        def run(self, cfg, tags):
            started.append(cfg.tracking.run_name)
            summary = {
                "time_to_target_s": seconds(cfg), "time_to_target_without_eval_s": 1.0, "reached_target": True,
                "final_val_loss": 2.0, "samples": 10, "reconfigurations": [], "wall_clock_s": 1.0,
                "initial_layout": cfg.start_config().as_dict(), "layout": cfg.start_config().as_dict(),
                "mlflow_run_id": cfg.tracking.run_name, "output_dir": str(cfg.output_dir),
            }  # fmt: skip
            return summary, 0.0

    class Tracker:
        experiment_id, uri = "0", "sqlite:///none"

    out = Location.parse(str(tmp_path / "out"))
    out.mkdir()
    base = load_config(REPO / "experiments" / "tradeoff_cpu.yaml")

    def context() -> _Suite:
        point = resume_point(out, fingerprint)
        return Recorded(suite, experiment, [], base, out, str(tmp_path), Tracker(), "p", print, fingerprint, point)

    return suite, context, started


def test_a_repeat_cut_short_runs_again_from_its_first_run_and_whole_ones_are_kept(tmp_path):
    """The evaluation loop of `copus compare` (runs recorded, `_recorded_suite`) keeps repeat 0
    and reruns all of repeat 1."""
    from copus.cluster.compare import _evaluate
    from tests.conftest import REPO

    experiment = str(REPO / "experiments" / "tradeoff_cpu.yaml")
    suite_doc = {"experiment": experiment, "policies": ["copus", "static"], "evaluation_seeds": [5, 6]}
    suite, context, started = _recorded_suite(tmp_path, suite_doc)

    def evaluate() -> dict:
        return _evaluate(context(), None, {})

    first = evaluate()
    assert len(started) == 4
    cut = {**first, "runs": first["runs"][:3]}  # repeat 1's second run never finished
    (tmp_path / "out" / "comparison.json").write_text(json.dumps(cut))
    started.clear()
    resumed = evaluate()
    assert started == [f"{suite.name}/{p}/r1" for p in first["run_order"]["repeats"][1]]
    assert [r for r in resumed["runs"] if r["repeat"] == 0] == [r for r in first["runs"] if r["repeat"] == 0]
    assert len(resumed["runs"]) == 4 and resumed["suite_fingerprint"] == context().fingerprint


def test_tune_only_writes_the_choice_and_a_resumed_suite_evaluates_without_tuning_again(tmp_path):
    """`copus compare --tune-only` (runs recorded, `_recorded_suite`): only the tuning runs are
    made and the choice is written; the suite resumed then runs only the evaluation, with that choice."""
    from copus.cluster.compare import run_phases
    from tests.conftest import REPO

    suite_doc = {
        "experiment": str(REPO / "experiments" / "tradeoff_cpu.yaml"), "policies": ["copus"],
        "tuning_seeds": [3], "evaluation_seeds": [5], "tune": {"static_gbs": [8, 16]},
    }  # fmt: skip
    suite, context, started = _recorded_suite(tmp_path, suite_doc, lambda cfg: 2.0 if cfg.batch.gbs == 8 else 1.0)

    tuned = run_phases(context(), tune_only=True)
    assert sorted(started) == sorted(f"{suite.name}/tuning/static-gbs{g}/s3" for g in (8, 16))
    written = json.loads((tmp_path / "out" / "comparison.json").read_text())
    assert written["tuning"]["chosen"]["tuned-static"] == "static-gbs16" and written["tuning"]["chosen_at"]
    assert tuned["runs"] == [] and written["runs"] == []
    started.clear()
    evaluated = run_phases(context(), tune_only=False)
    assert sorted(started) == sorted(f"{suite.name}/{e}/r0" for e in ("copus", "tuned-static"))
    assert evaluated["tuning"]["chosen_at"] == written["tuning"]["chosen_at"]
