from __future__ import annotations

import pytest
import ray

from tests.conftest import empty_mlflow_db


@pytest.fixture(scope="package", autouse=True)
def local_ray():
    # One local cluster for every Ray test; 8 logical CPUs on a 2-core machine: the 3D test
    # runs 8 gloo workers. Package scope: shut down once tests/cluster is done, so that its
    # daemons and idle workers take no CPU from the rest of the suite.
    # (Ray Train's settings for the tests are in tests/conftest.py: its processes inherit them.)
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(autouse=True)
def mlflow_db(tmp_path):
    """The test's MLflow database (base_mapping's), there before its runs: see empty_mlflow_db."""
    empty_mlflow_db(tmp_path / "mlflow.db")
