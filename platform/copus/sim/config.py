"""The typed simulation YAML (`copus simulate SIM.yaml`): one validated `SimConfig` out, turned
into the simulator's plain `Setting` at the edge. Problems are one line naming the field.

Two sides are kept apart: `training` is the truth the simulated run follows (a loss curve and
the critical batch, from the published fits or from a `copus calibrate` file; the progress lost
after a GBS change), `policy` and `estimate` are what the planner believes and is told (its SE
form and critical factor; the noise scale it sees: lagged, off from the truth by
`estimate.mapping_error` and `estimate.noise`). `protocol` adds the tuned baselines and seeds."""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationError, model_validator

from copus.config import (
    ConfigError,
    FieldProblem,
    LocalPath,
    PositiveInt,
    RunSpeedBand,
    Section,
    Seed,
    apply_overrides,
    format_pydantic_error,
    read_yaml,
)
from copus.core.datasheets import MFU_TOKENS, NODES, with_mfu
from copus.core.decision_rule import DEFAULT_PROFILE_POINT_LOG_SD, DEFAULT_QUANTILE_Z, DEFAULT_TRANSIENT_STEPS
from copus.core.efficiency import EfficiencyForm
from copus.core.finite import positive_number
from copus.core.layout import DP_SHARD_MODES, RECOMPUTE_MODES, CandidateConfig, DpShard, Recompute, layout_problems
from copus.core.megatron import DEFAULT_BUCKET_PARAMS, MegatronFramework
from copus.core.planner import RuleSettings
from copus.core.policy_names import DEFAULT_SUITE, PolicyName
from copus.core.ramp import BatchRamp
from copus.core.sim_calibration import CalibrationSampling
from copus.core.sim_protocol import RAMP_LENGTHS
from copus.core.sim_view import ProfileSampling
from copus.core.simulator import (
    MAX_STEPS,
    CalibratedCriticalBatch,
    Cluster,
    CriticalBatch,
    LossCurve,
    LrTransient,
    MeasuredSteps,
    NoiseEstimate,
    ReconfigurationCosts,
    RunOverheads,
    Setting,
)
from workloads.flavours import FLAVOURS


class SimMegatron(Section):
    """The Megatron-LM run the truth describes (copus.core.megatron.MegatronFramework)."""

    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    sequence_parallel: bool = True
    tp_comm_overlap: bool = False
    virtual_stages: int = Field(1, ge=1)
    bucket_params: float = Field(DEFAULT_BUCKET_PARAMS, gt=0)


class SimCluster(Section):
    node: str = "h100-sxm-8"
    nodes: int = Field(1, ge=1)
    # Whose run the step-time and memory truth is: `plain`, the datasheet model in the fitted form's
    # own shape (the default, as before), or `megatron`, a Megatron-LM run (copus.core.megatron:
    # overlap, distributed optimizer with bf16 parameters, sequence parallelism, interleaving, the
    # stage link and FLOPs as it has them), described by `megatron`.
    framework: Literal["plain", "megatron"] = "plain"
    megatron: SimMegatron = SimMegatron()
    # The node's MFU curve, MFU(w) = mfu_max w / (w + mfu_half_tokens) in tokens per rank of a
    # micro-batch (copus.core.datasheets): null keeps the datasheet's figure; set, the truth and
    # the planner's profile of it both use this one (a sensitivity, docs/simulator.md).
    mfu_max: float | None = Field(None, gt=0.0, le=1.0)
    mfu_half_tokens: float | None = Field(None, ge=0.0)
    # What the curve's w counts under tensor parallelism: `rank`, the rank's share of the
    # micro-batch's tokens (mbs x seq_len / tp), or `micro_batch`, all of them (Megatron's tensor
    # parallelism keeps every token as a row of each rank's matmuls); null: the node's (`rank`).
    mfu_tokens: Literal[MFU_TOKENS] | None = None

    @model_validator(mode="after")
    def _one_step_time_truth(self) -> SimCluster:
        if self.framework != "plain" and self.profile is not None:
            raise ValueError(
                f"framework: {self.framework} models the cluster's step times, profile measures them: set one"
            )
        return self

    # A `copus profile` table JSON of this workload on a real cluster (the emulated one): the
    # step times' truth is that profile, measured where measured and fitted elsewhere, instead of
    # the node's datasheet (copus.core.simulator.MeasuredSteps). A relative path is relative to
    # the current directory.
    profile: LocalPath | None = None
    # With `profile`: what real runs paid per step over the profile's reading, by layout label
    # (`python -m copus.sim.fit RUNS --profile TABLE` measures it); a layout not named: 1.
    run_factor: dict[str, Annotated[float, Field(gt=0.0)]] = {}

    @model_validator(mode="after")
    def _run_factor_of_a_profile(self) -> "SimCluster":
        check_layout_labels(self.run_factor, "cluster.run_factor", shapes=True)
        if self.run_factor and self.profile is None:
            raise FieldProblem("cluster.run_factor", "scales a measured profile's step times: set cluster.profile")
        return self


