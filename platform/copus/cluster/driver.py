"""The driver: config in, a Ray Train run, MLflow and summary.json out.

It starts (or joins, via RAY_ADDRESS) a Ray cluster, launches a TorchTrainer with one worker
per rank, drains rank 0's metrics from the RunMonitor actor while training runs (live
progress and MLflow), and writes OUTPUT_DIR/summary.json at the end. A relaunch with the same
output_dir resumes from the last checkpoint Ray Train holds for that run.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from typing import Callable

import numpy as np
import ray
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

from copus.cluster.monitor import RunMonitor
from copus.cluster.worker import gns_worker, train_worker
from copus.config import ConfigError, ExperimentConfig
from copus.progress import progress_line, summary_text
from copus.run_state import (RAY_RUN_NAME, clear_run, load_run_state, ray_storage, resume_key, save_run_state)
from copus.tracking import Tracker, flatten
from copus.train.data import num_windows
from copus.train.plan import WorkerPlan, plan_from_config
from workloads.corpus import TokenFiles, prepare_dataset
from workloads.flavours import FLAVOURS

POLL_S = 0.5
PRINT_EVERY_S = 5.0


def ensure_ray(cfg: ExperimentConfig) -> None:
    """Join the cluster named by RAY_ADDRESS (as under `ray job submit`), else start a local one."""
    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"])
        return
    c = cfg.cluster
    # A local cluster on a small machine: advertise enough CPUs for every worker, since
    # tests and the quickstart deliberately run several gloo workers on 2 cores.
    needed = int(c.num_workers * c.cpus_per_worker + 0.999)
    # Worker logs stay in Ray's session logs unless COPUS_WORKER_LOGS=1; failures still surface
    # through TrainingFailedError with the worker's traceback.
    ray.init(num_cpus=max(os.cpu_count() or 1, needed), include_dashboard=False,
             log_to_driver=os.environ.get("COPUS_WORKER_LOGS") == "1")


def _scaling(cfg: ExperimentConfig) -> ScalingConfig:
    c = cfg.cluster
    resources = {"CPU": c.cpus_per_worker}
    if c.use_gpu:
        resources["GPU"] = c.gpus_per_worker
    return ScalingConfig(num_workers=c.num_workers, use_gpu=c.use_gpu, resources_per_worker=resources)


def check_dataset_fits(cfg: ExperimentConfig, tokens: TokenFiles) -> None:
    """Refuse, before any worker starts, a dataset too small for the experiment."""
    seq = cfg.workload.seq_len
    for split, path, needed, field in (("train", tokens.train, 1, "workload.dataset.path"),
                                       ("validation", tokens.val, cfg.eval.val_samples, "eval.val_samples")):
        samples = num_windows(os.path.getsize(path) // np.dtype(tokens.dtype).itemsize, seq)
        if samples < needed:
            raise ConfigError(f"{field}: the {split} split ({path}) has {samples} samples of seq_len {seq}, fewer than {needed}")


def prepare_plan(cfg: ExperimentConfig) -> tuple[TokenFiles, WorkerPlan]:
    """The dataset's token files (built or cached) and the workers' plan; refuses a dataset
    too small for the experiment before anything starts."""
    ds = cfg.workload.dataset
    tokens = prepare_dataset(ds.kind, ds.path, ds.val_path, ds.text_field, ds.dtype, ds.val_fraction,
                             FLAVOURS[cfg.workload.model].vocab_size, ds.cache_dir)
    check_dataset_fits(cfg, tokens)
    return tokens, plan_from_config(cfg, str(tokens.train), str(tokens.val), tokens.dtype)


def _trainer(cfg: ExperimentConfig, worker_fn, loop_config: dict, run_config: RunConfig) -> TorchTrainer:
    return TorchTrainer(worker_fn, train_loop_config=loop_config,
                        torch_config=TorchConfig(backend="nccl" if cfg.cluster.use_gpu else "gloo"),
                        scaling_config=_scaling(cfg), run_config=run_config)


def measure_experiment_gns(cfg: ExperimentConfig, steps: int) -> dict:
    """`copus gns`: B_noise at the experiment's initial weights, measured on its Ray workers."""
    _, plan = prepare_plan(cfg)
    ensure_ray(cfg)
    with tempfile.TemporaryDirectory(prefix="copus-gns-") as storage:
        result = _trainer(cfg, gns_worker, {"plan": plan, "steps": steps},
                          RunConfig(name="gns", storage_path=storage, failure_config=FailureConfig(max_failures=0))).fit()
    return result.return_value


def fit_and_drain(trainer: TorchTrainer, monitor, on_records: Callable[[list[dict]], None]) -> dict:
    """Run `trainer.fit()` on a thread while handing the monitor's records, in order, to
    `on_records` on this one (MLflow, progress). Returns {"result": Result} or {"error": exc};
    the monitor actor is released at the end."""
    outcome: dict = {}

    def fit() -> None:
        try:
            outcome["result"] = trainer.fit()
        except BaseException as err:  # reported on the calling thread
            outcome["error"] = err

    thread = threading.Thread(target=fit, name="copus-fit", daemon=True)
    thread.start()
    cursor = 0
    while True:
        alive = thread.is_alive()
        records = ray.get(monitor.drain.remote(cursor))
        cursor += len(records)
        on_records(records)
        if not alive:
            break
        time.sleep(POLL_S)
    thread.join()
    ray.kill(monitor)
    return outcome


