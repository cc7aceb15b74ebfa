"""`copus profile`: measure step times of the experiment's search space on the Ray cluster,
fit the step-time model, report its held-out error, keep the table for later runs.

Flow: describe the workers' hardware (a Ray task with a worker's resources) → open the
profile table of (workload, hardware, world size) → screen every candidate with the memory
model (infeasible ones are recorded with the reason, never run) → choose the points to
measure that the table does not hold yet → run them in one Ray Train worker group (layouts
are rebuilt in place inside it) until done or the time budget is spent. A worker group that
fails (out of memory, a crash) costs only the configuration it was measuring: that one is
recorded as infeasible with the error, and a new group carries on with the rest. Every
measured point is written to the table as it arrives (atomically), then the model is
fitted, cross-validated, stored in the table and logged to MLflow with the table.
"""

from __future__ import annotations

import os
import time
from typing import Callable

import ray

from copus.cluster.entry import profile_worker
from copus.cluster.launch import crossing_of, fit_and_drain, join_cluster, one_shot_trainer, prepare_plan, run_topology
from copus.cluster.monitor import RunMonitor, on_driver_node
from copus.cluster.profile_table import ProfileTable, profile_key
from copus.config import ExperimentConfig
from copus.core.layout import CandidateConfig
from copus.core.memory import GIB, config_bytes
from copus.core.search import candidates, gbs_grid, profile_points
from copus.core.throughput import StepTimeModel, kept_step_time, measurements_disagree
from copus.core.tradeoffs import layout_table_lines, tradeoff_lines, tradeoffs
from copus.records import (
    ProfileLayoutRecord,
    ProfilePointRecord,
    ProfileReshardRecord,
    ProfileStartRecord,
    Record,
    parse_record,
)
from copus.tracking import Tracker, flatten
from copus.train.host import describe_hardware, hardware_label
from copus.train.profile_job import ProfileJob

# Per-process memory that never holds tensors: CUDA context and communicator buffers.
GPU_RUNTIME_OVERHEAD_BYTES = 2 * GIB
FAULT_ENV = "COPUS_INJECT_PROFILE_FAILURE"  # a CandidateConfig.label() at which rank 0 fails (tests the recovery path)


def workload_key(cfg: ExperimentConfig) -> dict:
    """What changes the step time of a configuration, besides hardware and layout."""
    return {
        "model": cfg.workload.model,
        "seq_len": cfg.workload.seq_len,
        "pp_schedule": cfg.parallel.pp_schedule,
        "mixed_precision": cfg.cluster.mixed_precision,
        "gns_probe": cfg.gns.enabled,
        "gns_precondition": cfg.gns.precondition,
    }


def detect_hardware(cfg: ExperimentConfig) -> dict:
    """The hardware of a worker node (scheduled with one worker's resources). On an emulated
    cluster also its topology (nodes, link rate, cores per node), so that a table measured over
    one link rate is never read for another (nor, where every run re-caps the link to this
    machine's compute, over another ratio of the link to compute)."""
    c = cfg.cluster
    task = ray.remote(describe_hardware).options(
        num_cpus=c.cpus_per_worker, num_gpus=c.gpus_per_worker if c.use_gpu else 0
    )
    hardware = ray.get(task.remote(c.use_gpu))
    if c.emulate is not None:
        from copus.cluster.emulate_link import link_key

        e = c.emulate
        hardware["emulated"] = {"nodes": e.nodes, **link_key(cfg), "cores_per_node": e.cores_per_node}
    return hardware


def save_stated_table(cfg: ExperimentConfig, samples_per_s: dict[CandidateConfig, float], folds: int = 3) -> None:
    """A profile table of these samples/s (one step each, as if measured), fitted and saved where
    this experiment's runs look for theirs: for benches and tests that script what the
    controller sees instead of profiling."""
    table = ProfileTable(profile_key(workload_key(cfg), detect_hardware(cfg), cfg.cluster.num_workers))
    for config, per_s in samples_per_s.items():
        time_s = config.gbs / per_s
        table.record(
            config, status="ok", source="measured", step_time_s=time_s, step_times=[time_s], samples_per_s=per_s
        )
    table.fit(cfg.flavour().shape(), folds=folds)
    table.save(cfg.resolved_profile_dir())


