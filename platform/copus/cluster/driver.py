"""The driver: config in, a Ray Train run, MLflow and summary.json out.

It starts (or joins, via RAY_ADDRESS) a Ray cluster and launches a Ray Train trainer with one
worker per rank. Rank 0 reports to the run's Goodput controller actor (a RecordQueue plus the
policy's decisions; a plain RunMonitor for the static policy), which the driver drains while
training runs (live progress and MLflow). A change of GBS, MBS or layout is made by the
workers in place (`reconfigure: auto` or `in_place`: the ranks reshard model and optimiser
among themselves). With `reconfigure: restart`, or when the in-place path fails under `auto`,
the worker group ends instead (checkpoint, return) and the driver relaunches the trainer
in the new configuration under the same Ray run, so the workers resume from that checkpoint,
resharded, at the same sample; after such a fallback the run restarts for every later change.
Each reconfiguration is logged with its measured downtime. OUTPUT_DIR/summary.json is written
at the end; a relaunch of the command with the same output_dir resumes (in the configuration the
run had reached).

A run's steps, each printed as it starts: the data (tokenized, or found in the cache), the output
directory, the controller's inputs (the profile table, profiled first when there is none), then
the launches. Its parts live beside this module: `driver_run` (what the launches share),
`controller_setup`, `record_handler` (rank 0's records), `run_summary` (the audit, summary.json,
the closing MLflow figures), `run_state` (what the output directory keeps), `gns_command`.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Callable

import ray
from ray.train import CheckpointConfig, FailureConfig, RunConfig

from copus.cluster.controller import ControllerSpec, GoodputController
from copus.cluster.controller_setup import setup_controller
from copus.cluster.driver_run import DriverRun, run_label
from copus.cluster.entry import TrainLaunch, train_worker
from copus.cluster.launch import fit_and_drain, join_cluster, make_trainer, prepare_plan
from copus.cluster.monitor import RunMonitor, on_driver_node
from copus.cluster.probes import ProbeSource
from copus.cluster.record_handler import RecordHandler
from copus.cluster.run_state import (
    CONTROLLER_STATE,
    FAULT_MARKERS,
    RunState,
    clear_run,
    load_run_state,
    resume_config,
    resume_key,
    save_run_state,
)
from copus.cluster.run_summary import add_lost_reconfigurations, audit_changes, finish_run
from copus.config import ConfigError, ExperimentConfig
from copus.core.layout import CandidateConfig
from copus.core.reconfiguration import Relaunch
from copus.records import EndRecord
from copus.storage import RAY_RUN_NAME, StorageError, ray_storage, ray_storage_args
from copus.tracking import Tracker, flatten
from copus.train.faults import Faults, FaultSpecError, faults_from_env
from copus.train.worker_plan import WorkerPlan
from workloads.corpus import TokenFiles

if TYPE_CHECKING:
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

PROBE_SETTLE_S = 120.0  # how long a finished run waits for a probe still training (copus.cluster.probes)
SAMPLE_IDS_ENV = "COPUS_RECORD_SAMPLE_IDS"  # "1": step records carry the global batch's sample ids


def run_experiment(
    cfg: ExperimentConfig,
    fresh: bool = False,
    echo: Callable[[str], None] = print,
    b_noise_script: tuple | None = None,
    parent_run_id: str | None = None,
) -> dict:
    """`copus run`: the experiment as one run of one or more worker-group launches; returns
    its summary (also OUTPUT_DIR/summary.json)."""
    tokens, plan = prepare_data(cfg, echo)
    state, faults = open_output_dir(cfg, fresh, tokens.fingerprint, echo)
    join_cluster(cfg, echo)
    spec, start = setup_controller(cfg, echo, b_noise_script, tokens.fingerprint) if cfg.adaptive else (None, None)
    run = new_run(cfg, tokens, plan, state, faults, spec, start or cfg.start_config(), echo)
    start_tracking(run, parent_run_id)
    controller = start_controller(run)
    run.clock_origin = time.time() - run.state.elapsed_s
    handler = RecordHandler(run, controller)
    try:
        final = launch_until_done(run, controller, handler)
        controller_state = settle_controller(controller, handler) if run.spec is not None else None
    finally:
        ray.kill(controller)
        handler.close()
    add_lost_reconfigurations(run.state, final)
    run.state.reconfigurations = audit_changes(
        run.out, run.state.reconfigurations, cfg.schedule.warmup_samples, run.tracker, run.run_id, echo
    )
    return finish_run(run, final, controller_state)


def settle_controller(controller, handler: RecordHandler) -> dict:
    """The run's last word from its controller: a probe still training is waited for (at most
    PROBE_SETTLE_S) and measured, its records logged; then the controller's snapshot."""
    ray.get(controller.settle_probes.remote(PROBE_SETTLE_S))
    handler.cursor, records = ray.get(controller.drain.remote(handler.cursor))
    handler(records)
    return ray.get(controller.snapshot.remote())


