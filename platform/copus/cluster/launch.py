"""What every Ray-side command shares: joining or starting the cluster, checking the dataset,
building a Ray Train trainer for the experiment, and running it while draining rank 0's records."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Callable

import ray
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

from copus.cluster import emulate
from copus.cluster.loop_config import sealed
from copus.cluster.torch_backend import ProcessGroupConfig
from copus.config import ConfigError, ExperimentConfig
from copus.core.topology import MESH_ORDER, crossing_dims
from copus.train.worker_plan import WorkerPlan, plan_from_config
from workloads.corpus import TokenFiles, file_windows
from workloads.datasets import prepare_dataset

POLL_S = 0.5
MONITOR_PATIENCE_S = 120.0  # a restarting controller recovers in seconds; a dead record queue never does


class MonitorLost(RuntimeError):
    """The actor that carries rank 0's records to the driver is gone for good."""


def join_cluster(cfg: ExperimentConfig, echo: Callable[[str], None]) -> None:
    """The start of a run, profile or calibration on Ray: an emulated cluster whose links follow
    this machine's compute re-capped for it (copus.cluster.emulate_link.relink), then Ray joined
    or started (ensure_ray)."""
    from copus.cluster.emulate_link import relink

    relink(cfg, echo)
    ensure_ray(cfg)


def ensure_ray(cfg: ExperimentConfig) -> None:
    """Join the cluster RAY_ADDRESS names (as under `ray job submit`), else the one the config
    names (cluster.address, or the emulated cluster of cluster.emulate), else start a private
    local instance for this process alone: never the cluster a stale `ray start` recorded in
    /tmp/ray, nor a live one the user started, which a plain `ray.init()` would join."""
    if ray.is_initialized():
        return
    c = cfg.cluster
    address = os.environ.get("RAY_ADDRESS") or c.address
    join: dict = {}
    if not address and c.emulate is not None:
        address, head_ip = _emulated_address(cfg)
        # The driver attaches to the head's Ray node (where Ray Train puts its controller), not
        # to whichever node Ray would guess from this machine's outward address: a lost worker
        # node must not take the driver with it.
        join["_node_ip_address"] = head_ip
    if address:
        ray.init(address=address, log_to_driver=os.environ.get("COPUS_WORKER_LOGS") == "1", **join)
        return
    # A local cluster on a small machine: advertise enough CPUs for every worker, since
    # tests and the quickstart deliberately run several gloo workers on 2 cores.
    needed = int(c.num_workers * c.cpus_per_worker + 0.999)
    # Worker logs stay in Ray's session logs unless COPUS_WORKER_LOGS=1; failures still surface
    # through TrainingFailedError with the worker's traceback. No dashboard: the embedded
    # cluster serves no HTTP (no job API) at all.
    ray.init(
        address="local",
        num_cpus=max(os.cpu_count() or 1, needed),
        include_dashboard=False,
        log_to_driver=os.environ.get("COPUS_WORKER_LOGS") == "1",
    )


def _emulated_address(cfg: ExperimentConfig) -> tuple[str, str]:
    """The address and head address of the emulated cluster cfg describes, with its token in
    this process's environment; refuses when none of that description is up."""
    from ray._raylet import Config

    spec = emulate.EmulatedSpec.from_config(cfg)
    state = emulate.status(spec.state_dir)
    if state is None or not state["healthy"] or state["spec"] != dataclasses.asdict(spec):
        raise ConfigError(
            f"cluster.emulate: no emulated cluster of {spec.describe()} is up (state in {spec.state_dir}); "
            "start it with `copus cluster up EXPERIMENT.yaml`"
        )
    os.environ.update(state["env"])
    # Ray caches its authentication mode when imported; refresh it the way Ray's own
    # _enable_token_auth does, so this process presents the cluster's token.
    Config.initialize("")
    return state["address"], state["head_ip"]


def run_topology(cfg: ExperimentConfig) -> dict:
    """Where a run's ranks live, as summary.json and the profile report it: nodes and ranks per
    node, known on an emulated cluster (equal shares per node) and on the private local instance
    (one node); on a cluster that was joined the placement is Ray's and reported as null."""
    c = cfg.cluster
    joined = bool(os.environ.get("RAY_ADDRESS") or c.address)
    rate = None
    if c.emulate is not None:  # also under `ray job submit` to it (RAY_ADDRESS names its head)
        from copus.cluster.emulate_link import link_rate

        rate = link_rate(cfg)
        nodes, link = c.emulate.nodes, rate.link_mbit
    else:
        nodes, link = (None if joined else 1), None
    return {
        "emulated": c.emulate is not None,
        "nodes": nodes,
        "ranks_per_node": c.num_workers // nodes if nodes else None,
        "link_mbit": link,
        # How the rate was set on this machine (configured, reference and measured step); null
        # off an emulated cluster.
        "link_rate": rate.as_dict() if rate is not None else None,
        "mesh_order": list(MESH_ORDER),
    }


def crossing_of(topology: dict, layout: dict) -> list[str] | None:
    """The dimensions of `layout` (dp, tp, pp) that cross nodes under `topology`; None unknown."""
    per_node = topology.get("ranks_per_node")
    if per_node is None:
        return None
    return list(crossing_dims(layout["dp"], layout["tp"], layout["pp"], per_node))