class SimBatch(Section):
    gbs: int = Field(128, ge=1)  # the starting GBS; the static policy keeps it
    mbs: int = Field(1, ge=1)


class SimParallel(Section):
    dp: int = Field(1, ge=1)
    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    dp_shard: DpShard = "none"
    recompute: Recompute = "none"


class SimSearch(Section):
    gbs_min: int = Field(32, ge=1)
    gbs_max: int = Field(2048, ge=1)
    mbs: list[PositiveInt] = Field([1, 2, 4], min_length=1)
    # default: every valid layout of the cluster
    layouts: list[tuple[PositiveInt, PositiveInt, PositiveInt]] | None = Field(None, min_length=1)
    dp_shard: list[DpShard] = list(DP_SHARD_MODES)  # sharded data parallelism the planner may choose
    recompute: list[Recompute] = list(RECOMPUTE_MODES)  # activation recomputation it may choose


class SimPolicy(Section):
    efficiency: EfficiencyForm = "pollux"
    critical_factor: float = Field(2.0, gt=0.0)
    decision_rule: Literal["quantile", "threshold"] = "quantile"  # as a run's (copus.core.planner)
    gain_quantile_z: float = Field(DEFAULT_QUANTILE_Z, ge=0.0)
    gain_floor: float = Field(0.0, ge=0.0)
    transient_steps: float = Field(
        DEFAULT_TRANSIENT_STEPS, ge=0.0
    )  # what the planner charges a GBS change (the truth's is `transient`)
    # sd of log c the planner reads the critical batch with: a run without a calibration or probes
    # has the prior over calibrations (copus.core.belief.PRIOR_LOG_SD)
    factor_log_sd: float = Field(0.69, ge=0.0)
    threshold: float = Field(0.10, ge=0.0)
    interval_s: float = Field(600.0, gt=0.0)
    horizon_points: int | None = Field(None, ge=3)  # as a run's `policy.horizon_points`
    read_run_speed: bool = True  # as a run's `policy.read_run_speed`
    run_speed_band: RunSpeedBand | None = None  # as a run's `policy.run_speed_band`
    # as a run's `policy.profile_point_sd`; null: the simulated profile's own timing noise
    # (profile.timing_noise: what the profiler's repeated steps tell it), or a run's default where
    # the planner reads a real profile file (profile.table)
    profile_point_sd: float | None = Field(None, ge=0.0)


class SimCosts(Section):
    in_place_fixed_s: float = Field(25.0, ge=0.0)
    restart_fixed_s: float = Field(180.0, ge=0.0)
    storage_gb_per_s: float = Field(1.0, gt=0.0)  # per node, to the checkpoint store


LAYOUT_LABEL = r"dp[1-9][0-9]*-tp[1-9][0-9]*-pp[1-9][0-9]*"
# a layout with its MBS and knobs (CandidateConfig.shape_label): dp1-tp1-pp2 mbs2 shard=full
SHAPE_LABEL = LAYOUT_LABEL + r" mbs[1-9][0-9]*( shard=[a-z_]+)?( recompute=[a-z_]+)?"


def check_layout_labels(values: dict[str, float], field: str, shapes: bool = False) -> None:
    """Keys of a by-layout table must be layout labels (dp2-tp1-pp1), or where `shapes` is set
    also layouts with their MBS (dp2-tp1-pp1 mbs4): a typo is named, not ignored."""
    for label in values:
        if not (re.fullmatch(LAYOUT_LABEL, label) or (shapes and re.fullmatch(SHAPE_LABEL, label))):
            example = "dp2-tp1-pp1 or dp1-tp1-pp2 mbs2" if shapes else "dp2-tp1-pp1"
            raise FieldProblem(f"{field}.{label}", f"expected a layout label such as {example}")


