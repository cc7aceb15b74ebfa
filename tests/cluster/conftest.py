from __future__ import annotations

import os

import pytest
import ray

from tests.conftest import empty_mlflow_db


@pytest.fixture(scope="package", autouse=True)
def local_ray():
    # One local cluster for every Ray test; 8 logical CPUs on a 2-core machine: the 3D test
    # runs 8 gloo workers. Package scope: shut down once tests/cluster is done, so that its
    # daemons and idle workers take no CPU from the rest of the suite.
    # Ray Train's controller polls its workers every 2 s by default, so a run's end (and a
    # worker's failure) is noticed up to 2 s late: ~6 s of each run's tail here. Set before
    # ray.init: the cluster's processes (and the CLI runs the tests start) inherit it.
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(autouse=True)
def mlflow_db(tmp_path):
    """The test's MLflow database (base_mapping's), there before its runs: see empty_mlflow_db."""
    empty_mlflow_db(tmp_path / "mlflow.db")
