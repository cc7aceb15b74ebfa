"""`copus gns`: the gradient noise scale at an experiment's initial weights, measured on its
Ray workers (no update, no checkpoint)."""

from __future__ import annotations

import tempfile

from ray.train import FailureConfig, RunConfig

from copus.cluster.launch import ensure_ray, make_trainer, prepare_plan
from copus.cluster.worker import gns_worker
from copus.config import ExperimentConfig


def measure_experiment_gns(cfg: ExperimentConfig, steps: int) -> dict:
    """`copus gns`: B_noise at the experiment's initial weights, measured on its Ray workers."""
    _, plan = prepare_plan(cfg)
    ensure_ray(cfg)
    with tempfile.TemporaryDirectory(prefix="copus-gns-") as storage:
        result = make_trainer(
            cfg,
            gns_worker,
            {"plan": plan, "steps": steps},
            RunConfig(name="gns", storage_path=storage, failure_config=FailureConfig(max_failures=0)),
        ).fit()
    return result.return_value