class SimOverheads(Section):
    """A real run's wall-clock outside its training steps, for a setting whose runs can be made
    (the emulated cluster): measured on real runs by `python -m copus.sim.fit RUN_DIR ...`
    (copus.core.simulator.RunOverheads). Zero by default: on a GPU cluster's run of days they
    are noise. With eval_every_steps > 0 the target is seen only at an evaluation."""

    startup_s: float = Field(0.0, ge=0.0)
    between_steps_s: float = Field(0.0, ge=0.0)
    eval_every_steps: int = Field(0, ge=0)
    eval_s: dict[str, Annotated[float, Field(ge=0.0)]] = {}  # by layout label, e.g. dp2-tp1-pp1
    eval_noise: float = Field(0.0, ge=0.0, le=1.0)  # sd of a validation loss reading, nats

    @model_validator(mode="after")
    def _layout_labels(self) -> "SimOverheads":
        check_layout_labels(self.eval_s, "overheads.eval_s")
        return self

    def plain(self) -> RunOverheads:
        return RunOverheads(
            self.startup_s, self.between_steps_s, self.eval_every_steps, tuple(self.eval_s.items()), self.eval_noise
        )


class SimLossCurve(Section):
    e: float = Field(1.69, gt=0.0)
    a: float = Field(406.4, ge=0.0)
    alpha: float = Field(0.34, gt=0.0)
    b: float = Field(410.7, ge=0.0)
    beta: float = Field(0.28, gt=0.0)
    # The loss at zero data, where the fitted form diverges; default ln(vocabulary size), an
    # untrained model's uniform prediction (copus.core.simulator.LossCurve).
    initial: float | None = Field(None, gt=0.0)


class SimCriticalBatch(Section):
    b_star_tokens: float = Field(2.1e8, gt=0.0)
    alpha_b: float = Field(0.21, gt=0.0)
    flat_tokens: float | None = Field(None, gt=0.0)  # a constant critical batch instead


class SimTraining(Section):
    """The truth: loss against effective tokens, and the true critical batch against the loss
    (the published fit under `critical_batch`, or measured: `calibration`, a `copus calibrate`
    JSON; a relative path is relative to the current directory, as every path)."""

    target_loss: float = Field(gt=0.0)
    max_hours: float = Field(24.0 * 60, gt=0.0)  # simulated time limit
    # After a GBS change the first transient_steps steps make less progress, from
    # transient_efficiency back up to 1 (copus.core.simulator.LrTransient; our assumption).
    transient_steps: int = Field(20, ge=0)  # ~1 / (1 - AdamW's beta2 0.95)
    transient_efficiency: float = Field(0.5, gt=0.0, le=1.0)
    loss_curve: SimLossCurve = SimLossCurve()
    critical_batch: SimCriticalBatch = SimCriticalBatch()
    calibration: LocalPath | None = None

    @model_validator(mode="after")
    def _one_critical_batch(self) -> "SimTraining":
        if self.calibration is not None and "critical_batch" in self.model_fields_set:
            raise FieldProblem("training.calibration", "give either a calibration or training.critical_batch, not both")
        return self


class SimEstimate(Section):
    """The noise scale the planner sees: b_noise = mapping_error × ε × B_crit(lagged) / c, the
    true critical batch the run had the estimate's mean age ago (an EMA of half-life
    half_life_share × samples seen, at least min_half_life reference batches: batch.gbs), ε the
    estimate's relative noise (`noise` its σ, autocorrelated over decisions as the EMA's error,
    seeded by `seed`), c = policy.critical_factor. Defaults from the live estimate measured
    against fixed-weight measurements (copus.core.simulator.NoiseEstimate); half_life_share 0,
    min_half_life 0 and noise 0 are the oracle."""

    mapping_error: float = Field(1.0, gt=0.0)
    noise: float = Field(0.35, ge=0.0, le=10.0)  # sigma: at 10 the estimate is already off by e^10 at one z
    distribution: Literal["lognormal", "gaussian"] = "lognormal"
    seed: Seed = 0
    half_life_share: float = Field(0.05, ge=0.0, le=1.0)  # gns.half_life_share
    min_half_life: float = Field(8.0, ge=0.0)  # gns.min_half_life, in reference batches (batch.gbs)


