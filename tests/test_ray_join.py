"""Which Ray cluster a command joins (copus.cluster.launch.ensure_ray): the one RAY_ADDRESS or
the config names, else a private local instance, never the cluster a `ray start` recorded in
Ray's temp dir (stale after its processes died without `ray stop`, or live and the user's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.conftest import REPO, experiment_mapping

JOIN = """
import json, sys
import ray
from copus.cluster.launch import ensure_ray
from copus.config import config_from_mapping
ensure_ray(config_from_mapping(json.loads(sys.argv[1])))
print(json.dumps({"cpus": ray.cluster_resources().get("CPU"), "nodes": len(ray.nodes())}))
"""


def test_a_stale_recorded_cluster_does_not_break_a_command(tmp_path, token_cache):
    # Ray keeps the address of the last `ray start --head` in <temp dir>/ray/ray_current_cluster;
    # a head that died without `ray stop` leaves it behind, naming a dead address.
    ray_tmp = Path(tempfile.mkdtemp(prefix="copus-st-", dir="/tmp"))  # short: Ray's sockets live under it
    (ray_tmp / "ray").mkdir()
    (ray_tmp / "ray" / "ray_current_cluster").write_text("127.0.0.1:9\n")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_TMPDIR"] = str(ray_tmp)
    mapping = experiment_mapping(tmp_path, token_cache)
    done = subprocess.run(
        [sys.executable, "-c", JOIN, json.dumps(mapping)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    joined = json.loads(done.stdout.strip().splitlines()[-1])
    # A private instance of its own: one node, CPUs for the experiment's workers.
    assert joined["nodes"] == 1 and joined["cpus"] >= mapping["cluster"]["num_workers"]