def device_memory_bytes(cfg: ExperimentConfig, hardware: dict) -> float:
    if cfg.cluster.memory_per_worker_gb is not None:
        return cfg.cluster.memory_per_worker_gb * GIB
    if hardware["kind"] == "cuda":
        return hardware["device_memory_gib"] * GIB
    # CPU workers of one node share its RAM.
    return hardware["host_memory_gib"] * GIB / max(1, min(cfg.cluster.num_workers, hardware["cores"]))


def memory_estimate(cfg: ExperimentConfig, c: CandidateConfig, hardware: dict):
    act_bytes = 2 if cfg.cluster.mixed_precision in ("bf16", "fp16") else 4
    overhead = GPU_RUNTIME_OVERHEAD_BYTES if hardware["kind"] == "cuda" else 0.0
    return config_bytes(
        cfg.flavour().shape(),
        c,
        cfg.workload.seq_len,
        schedule=cfg.parallel.pp_schedule,
        act_bytes=act_bytes,
        overhead_bytes=overhead,
    )


def search_space(cfg: ExperimentConfig) -> list[CandidateConfig]:
    shape = cfg.flavour().shape()
    return candidates(
        cfg.layout_choices(),
        cfg.mbs_choices(),
        gbs_grid(*cfg.gbs_bounds()),
        shape,
        cfg.shard_choices(),
        cfg.recompute_choices(),
    )


def _failure_reason(err: BaseException) -> str:
    """The root cause's last 'SomethingError: message' line (Ray wraps the worker's traceback)."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    for ln in reversed(lines):
        head = ln.split(":", 1)[0]
        if head.endswith(("Error", "Exception", "Fault")) and " " not in head:
            return ln[:300]
    return (lines[-1] if lines else type(err).__name__)[:300]


def _run_group(cfg: ExperimentConfig, job: ProfileJob, on_record: Callable[[dict], None]) -> BaseException | None:
    """One worker group measuring `job`; records reach `on_record` as they arrive."""
    monitor = RunMonitor.options(**on_driver_node()).remote()
    with one_shot_trainer(cfg, profile_worker, {"job": job, "monitor": monitor}, "profile") as trainer:

        def each(records: list[dict]) -> None:
            for r in records:
                on_record(r)

        outcome = fit_and_drain(trainer, monitor, each)
    ray.kill(monitor)
    return outcome.get("error")


def run_profile(cfg: ExperimentConfig, refresh: bool = False, echo: Callable[[str], None] = print) -> dict:
    t0 = time.time()
    shape = cfg.flavour().shape()
    _, plan = prepare_plan(cfg)
    join_cluster(cfg, echo)
    hardware = detect_hardware(cfg)
    key = profile_key(workload_key(cfg), hardware, cfg.cluster.num_workers)
    table_dir = cfg.resolved_profile_dir()
    table = ProfileTable.open(table_dir, key, refresh)
    echo(
        f"profiling {cfg.workload.model} seq {cfg.workload.seq_len} on {cfg.cluster.num_workers} workers, "
        f"{hardware_label(hardware)}; table {table_dir / table.file_name()}"
        + (f" ({len(table.measured())} points already measured)" if table.rows else "")
    )

    space = search_space(cfg)
    _screen_memory(cfg, table, space, hardware, echo)
    table.save(table_dir)

    ctx = _Context(cfg, plan, table, table_dir, hardware, t0 + cfg.profile.budget_s, echo)
    unmeasured = _measure_space(ctx, space)
    table.fit(shape, cfg.profile.folds)
    # A point far off the model fitted without it may have been measured at a moment unlike a
    # run's: measure it once more and keep the slower median; where the two disagree
    # by more than 20%, once more and keep the median of three (copus.core.throughput.kept_step_time).
    suspects = _suspects(table)
    if suspects and time.time() < ctx.deadline:
        echo(f"  measuring {len(suspects)} point(s) far off the model again")
        ctx.measure(suspects, remeasure=True)
    disputed = [c for c in suspects if measurements_disagree(table.row(c).get("medians", []))]
    if disputed and time.time() < ctx.deadline:
        echo(f"  measuring {len(disputed)} point(s) a third time: two measurements disagree by more than 20%")
        ctx.measure(disputed, remeasure=True)
    model = table.fit(shape, cfg.profile.folds)
    result = _result(ctx, model, space, unmeasured, suspects, t0)
    result["mlflow_run_id"] = _log_to_mlflow(cfg, table, result)
    _print_summary(table, result, echo)
    return result


def _measure_space(ctx: _Context, space: list[CandidateConfig]) -> list[CandidateConfig]:
    """Measure the profile points of the search space until every one is known or the budget
    is spent; returns the points planned but not measured."""
    cfg, table = ctx.cfg, ctx.table
    while True:
        # Plan from what is known to run: a configuration that failed is replaced by another
        # GBS of its shape in the next round.
        feasible = [c for c in space if not table.known(c) or table.row(c)["status"] == "ok"]
        points = profile_points(feasible, cfg.profile.gbs_per_shape, cfg.profile.max_microbatches)
        pending = [c for c in points if not table.known(c)]
        failures = len(table.infeasible())
        ctx.measure(pending)
        if len(table.infeasible()) == failures or time.time() >= ctx.deadline:
            return [c for c in pending if not table.known(c)]


def _result(
    ctx: _Context,
    model: dict,
    space: list[CandidateConfig],
    unmeasured: list[CandidateConfig],
    suspects: list[CandidateConfig],
    t0: float,
) -> dict:
    """What `copus profile` reports (the table is saved first)."""
    table = ctx.table
    path = table.save(ctx.table_dir)
    worst = max((r for r in table.rows if r["status"] == "ok"), key=lambda r: r.get("cv_ape", 0.0))
    return {
        "table": str(path),
        "key_id": table.id,
        "hardware": ctx.hardware,
        "points": len(table.measured()),
        "measured_now": ctx.measured,
        "infeasible": [
            {k: r[k] for k in ("dp", "tp", "pp", "mbs", "gbs", "reason", "source")} for r in table.infeasible()
        ],
        "not_measured_budget": [c.label() for c in unmeasured],
        "mape": model["error"]["mape"],
        "max_ape": model["error"]["max_ape"],
        "worst": CandidateConfig.from_dict(worst).label(),
        "folds": model["error"]["folds"],
        "model": model["params"],
        "search_space": len(space),
        "worker_groups": ctx.launches,
        "remeasured": [c.label() for c in suspects],
        "wall_clock_s": time.time() - t0,
        "tradeoffs": tradeoffs(measured_throughputs(table)),
        "topology": _profile_topology(ctx.cfg, table),
        # the in-place layout changes it made between its layouts, and their median: what a run
        # charges its first layout change (policy.in_place_cost_s: null)
        "reshards": table.reshards,
        "in_place_reshard_s": table.in_place_reshard_s(),
    }


def _profile_topology(cfg: ExperimentConfig, table: ProfileTable) -> dict:
    """Where the profile's ranks lived, and which dimensions of each measured layout crossed nodes."""
    topology = run_topology(cfg)
    layouts = {(r["dp"], r["tp"], r["pp"]) for r in table.rows}
    crossing = {
        f"dp{dp}-tp{tp}-pp{pp}": crossing_of(topology, {"dp": dp, "tp": tp, "pp": pp}) for dp, tp, pp in sorted(layouts)
    }
    return {**topology, "crossing_by_layout": crossing}