class SimRamp(Section):
    """The `ramp` policy's schedule (copus.core.ramp): Megatron's linear ramp from start_gbs by
    increment over `samples` to final_gbs, or a table [[samples, gbs], ...] from 0 samples. It
    trains in the configuration of best throughput at the final GBS that admits every GBS of it."""

    start_gbs: PositiveInt | None = None
    increment: PositiveInt | None = None
    samples: PositiveInt | None = None
    final_gbs: PositiveInt | None = None
    table: list[tuple[Annotated[int, Field(ge=0)], PositiveInt]] | None = Field(None, min_length=1)

    def schedule(self) -> BatchRamp:
        if self.table is not None:
            return BatchRamp.from_table(self.table)
        return BatchRamp.linear(self.start_gbs, self.increment, self.samples, self.final_gbs)

    @model_validator(mode="after")
    def _one_form(self) -> "SimRamp":
        linear = {"start_gbs": self.start_gbs, "increment": self.increment, "samples": self.samples}
        linear["final_gbs"] = self.final_gbs
        given = [k for k, v in linear.items() if v is not None]
        if self.table is not None and given:
            raise FieldProblem(f"ramp.{given[0]}", "give start_gbs, increment, samples and final_gbs, or a table")
        missing = [k for k, v in linear.items() if v is None]
        if self.table is None and missing:
            raise FieldProblem(f"ramp.{missing[0]}", "required (or give ramp.table: [[samples, gbs], ...])")
        try:
            self.schedule()
        except ValueError as err:
            raise FieldProblem("ramp.table" if self.table is not None else "ramp", str(err)) from None
        return self


class SimProfile(Section):
    """How the planner's step-time table is made (copus.core.sim_view): a profile of the
    simulated cluster as `copus profile` makes one (points spread over each layout and MBS while
    budget_h of the cluster lasts, each the true step time off by timing_noise, the model fitted
    to them elsewhere), redrawn at every seed; exact: the truth's own table (before issue 42)."""

    exact: bool = False
    # A real `copus profile` file the planner reads instead (of this workload and world size, as
    # cluster.profile): what a real run's planner on this cluster reads (copus.core.sim_view.table_view).
    table: LocalPath | None = None
    timing_noise: float = Field(0.02, ge=0.0, le=1.0)  # sd of log of a measured step time
    gbs_per_shape: int = Field(3, ge=1)
    max_microbatches: int | None = Field(16, ge=1)
    budget_h: float = Field(4.0, gt=0.0)
    steps_per_point: int = Field(4, ge=1)  # warm-up and timed steps

    def sampling(self) -> ProfileSampling:
        return ProfileSampling(
            self.exact,
            self.timing_noise,
            self.gbs_per_shape,
            self.max_microbatches,
            self.budget_h * 3600,
            self.steps_per_point,
        )


class SimCalibration(Section):
    """How the planner's efficiency mapping is made (copus.core.sim_calibration): a `copus
    calibrate` of the truth (a reference run at batch.gbs branched at `branch_shares` of its
    samples to the target, continuations at every GBS of the grid to `decrement` below each
    branch point, measured `seeds` times with a real sweep's scatter, fitted as a real
    calibration is), redrawn at every seed; use false: the configured c x B_noise
    (policy.critical_factor), as a run without a calibration maps it (before issue 42)."""

    use: bool = True
    branch_shares: list[Annotated[float, Field(gt=0.0, lt=1.0)]] = Field([0.01, 0.03, 0.1], min_length=1)
    gbs: list[PositiveInt] | None = Field(None, min_length=2)  # default: every other power of 2 over the search range
    seeds: int = Field(4, ge=1)
    decrement: float = Field(0.02, gt=0.0)  # nats each continuation trains down
    point_noise: float = Field(0.15, ge=0.0, le=2.0)  # sd of log samples of one continuation
    seed_noise: float = Field(0.1, ge=0.0, le=2.0)  # sd of log of a seed's luck, shared by its GBS

    def sampling(self) -> CalibrationSampling:
        return CalibrationSampling(
            self.use,
            tuple(self.branch_shares),
            tuple(self.gbs) if self.gbs is not None else None,
            self.seeds,
            self.decrement,
            self.point_noise,
            self.seed_noise,
        )


