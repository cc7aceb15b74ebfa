from __future__ import annotations

import pytest
import ray


@pytest.fixture(scope="package", autouse=True)
def local_ray():
    # One local cluster for every Ray test; 8 logical CPUs on a 2-core machine: the 3D test
    # runs 8 gloo workers. Package scope: shut down once tests/cluster is done, so that its
    # daemons and idle workers take no CPU from the rest of the suite.
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