def load_or_profile(cfg: ExperimentConfig, echo: Callable[[str], None]) -> tuple[ProfileTable, StepTimeModel]:
    """The profile table of this experiment's key with its fitted model; profiles first (within
    profile.budget_s) when there is none."""
    shape = cfg.flavour().shape()
    key = profile_key(workload_key(cfg), detect_hardware(cfg), cfg.cluster.num_workers)
    table = ProfileTable.open(cfg.resolved_profile_dir(), key)
    if table.model is None:
        echo(
            f"no profile for this workload, hardware and world size in {cfg.resolved_profile_dir()}: profiling first "
            f"(up to {cfg.profile.budget_s:.0f} s)"
        )
        run_profile(cfg, echo=echo)
        table = ProfileTable.open(cfg.resolved_profile_dir(), key)
    model = table.step_time_model(shape)
    assert model is not None
    return table, model


def feasible_space(cfg: ExperimentConfig, table: ProfileTable) -> list[CandidateConfig]:
    """The candidates a controller may choose: memory-feasible (measured outcomes first) and
    within what the profile covered (no extrapolation to parallel degrees never measured)."""
    hardware = table.key["hardware"]
    usable = device_memory_bytes(cfg, hardware) * (1 - cfg.cluster.memory_margin)
    model = table.step_time_model(cfg.flavour().shape())
    return [
        c
        for c in search_space(cfg)
        if table.feasible(c, memory_estimate(cfg, c, hardware), usable)[0] and not model.extrapolates(c)
    ]


def measured_throughputs(table: ProfileTable) -> dict[CandidateConfig, float]:
    """Samples/s of every configuration the table has measured."""
    return {m.config: m.config.gbs / m.step_time_s for m in table.measured()}