def run_experiment(cfg: ExperimentConfig, fresh: bool = False, echo: Callable[[str], None] = print) -> dict:
    out = cfg.resolved_output_dir()
    tokens, plan = prepare_plan(cfg)
    if fresh:
        clear_run(out)
    out.mkdir(parents=True, exist_ok=True)
    state = load_run_state(out, resume_key(cfg, tokens.fingerprint))

    tracker = Tracker(cfg.resolved_tracking_uri(), cfg.tracking.experiment)
    layout = f"dp{cfg.parallel.dp}-tp{cfg.parallel.tp}-pp{cfg.parallel.pp}"
    if state.mlflow_run_id is None:
        params = flatten(cfg.model_dump(mode="json"))
        params.update({"data.fingerprint": tokens.fingerprint, "data.description": tokens.description})
        state.mlflow_run_id = tracker.start_run(cfg.tracking.run_name or cfg.name, params,
                                                {"policy": cfg.policy.name, "layout": layout, "copus.output_dir": str(out)})
        tracker.log_dict(state.mlflow_run_id, cfg.model_dump(mode="json"), "config.json")
    else:
        tracker.resume_run(state.mlflow_run_id)
        echo(f"resuming run in {out} (launch {state.launches + 1}, {state.elapsed_s:.1f} s already spent)")
    run_id = state.mlflow_run_id
    state.launches += 1
    save_run_state(out, state)

    ensure_ray(cfg)
    monitor = RunMonitor.remote()
    clock_origin = time.time() - state.elapsed_s
    trainer = _trainer(cfg, train_worker, {"plan": plan, "monitor": monitor, "clock_origin": clock_origin},
                       RunConfig(name=RAY_RUN_NAME, storage_path=str(ray_storage(out)),
                                 checkpoint_config=CheckpointConfig(num_to_keep=cfg.checkpoint.keep),
                                 failure_config=FailureConfig(max_failures=0)))
    echo(f"training {cfg.workload.model} on {cfg.cluster.num_workers} Ray workers ({layout}, "
         f"gbs {cfg.batch.gbs}, mbs {cfg.batch.mbs}); MLflow run {run_id}")

    cursor = {"last_val": None, "final": None, "last_print": 0.0}

    def on_records(records: list[dict]) -> None:
        if records:
            tracker.log_records(run_id, records)
        for record in records:
            if record["kind"] == "eval":
                cursor["last_val"] = record["val_loss"]
            if record["kind"] == "end":
                cursor["final"] = record
            # Every validation, but at most one step line per PRINT_EVERY_S: readable on any speed.
            if record["kind"] == "step" and time.time() - cursor["last_print"] < PRINT_EVERY_S:
                continue
            line = progress_line(record, plan.stop, cursor["last_val"])
            if line:
                echo(line)
                if record["kind"] == "step":
                    cursor["last_print"] = time.time()
        state.elapsed_s = time.time() - clock_origin
        save_run_state(out, state)

    outcome = fit_and_drain(trainer, monitor, on_records)
    final = cursor["final"]
    if "error" in outcome:
        tracker.finish(run_id, "FAILED")
        raise outcome["error"]
    final = final or outcome["result"].return_value
    summary = {
        "policy": cfg.policy.name,
        "reached_target": final["time_to_target_s"] is not None,
        "time_to_target_s": final["time_to_target_s"],
        "target_val_loss": cfg.stop.target_val_loss,
        "final_val_loss": final["last_val_loss"],
        "best_val_loss": final["best_val_loss"],
        "steps": final["step"],
        "samples": final["samples"],
        "wall_clock_s": final["wall_clock_s"],
        "stop_reason": final["stop_reason"],
        "mlflow_run_id": run_id,
        "mlflow_tracking_uri": tracker.uri,
        "layout": {"dp": cfg.parallel.dp, "tp": cfg.parallel.tp, "pp": cfg.parallel.pp, "mbs": cfg.batch.mbs, "gbs": cfg.batch.gbs},
        "reconfigurations": [],
        "launches": state.launches,
        "data_fingerprint": tokens.fingerprint,
        "output_dir": str(out),
    }
    final_metrics = {"final_val_loss": summary["final_val_loss"], "total_wall_clock_s": summary["wall_clock_s"],
                     "reconfigurations": 0.0}
    if summary["reached_target"]:
        final_metrics["time_to_target_s"] = summary["time_to_target_s"]
    tracker.log_values(run_id, final_metrics, step=int(final["step"]))
    tracker.set_tags(run_id, {"reached_target": summary["reached_target"], "stop_reason": summary["stop_reason"]})
    tracker.finish(run_id)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    tracker.log_dict(run_id, summary, "summary.json")
    echo(summary_text(summary))
    return summary
