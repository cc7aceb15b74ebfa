"""Shared fixtures: a tiny experiment mapping and a session-wide token cache."""

from __future__ import annotations

import atexit
import copy
import functools
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

REPO = Path(__file__).resolve().parents[1]

# No per-example deadline (hypothesis's default is 200 ms): tests never assert on wall-clock time,
# and on a 2-core machine running the suite on two processes a plain example may take longer.
settings.register_profile("copus", deadline=None)
settings.load_profile("copus")

# One intra-op thread in the test process (and in the processes it starts, unless the
# environment says otherwise; spawned gloo ranks and Ray workers use one already). The models
# here are tiny, so a second thread buys nothing, while on a 2-core machine that also runs
# spawned ranks or Ray's daemons OpenMP's spinning threads make each small op 10-25x slower.
# Set before torch is imported (conftest loads before the test modules).
os.environ.setdefault("OMP_NUM_THREADS", "1")
if "torch" in sys.modules:
    sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# Ray Train, for every Ray process a test starts (its ray.init, the CLI and bench scripts it runs,
# an emulated cluster's nodes: they inherit this environment):
# - its controller polls the workers every 2 s by default, so a run's end (and each checkpoint
#   report, and a worker's failure) is noticed up to 2 s late: most of a short run's tail;
# - its PreemptionWatcher actor, started with every worker group, waits for a cloud's notice that
#   a node will be taken away. No test has one; the actor is a process importing Ray Train
#   (2 CPU-s of each run on 2 cores).
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")


@pytest.fixture(scope="session")
def token_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("copus-cache")


def experiment_mapping(tmp: Path, token_cache: Path) -> dict:
    """A small valid experiment (2 data-parallel CPU workers) as a raw YAML mapping, its
    output and MLflow database under `tmp`."""
    return copy.deepcopy(
        {
            "name": "test",
            "workload": {"model": "debug", "seq_len": 32, "dataset": {"kind": "stdlib", "cache_dir": str(token_cache)}},
            "optimizer": {"lr": 3e-3, "reference_gbs": 8},
            "batch": {"gbs": 8, "mbs": 2},
            "parallel": {"dp": 2, "tp": 1, "pp": 1},
            "stop": {"max_steps": 6},
            "eval": {"every_steps": 3, "val_samples": 8},
            "checkpoint": {"every_steps": 3},
            "cluster": {"num_workers": 2},
            "tracking": {"uri": f"sqlite:///{tmp / 'mlflow.db'}", "experiment": "tests"},
            "output_dir": str(tmp / "out"),
        }
    )


@pytest.fixture
def base_mapping(tmp_path, token_cache) -> dict:
    """A small valid experiment (2 data-parallel CPU workers) as a raw YAML mapping."""
    return experiment_mapping(tmp_path, token_cache)


@functools.cache
def _empty_mlflow_db() -> Path:
    """An MLflow SQLite database at MLflow's current schema with nothing in it, made once per
    session in a temporary folder removed when the session ends."""
    from mlflow.tracking import MlflowClient

    folder = tempfile.mkdtemp(prefix="copus-test-mlflow-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = Path(folder) / "empty.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


def empty_mlflow_db(path: Path) -> None:
    """Put an empty MLflow database at `path`: MLflow makes a new SQLite database by running its
    schema migrations, 1.6 s on this machine, which every test that tracks a run into a database
    of its own would pay; a copy of one made once is what that run would have found."""
    shutil.copyfile(_empty_mlflow_db(), path)
