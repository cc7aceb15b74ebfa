"""`copus gns`: the gradient noise scale at an experiment's initial weights, measured on its
Ray workers (no update, no checkpoint)."""

from __future__ import annotations

from copus.cluster.entry import gns_worker
from copus.cluster.launch import ensure_ray, one_shot_trainer, prepare_plan
from copus.config import ExperimentConfig


def measure_experiment_gns(cfg: ExperimentConfig, steps: int) -> dict:
    """`copus gns`: B_noise at the experiment's initial weights, measured on its Ray workers."""
    _, plan = prepare_plan(cfg)
    ensure_ray(cfg)
    with one_shot_trainer(cfg, gns_worker, {"plan": plan, "steps": steps}, "gns") as trainer:
        return trainer.fit().return_value