class SimProtocol(Section):
    """The comparison protocol (copus.core.sim_protocol): tuned static over every GBS of the
    grid, tuned ramp over the grid's final GBS and `ramp_lengths` (shares of the samples the
    target takes at a vanishingly small batch), every other policy over `seeds` seeds of the
    estimation noise (estimate.seed, +1, ...)."""

    seeds: int = Field(5, ge=1, le=50)
    ramp_lengths: list[Annotated[float, Field(gt=0.0, le=10.0)]] = Field(list(RAMP_LENGTHS), min_length=1)


class SimPaper(Section):
    """What the COPUS paper reports for this setting, printed beside our figures."""

    copus_speedup_vs_fastest_baseline: float | None = None
    note: str = ""


class SimConfig(Section):
    name: str = "simulation"
    model: str
    seq_len: int = Field(4096, ge=1)
    cluster: SimCluster = SimCluster()
    batch: SimBatch = SimBatch()
    parallel: SimParallel | None = None  # the starting layout; default: data parallel over the cluster
    search: SimSearch = SimSearch()
    policy: SimPolicy = SimPolicy()
    profile: SimProfile = SimProfile()
    calibration: SimCalibration = SimCalibration()
    reconfigure: Literal["in_place", "restart"] = "in_place"
    costs: SimCosts = SimCosts()
    overheads: SimOverheads = SimOverheads()
    training: SimTraining
    estimate: SimEstimate = SimEstimate()
    policies: list[PolicyName] = Field(list(DEFAULT_SUITE), min_length=1)
    ramp: SimRamp | None = None  # the ramp policy's schedule
    protocol: SimProtocol | None = None  # None: the policies at estimate.seed only
    paper: SimPaper = SimPaper()

    @model_validator(mode="after")
    def _rules(self) -> "SimConfig":
        if self.model not in FLAVOURS:
            raise FieldProblem("model", f"unknown flavour {self.model!r} (known: {', '.join(FLAVOURS)})")
        if self.cluster.node not in NODES:
            raise FieldProblem("cluster.node", f"unknown node {self.cluster.node!r} (known: {', '.join(NODES)})")
        if self.search.gbs_min > self.search.gbs_max:
            raise FieldProblem(
                "search.gbs_min", f"{self.search.gbs_min} is larger than search.gbs_max {self.search.gbs_max}"
            )
        if len(set(self.policies)) != len(self.policies):
            raise FieldProblem("policies", f"list each policy once (got {self.policies})")
        if "ramp" in self.policies and self.ramp is None:
            raise FieldProblem("policies", "'ramp' needs the ramp section (start_gbs, increment, samples, final_gbs)")
        world = NODES[self.cluster.node].accelerators_per_node * self.cluster.nodes
        start = self.parallel or SimParallel(dp=world)
        problems = layout_problems(
            start.dp, start.tp, start.pp, FLAVOURS[self.model].shape(), world, self.batch.gbs, self.batch.mbs
        )
        if problems:  # the layout rules name experiment fields; here the cluster is nodes x node
            field, message = problems[0]
            raise FieldProblem(field.replace("cluster.num_workers", "cluster.nodes"), message)
        _check_reachable(self)
        return self


def _check_reachable(cfg: SimConfig) -> None:
    """A target the truth never reaches, or reaches only after more steps than the simulator
    takes (copus.core.simulator.MAX_STEPS) even at the largest GBS, is refused before simulating."""
    t = cfg.training
    curve, params = LossCurve(**t.loss_curve.model_dump()), FLAVOURS[cfg.model].param_count()
    tokens = curve.tokens_to(params, t.target_loss)
    if tokens is None:
        raise FieldProblem(
            "training.target_loss",
            f"{t.target_loss:g} is never reached: the loss curve's floor for {cfg.model} is "
            f"{curve.floor(params):.4g} (training.loss_curve: e + a / N^alpha)",
        )
    steps = tokens / (cfg.search.gbs_max * cfg.seq_len)
    if steps > MAX_STEPS:
        raise FieldProblem(
            "training.target_loss",
            f"{t.target_loss:g} needs at least {steps:.3g} steps even at search.gbs_max {cfg.search.gbs_max} and "
            f"seq_len {cfg.seq_len}, more than the simulator's {MAX_STEPS:,}: raise the target, seq_len or gbs_max",
        )