def prepare_data(cfg: ExperimentConfig, echo: Callable[[str], None]) -> tuple[TokenFiles, WorkerPlan]:
    """The run's first step: the dataset's token files (tokenized now, or found in the cache) and
    the workers' plan; a dataset too small for the experiment is refused here."""
    echo(f"data: preparing {cfg.workload.dataset.kind} for {cfg.workload.model} (cached after the first time)")
    tokens, plan = prepare_plan(cfg)
    echo(f"data: {tokens.description}; token files in {tokens.train.parent}")
    # A ramp is the run's policy: only these workers follow it (`copus calibrate` and `copus
    # profile` train the same experiment at the batch sizes they choose).
    return tokens, plan.replaced(ramp=cfg.batch_ramp())


def open_output_dir(
    cfg: ExperimentConfig, fresh: bool, data_fingerprint: str, echo: Callable[[str], None]
) -> tuple[RunState, Faults]:
    """The output directory's run state (a new one, or the run to resume; --fresh: the old run's
    files removed first) and the fault markers it holds."""
    out = cfg.resolved_output_dir()
    try:
        faults = faults_from_env(out / FAULT_MARKERS, cfg.cluster.num_workers)
        if fresh:
            clear_run(out)
        out.mkdir()
        state = load_run_state(out, resume_key(cfg, data_fingerprint))
    except FaultSpecError as err:
        raise ConfigError(str(err)) from None
    except StorageError as err:  # the first touch of the output directory: a store that does not answer
        raise ConfigError(f"output_dir: {err}") from None
    echo(f"output: {out}" + (f" (resuming launch {state.launches + 1})" if state.launches else ""))
    return state, faults


def new_run(
    cfg: ExperimentConfig,
    tokens: TokenFiles,
    plan: WorkerPlan,
    state: RunState,
    faults: Faults,
    spec: ControllerSpec | None,
    start: CandidateConfig,
    echo: Callable[[str], None],
) -> DriverRun:
    """The run's shared state; it trains in the configuration it had reached (when resumed on a
    cluster of the same size), else in `start`."""
    current, moved = resume_config(state.current, start)
    if moved:
        echo(moved)
    return DriverRun(
        cfg=cfg,
        out=cfg.resolved_output_dir(),
        tokens=tokens,
        plan=plan,
        faults=faults,
        record_sample_ids=os.environ.get(SAMPLE_IDS_ENV) == "1",
        state=state,
        spec=spec,
        start=start,
        current=current,
        tracker=Tracker(cfg.resolved_tracking_uri(), cfg.tracking.experiment, warn=echo),
        echo=echo,
    )