def predicted_throughputs(
    table: ProfileTable, model: StepTimeModel, space: list[CandidateConfig]
) -> dict[CandidateConfig, float]:
    """Samples/s of each configuration: the measured figure where the table has one (a lookup
    table, as COPUS profiles), the fitted model's prediction elsewhere."""
    out = {}
    for c in space:
        row = table.row(c)
        out[c] = row["samples_per_s"] if row is not None and row["status"] == "ok" else model.throughput(c)
    return out


def _screen_memory(
    cfg: ExperimentConfig,
    table: ProfileTable,
    space: list[CandidateConfig],
    hardware: dict,
    echo: Callable[[str], None],
) -> None:
    """Record what the memory model rules out (afresh each call: the limit may have changed);
    outcomes measured earlier win over the model."""
    usable = device_memory_bytes(cfg, hardware) * (1 - cfg.cluster.memory_margin)
    table.rows = [r for r in table.rows if r.get("source") != "memory_model"]
    for c in space:
        estimate = memory_estimate(cfg, c, hardware)
        ok, reason = table.feasible(c, estimate, usable)
        if not ok and not table.known(c):
            table.record(
                c, status="infeasible", source="memory_model", reason=reason, model_memory_bytes=estimate.total
            )
            echo(f"  skip {c.label()}: {reason}")


def _suspects(table: ProfileTable) -> list[CandidateConfig]:
    """Measured points whose held-out error is both large (> 10%) and twice the mean error."""
    mape = table.model["error"]["mape"]
    return [
        CandidateConfig.from_dict(r)
        for r in table.rows
        if r["status"] == "ok" and not r.get("remeasured") and r["cv_ape"] > max(0.10, 2 * mape)
    ]