def load_sim_config(path: str | os.PathLike, overrides: list[str] | None = None) -> SimConfig:
    raw = read_yaml(path, "simulation")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping")
    try:
        cfg = SimConfig.model_validate(apply_overrides(raw, overrides or []))
    except ValidationError as err:
        raise ConfigError(f"{path}: {format_pydantic_error(err)}") from None
    measured_steps_of(cfg)  # a profile file is refused here, in one line, rather than when simulating
    planner_table_of(cfg)
    if cfg.training.calibration is None:
        return cfg
    calibration = Path(cfg.training.calibration).expanduser().resolve()
    try:
        read_calibration(calibration)
    except ConfigError as err:
        raise ConfigError(f"{path}: training.calibration: {err}") from None
    return cfg.model_copy(update={"training": cfg.training.model_copy(update={"calibration": str(calibration)})})


def read_calibration(path: str | os.PathLike) -> list[dict]:
    """The branch points of a `copus calibrate` JSON that measured a finite critical batch
    (`val_loss`, `b_crit` in sequences); a null `b_crit` (none measurable) is skipped."""
    if not Path(path).is_file():
        raise ConfigError(f"file not found: {path}")
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ConfigError(f"{path}: not a readable JSON file ({err})") from None
    points = data.get("branch_points") if isinstance(data, dict) else None
    if not isinstance(points, list) or not points:
        raise ConfigError(f"{path}: branch_points: expected a non-empty list")
    for i, p in enumerate(points):
        where = f"{path}: branch_points[{i}]"
        if not isinstance(p, dict):
            raise ConfigError(f"{where}: expected a mapping")
        if not positive_number(p.get("val_loss")):
            raise ConfigError(f"{where}.val_loss: expected a positive number (got {p.get('val_loss')!r})")
        if p.get("b_crit") is not None and not positive_number(p["b_crit"]):
            raise ConfigError(f"{where}.b_crit: expected a positive number of sequences or null (got {p['b_crit']!r})")
        if "decrement" in p and not (positive_number(p["decrement"]) or p["decrement"] == 0):
            raise ConfigError(f"{where}.decrement: expected a number >= 0 (got {p['decrement']!r})")
    measured = [p for p in points if p.get("b_crit") is not None]
    if not measured:
        raise ConfigError(f"{path}: branch_points: no branch point has a finite b_crit")
    return measured


def critical_batch_of(cfg: SimConfig) -> CriticalBatch | CalibratedCriticalBatch:
    """The true critical batch: the calibration's branch points, or the published fit."""
    t = cfg.training
    if t.calibration is None:
        return CriticalBatch(**t.critical_batch.model_dump())
    return CalibratedCriticalBatch.from_branch_points(
        read_calibration(t.calibration), cfg.seq_len, source=f"calibration {t.calibration}"
    )


def measured_steps_of(cfg: SimConfig) -> MeasuredSteps | None:
    """The step times' truth of `cluster.profile` (None without one), at the runs' own speed
    where `cluster.run_factor` gives it."""
    if cfg.cluster.profile is None:
        return None
    steps = profile_steps(cfg, cfg.cluster.profile, "cluster.profile")
    return replace(steps, run_factor=tuple(sorted(cfg.cluster.run_factor.items())))


def planner_table_of(cfg: SimConfig) -> MeasuredSteps | None:
    """The real profile the planner reads, `profile.table` (None: it profiles the simulated cluster)."""
    return None if cfg.profile.table is None else profile_steps(cfg, cfg.profile.table, "profile.table")


def profile_steps(cfg: SimConfig, file: str, field: str) -> MeasuredSteps:
    """A `copus profile` file's step times (`field` names it in errors): it must be of this
    model, sequence length and world size, and hold a fitted model."""
    world = NODES[cfg.cluster.node].accelerators_per_node * cfg.cluster.nodes
    wanted = "this simulation is {}, seq_len {} on {} (cluster.nodes x the node's accelerators)"
    return read_profile_steps(Path(file).expanduser(), field, cfg.model, cfg.seq_len, world, wanted)