def start_tracking(run: DriverRun, parent_run_id: str | None) -> None:
    """The run's MLflow run: a new one, or the one an earlier driver of the same output
    directory started."""
    cfg, state, current, tracker = run.cfg, run.state, run.current, run.tracker
    if state.mlflow_run_id is None:
        params = flatten(cfg.model_dump(mode="json"))
        params.update({"data.fingerprint": run.tokens.fingerprint, "data.description": run.tokens.description})
        state.mlflow_run_id = tracker.start_run(
            cfg.tracking.run_name or run_label(cfg, current),
            params,
            {
                "policy": cfg.policy.name,
                "layout": f"dp{current.dp}-tp{current.tp}-pp{current.pp}",
                "copus.output_dir": str(run.out),
            },
            parent_run_id,
        )
        tracker.log_dict(state.mlflow_run_id, cfg.model_dump(mode="json"), "config.json")
    else:
        tracker.resume_run(state.mlflow_run_id)
        run.echo(
            f"resuming run in {run.out} (launch {state.launches + 1}, {state.elapsed_s:.1f} s already spent, "
            f"{current.label()})"
        )
    run.run_id = state.mlflow_run_id
    state.current = current.as_dict()
    save_run_state(run.out, state)


def start_controller(run: DriverRun):
    """The actor rank 0 reports to: the Goodput controller, or a plain record queue for a static
    run. It outlives every worker group of this run, so its history and restart-cost estimate
    carry over relaunches. Ray restarts a controller that crashes (max_restarts); it recovers its
    state from CONTROLLER_STATE, which it rewrites after every decision."""
    if run.spec is None:
        return RunMonitor.options(**on_driver_node()).remote()
    probe_source = ProbeSource(plan=run.plan, checkpoint_root=ray_storage(run.out) / RAY_RUN_NAME)
    return GoodputController.options(name=f"copus-controller-{run.run_id}", max_restarts=-1, **on_driver_node()).remote(
        run.spec, run.out / CONTROLLER_STATE, probe_source
    )


def launch_until_done(run: DriverRun, controller, handler: RecordHandler) -> EndRecord:
    """Launch worker groups, one after the other, until one stops for another reason than to
    restart in a new configuration; returns its end record."""
    while True:
        run.state.launches += 1
        save_run_state(run.out, run.state)
        trainer = launch_trainer(run, controller)
        run.echo(
            f"training {run.cfg.workload.model} on {run.cfg.cluster.num_workers} Ray workers "
            f"({run.current.label()}, policy {run.cfg.policy.name}); MLflow run {run.run_id}"
        )
        handler.new_launch()
        outcome = fit_and_drain(trainer, controller, handler, handler.cursor)
        handler.cursor = outcome["cursor"]
        if "error" in outcome:
            run.tracker.finish(run.run_id, "FAILED")
            raise outcome["error"]
        final = handler.final or EndRecord.from_dict(outcome["result"].return_value)
        if final.stop_reason != "reconfigure":
            return final
        restart_in(run, final.reconfigure)


def launch_trainer(run: DriverRun, controller) -> DataParallelTrainer:
    """A trainer for the run's current configuration, its workers reporting to `controller`."""
    cfg, storage = run.cfg, ray_storage(run.out)
    launch = TrainLaunch(
        plan=run.plan.replaced(**run.current.as_dict()),
        monitor=controller,
        clock_origin=run.clock_origin,
        adaptive=run.spec is not None,
        faults=run.faults,
        record_sample_ids=run.record_sample_ids,
        controller_timeout_s=cfg.policy.controller_timeout_s,
        checkpoint_root=storage / RAY_RUN_NAME,
    )
    return make_trainer(
        cfg,
        train_worker,
        launch.as_loop_config(),
        RunConfig(
            name=RAY_RUN_NAME,
            **ray_storage_args(storage),
            checkpoint_config=CheckpointConfig(num_to_keep=cfg.checkpoint.keep),
            failure_config=FailureConfig(max_failures=cfg.cluster.max_failures),
        ),
    )


def restart_in(run: DriverRun, relaunch: Relaunch) -> None:
    """The workers checkpointed to hand over to another configuration: the next launch trains
    in it. (Whether later changes restart too is the controller's: its orders say the way.)"""
    run.current = relaunch.config
    run.state.current = run.current.as_dict()
    save_run_state(run.out, run.state)
