"""MLflow unreachable (here: its SQLite database locked by another process) does not stop
the driver: metrics are kept, a warning says so once, and they are written in order when the
database is free again; end-of-run writes that fail warn instead of failing the run."""

from __future__ import annotations

import sqlite3
import time

import pytest

from copus.tracking import Tracker

pytestmark = pytest.mark.slow  # a locked SQLite write fails only after MLflow's 20 s busy timeout


def test_metrics_are_buffered_while_the_database_is_locked(tmp_path):
    db = tmp_path / "mlflow.db"
    warnings: list[str] = []
    tracker = Tracker(f"sqlite:///{db}", "outage", warn=warnings.append, retry_s=3.0)
    run = tracker.start_run("r", {}, {})
    tracker.log_values(run, {"loss": 3.0}, step=1)

    lock = sqlite3.connect(db, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")  # another writer holds the database
    tracker.log_records(run, [{"kind": "step", "step": 2, "train_loss": 2.5}])  # fails after the busy timeout
    tracker.log_values(run, {"loss": 2.2}, step=2)  # within the retry pause: kept, no attempt, no wait
    assert tracker.pending == 2
    assert len([w for w in warnings if "unreachable" in w]) == 1 and "database is locked" in warnings[0]
    lock.execute("COMMIT")
    lock.close()

    time.sleep(3.0)  # the retry pause is over
    tracker.log_values(run, {"loss": 2.0}, step=3)
    assert tracker.pending == 0 and warnings[-1].endswith("is back: buffered metrics written")
    history = [(m.step, m.value) for m in tracker.client.get_metric_history(run, "loss")]
    assert history == [(1, 3.0), (2, 2.2), (3, 2.0)]
    assert [(m.step, m.value) for m in tracker.client.get_metric_history(run, "train_loss")] == [(2, 2.5)]
    tracker.finish(run)
    assert tracker.client.get_run(run).info.status == "FINISHED"