def read_profile_steps(
    path: Path, field: str, model_name: str, seq_len: int, world: int, wanted: str = "wanted: {}, seq_len {} on {}"
) -> MeasuredSteps:
    """A `copus profile` file's step times, refused in one line (naming `field`) unless it is of
    this model, sequence length and world size and holds a fitted model; `wanted` says whose
    those are in the refusal (a format of model, sequence length and world size)."""
    from copus.cluster.profile_table import ProfileTable, ProfileTableError  # no ray: a JSON file

    where = f"{field}: {path}"
    if not path.is_file():
        raise ConfigError(f"{where}: file not found")
    try:
        table = ProfileTable.load(path)
    except ProfileTableError as err:
        raise ConfigError(f"{field}: {err}") from None
    workload = table.key.get("workload", {})
    found = (workload.get("model"), workload.get("seq_len"), table.key.get("world_size"))
    if found != (model_name, seq_len, world):
        raise ConfigError(
            f"{where}: profiles model {found[0]}, seq_len {found[1]} on {found[2]} workers; "
            + wanted.format(model_name, seq_len, world)
        )
    model = table.step_time_model(FLAVOURS[model_name].shape())
    if model is None:
        raise ConfigError(f"{where}: the table has no fitted step-time model; run copus profile to the end")
    measured = tuple((m.config, m.step_time_s) for m in table.measured())
    infeasible = frozenset(CandidateConfig.from_dict(r) for r in table.infeasible())
    error = (table.model or {}).get("error") or {}
    held_out = (float(error.get("mape", 0.0)), float(error.get("max_ape", error.get("mape", 0.0))))
    return MeasuredSteps(measured, model, infeasible, source=str(path), held_out=held_out)


def profile_point_sd_of(cfg: SimConfig) -> float:
    """What the planner weighs a profile point with (`policy.profile_point_sd`, else the default)."""
    if cfg.policy.profile_point_sd is not None:
        return cfg.policy.profile_point_sd
    return cfg.profile.timing_noise if cfg.profile.table is None else DEFAULT_PROFILE_POINT_LOG_SD


def framework_of(cluster: SimCluster) -> MegatronFramework | None:
    """The framework the truth describes: None for the plain model."""
    if cluster.framework == "plain":
        return None
    return MegatronFramework(**cluster.megatron.model_dump())


def setting_from(cfg: SimConfig) -> Setting:
    """The plain simulator inputs of a validated config."""
    node = with_mfu(NODES[cfg.cluster.node], cfg.cluster.mfu_max, cfg.cluster.mfu_half_tokens, cfg.cluster.mfu_tokens)
    cluster = Cluster(node, cfg.cluster.nodes, framework_of(cfg.cluster))
    p = cfg.parallel or SimParallel(dp=cluster.world)
    t, c = cfg.training, cfg.costs
    return Setting(
        cluster=cluster,
        shape=FLAVOURS[cfg.model].shape(),
        seq_len=cfg.seq_len,
        start=CandidateConfig(p.dp, p.tp, p.pp, cfg.batch.mbs, cfg.batch.gbs, p.dp_shard, p.recompute),
        gbs_min=cfg.search.gbs_min,
        gbs_max=cfg.search.gbs_max,
        mbs=tuple(cfg.search.mbs),
        target_loss=t.target_loss,
        form=cfg.policy.efficiency,
        critical_factor=cfg.policy.critical_factor,
        threshold=cfg.policy.threshold,
        rule=RuleSettings(
            cfg.policy.decision_rule,
            cfg.policy.gain_quantile_z,
            cfg.policy.gain_floor,
            cfg.policy.transient_steps,
            horizon_points=cfg.policy.horizon_points,
            read_run_speed=cfg.policy.read_run_speed,
            run_speed_band=cfg.policy.run_speed_band,
            profile_point_log_sd=profile_point_sd_of(cfg),
        ),
        factor_log_sd=cfg.policy.factor_log_sd,
        interval_s=cfg.policy.interval_s,
        reconfigure=cfg.reconfigure,
        costs=ReconfigurationCosts(c.in_place_fixed_s, c.restart_fixed_s, c.storage_gb_per_s * 1e9),
        curve=LossCurve(**t.loss_curve.model_dump()),
        critical=critical_batch_of(cfg),
        transient=LrTransient(t.transient_steps, t.transient_efficiency),
        estimate=NoiseEstimate(**cfg.estimate.model_dump()),
        max_hours=t.max_hours,
        layouts=tuple(tuple(x) for x in cfg.search.layouts) if cfg.search.layouts else None,
        dp_shard=tuple(cfg.search.dp_shard),
        recompute=tuple(cfg.search.recompute),
        ramp=cfg.ramp.schedule() if cfg.ramp is not None else None,
        profile=cfg.profile.sampling(),
        calibration=cfg.calibration.sampling(),
        measured=measured_steps_of(cfg),
        planner_table=planner_table_of(cfg),
        overheads=cfg.overheads.plain(),
    )