def _scaling(cfg: ExperimentConfig) -> ScalingConfig:
    c = cfg.cluster
    resources = {"CPU": c.cpus_per_worker}
    if c.emulate is not None:  # equal shares per node: each node has exactly its workers' slots
        resources[emulate.SLOT] = 1
    if c.use_gpu:
        resources["GPU"] = c.gpus_per_worker
    return ScalingConfig(num_workers=c.num_workers, use_gpu=c.use_gpu, resources_per_worker=resources)


def check_dataset_fits(cfg: ExperimentConfig, tokens: TokenFiles) -> None:
    """Refuse, before any worker starts, a dataset too small for the experiment."""
    seq = cfg.workload.seq_len
    for split, path, needed, field in (
        ("train", tokens.train, 1, "workload.dataset.path"),
        ("validation", tokens.val, cfg.eval.val_samples, "eval.val_samples"),
    ):
        samples = file_windows(path, tokens.dtype, seq)
        if samples < needed:
            raise ConfigError(
                f"{field}: the {split} split ({path}) has {samples} samples of seq_len {seq}, fewer than {needed}"
            )


def prepare_plan(cfg: ExperimentConfig) -> tuple[TokenFiles, WorkerPlan]:
    """The dataset's token files (built or cached) and the workers' plan; refuses a dataset
    too small for the experiment before anything starts."""
    ds = cfg.workload.dataset
    tokens = prepare_dataset(
        ds.kind,
        ds.path,
        ds.val_path,
        ds.text_field,
        ds.dtype,
        ds.val_fraction,
        cfg.flavour().vocab_size,
        ds.cache_dir,
        cfg.workload.tokenizer,
    )
    check_dataset_fits(cfg, tokens)
    return tokens, plan_from_config(cfg, str(tokens.train), str(tokens.val), tokens.dtype)


class _DatalessTrainer(DataParallelTrainer):
    """Ray Train's trainer with our torch process-group backend (`copus.cluster.torch_backend`;
    Ray's TorchTrainer is this with Ray's, and importing it imports torch in the driver), less
    its Ray Data callback: our workers read token files, never a Ray Dataset, and the callback
    starts a DatasetManager actor for every worker group all the same (one more process importing
    Ray Data and Ray Train: about 2 CPU-s of each run on 2 cores)."""

    def _create_default_callbacks(self) -> list:
        callbacks = super()._create_default_callbacks()
        return callbacks if self.datasets else [c for c in callbacks if not isinstance(c, DatasetsCallback)]


def make_trainer(cfg: ExperimentConfig, worker_fn, loop_config: dict, run_config: RunConfig) -> DataParallelTrainer:
    """A trainer whose workers open `loop_config` with `copus.cluster.loop_config.opened`."""
    return _DatalessTrainer(
        worker_fn,
        train_loop_config=sealed(loop_config),
        backend_config=ProcessGroupConfig(backend="nccl" if cfg.cluster.use_gpu else "gloo"),
        scaling_config=_scaling(cfg),
        run_config=run_config,
    )


@contextlib.contextmanager
def one_shot_trainer(cfg: ExperimentConfig, worker_fn, loop_config: dict, name: str) -> Iterator[DataParallelTrainer]:
    """A trainer for a job that is not a training run (`copus gns`, a profiling group): no
    retries, its Ray storage a temporary folder removed when the block ends."""
    with tempfile.TemporaryDirectory(prefix=f"copus-{name}-") as storage:
        failures = FailureConfig(max_failures=0)
        yield make_trainer(
            cfg, worker_fn, loop_config, RunConfig(name=name, storage_path=storage, failure_config=failures)
        )


def fit_and_drain(
    trainer: DataParallelTrainer,
    monitor,
    on_records: Callable[[list[dict]], None],
    cursor: tuple[str | None, int] = (None, 0),
    patience_s: float = MONITOR_PATIENCE_S,
) -> dict:
    """Run `trainer.fit()` on a thread while handing the monitor's records, in order, to
    `on_records` on this one (MLflow, progress), from `cursor` on (a monitor that outlives
    several worker groups keeps its earlier records). A monitor that died and is being
    restarted by Ray is waited for, up to `patience_s`; one that stays unreachable longer is
    fatal (MonitorLost): the run would go on with its records going nowhere. Returns
    {"result": Result} or {"error": exc}, and {"cursor": the cursor after the last record}."""
    outcome: dict = {}

    def fit() -> None:
        try:
            outcome["result"] = trainer.fit()
        except BaseException as err:  # reported on the calling thread
            outcome["error"] = err

    thread = threading.Thread(target=fit, name="copus-fit", daemon=True)
    thread.start()
    unreachable_since: float | None = None
    while True:
        alive = thread.is_alive()
        try:
            cursor, records = ray.get(monitor.drain.remote(cursor))
            unreachable_since = None
        except ray.exceptions.RayActorError as err:  # restarting (max_restarts): records pushed meanwhile are lost
            records = []
            unreachable_since = unreachable_since or time.monotonic()
            if time.monotonic() - unreachable_since > patience_s:
                raise MonitorLost(
                    f"the run's record actor has not answered for {patience_s:.0f} s ({type(err).__name__}): "
                    f"the records rank 0 sends are lost; stopping the run"
                ) from err
        on_records(records)
        if not alive:
            break
        time.sleep(POLL_S)
    thread.join()
    outcome["cursor"] = cursor
    return outcome