class _Context:
    """Runs worker groups over a list of points, records what arrives, survives failures."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        plan,
        table: ProfileTable,
        table_dir,
        hardware: dict,
        deadline: float,
        echo: Callable[[str], None],
    ):
        self.cfg, self.plan, self.table, self.table_dir = cfg, plan, table, table_dir
        self.hardware, self.deadline, self.echo = hardware, deadline, echo
        self.fail_at = os.environ.get(FAULT_ENV) or None
        self.launches = self.measured = 0
        self.in_flight: CandidateConfig | None = None
        self.layout: tuple | None = None

    def _memory(self, c: CandidateConfig) -> float:
        return memory_estimate(self.cfg, c, self.hardware).total

    def _on_record(self, r: Record, remeasure: bool) -> None:
        if isinstance(r, ProfileLayoutRecord):
            self.layout, self.in_flight = tuple(r.layout), None
        elif isinstance(r, ProfileStartRecord):
            self.in_flight = r.candidate()
        elif isinstance(r, ProfilePointRecord):
            self._record_point(r, remeasure)
        elif isinstance(r, ProfileReshardRecord):
            left, built = CandidateConfig.from_dict(r.from_), CandidateConfig.from_dict(r.to)
            self.table.record_reshard(left, built, r.seconds, r.bytes_moved)
            self.table.save(self.table_dir)
            self.echo(
                f"  in place {left.shape_label()} -> {built.shape_label()}: {r.seconds:.2f} s, "
                f"{r.bytes_moved / 2**20:.1f} MiB moved"
            )

    def _record_point(self, r: ProfilePointRecord, remeasure: bool) -> None:
        """A measured point into the table (saved at once); measured again, as kept_step_time keeps."""
        c = r.candidate()
        old = self.table.row(c)
        values = {
            "step_time_s": r.step_time_s,
            "step_times": r.step_times,
            "samples_per_s": r.samples_per_s,
            "warmup_times": r.warmup_times,
            "timing": self.cfg.profile.timing,
        }
        if remeasure and old is not None and old["status"] == "ok":
            medians = old.get("medians", [old["step_time_s"]]) + [r.step_time_s]
            kept = kept_step_time(medians)
            values |= {"step_time_s": kept, "samples_per_s": c.gbs / kept, "medians": medians}
            values["step_times"] = old["step_times"] + r.step_times
        self.table.record(
            c,
            status="ok",
            source="measured",
            peak_memory_bytes=r.peak_memory_bytes,
            model_memory_bytes=self._memory(c),
            remeasured=remeasure,
            **values,
        )
        self.table.save(self.table_dir)
        self.in_flight = None
        self.measured += 1
        left = max(0.0, self.deadline - time.time())
        self.echo(
            f"  {c.label():<32} {r.step_time_s:.3f} s/step  {r.samples_per_s:8.1f} samples/s  "
            f"({len(self.table.measured())} measured, {left:.0f} s of budget left)"
        )

    def measure(self, points: list[CandidateConfig], remeasure: bool = False) -> None:
        done: set[CandidateConfig] = set()

        def on_record(raw: dict) -> None:
            r = parse_record(raw)
            self._on_record(r, remeasure)
            if isinstance(r, ProfilePointRecord):
                done.add(r.candidate())

        while True:
            pending = [
                c
                for c in points
                if c not in done
                and (remeasure or not self.table.known(c))
                and (not remeasure or self.table.row(c)["status"] == "ok")
            ]
            if not pending or time.time() >= self.deadline:
                return
            self.launches += 1
            job = ProfileJob(
                self.plan,
                tuple(pending),
                self.cfg.profile.warmup_steps,
                self.cfg.profile.steps,
                self.deadline,
                self.fail_at,
                timing=self.cfg.profile.timing,
            )
            self.in_flight, self.layout = None, None
            error = _run_group(self.cfg, job, on_record)
            if error is None:
                return
            self._record_failure(error, pending)

    def _record_failure(self, error: BaseException, pending: list[CandidateConfig]) -> None:
        reason = _failure_reason(error)
        if self.in_flight is not None:
            failed = [self.in_flight]
        elif self.layout is not None:  # the layout itself failed to build
            failed = [c for c in pending if (c.dp, c.tp, c.pp) == self.layout]
        else:
            raise error  # the group failed before measuring anything: not a property of a configuration
        for c in failed:
            self.table.record(
                c, status="infeasible", source="measured", reason=reason, model_memory_bytes=self._memory(c)
            )
            self.echo(f"  {c.label():<32} failed: {reason}; continuing with a new worker group")
        self.table.save(self.table_dir)


def _log_to_mlflow(cfg: ExperimentConfig, table: ProfileTable, result: dict) -> str:
    tracker = Tracker(cfg.resolved_tracking_uri(), cfg.tracking.experiment)
    params = flatten(
        {"profile": cfg.profile.model_dump(mode="json"), "search": cfg.search.model_dump(mode="json"), "key": table.key}
    )
    run_id = tracker.start_run(
        f"profile: {cfg.tracking.run_name or cfg.name}", params, {"kind": "profile", "profile.key_id": table.id}
    )
    tracker.log_values(
        run_id,
        {
            "mape": result["mape"],
            "max_ape": result["max_ape"],
            "points": result["points"],
            "infeasible": len(result["infeasible"]),
            "profile_wall_clock_s": result["wall_clock_s"],
        },
        step=0,
    )
    tracker.log_dict(run_id, table.as_dict(), f"profile/{table.file_name()}")
    tracker.finish(run_id)
    return run_id


def _print_summary(table: ProfileTable, result: dict, echo: Callable[[str], None]) -> None:
    echo(f"\n{'configuration':<32} {'measured s':>10} {'held-out pred':>13} {'error':>7}")
    for r in sorted(
        (r for r in table.rows if r["status"] == "ok"), key=lambda r: (r["dp"], r["tp"], r["pp"], r["mbs"], r["gbs"])
    ):
        label = CandidateConfig.from_dict(r).label()
        echo(f"{label:<32} {r['step_time_s']:>10.3f} {r['cv_predicted_step_time_s']:>13.3f} {r['cv_ape']:>7.1%}")
    for r in table.infeasible():
        echo(f"{CandidateConfig.from_dict(r).label():<32} infeasible: {r['reason']}")
    echo(
        f"step-time model: {result['points']} points, {result['folds']}-fold held-out error MAPE "
        f"{result['mape']:.1%}, worst {result['max_ape']:.1%} ({result['worst']})"
    )
    if result["not_measured_budget"]:
        echo(
            f"budget spent before {len(result['not_measured_budget'])} planned points; rerun to measure them "
            "(measured points are kept)"
        )
    for row in result["tradeoffs"]["fastest_by_gbs"]:
        echo(f"  fastest at GBS {row['gbs']:<5} {row['shape']:<20} {row['samples_per_s']:8.1f} samples/s")
    for line in layout_table_lines(result["tradeoffs"], result["topology"]["crossing_by_layout"]):
        echo(line)
    for line in tradeoff_lines(result["tradeoffs"]):
        echo(line)
    echo(f"table: {result['table']}")
