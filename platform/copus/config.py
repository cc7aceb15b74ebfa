"""The typed experiment config: YAML in, one validated `ExperimentConfig` out.

Read only at the edges (CLI, driver, worker entry); everything inward takes plain values.
Every problem is reported as one line naming the YAML path of the field, e.g.
``batch.gbs: 30 is not divisible by parallel.dp x batch.mbs = 2 x 4``.
"""

from __future__ import annotations

import copy
import ipaddress
import os
import re
import reprlib
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from copus.core.decision_rule import DEFAULT_PROFILE_POINT_LOG_SD, DEFAULT_QUANTILE_Z
from copus.core.efficiency import DEFAULT_CRITICAL_FACTOR, EfficiencyForm
from copus.core.layout import DP_SHARD_MODES, RECOMPUTE_MODES, CandidateConfig, DpShard, Recompute
from copus.core.planner import check_run_speed_band
from copus.core.policy_names import DEFAULT_SUITE, POLICIES, SCHEDULED, TUNED_ENTRY, PolicyName
from copus.storage import Location, StorageError, check_location, first_line, local_path, shown
from workloads import catalog

# A path, or a URI pyarrow opens (s3://, gs://, ...): where run files go (copus.storage).
StorageLocation = Annotated[str, AfterValidator(check_location)]
PositiveInt = Annotated[int, Field(ge=1)]
# numpy's generators take any non-negative seed, torch's manual_seed one below 2**64; a suite
# adds its repeat index, so the largest seed leaves room below that.
Seed = Annotated[int, Field(ge=0, lt=2**63)]
# An Adam moment's decay: 1 or more never forgets (torch refuses it when the optimiser is built).
Beta = Annotated[float, Field(ge=0.0, lt=1.0)]


def check_local(text: str) -> str:
    """A config value that names a local file or directory (read with the os, not pyarrow): no
    URI, and a path that can name a file (copus.storage.local_path)."""
    scheme, sep, _ = text.partition("://")
    if sep and scheme.isidentifier():
        raise ValueError(f"{shown(text)}: a URI; this field reads a local path only (download it first)")
    local_path(text)
    return text


LocalPath = Annotated[str, AfterValidator(check_local)]
# policy.run_speed_band: [low, high] around 1 (copus.core.planner.Planner.at_run_speed)
RunSpeedBand = Annotated[tuple[float, float], AfterValidator(check_run_speed_band)]


class ConfigError(ValueError):
    """A config problem, already phrased as one line ``path: what is wrong``."""


class Section(BaseModel):
    # Unknown keys are refused: a typo must never silently fall back to a default. Infinity is
    # refused like NaN (YAML's .inf, or 1e400): no rate, loss or limit of a run is infinite.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class DatasetConfig(Section):
    # stdlib: the Python standard library's source, built on first use (no download).
    kind: Literal["stdlib", "txt", "jsonl", "parquet", "bin"] = "stdlib"
    path: LocalPath | None = None  # txt/jsonl/parquet: a file, a directory of such files, or a glob pattern
    val_path: LocalPath | None = None
    text_field: str = "text"
    dtype: Literal["uint16", "uint32"] = "uint16"
    val_fraction: float = Field(0.01, gt=0.0, lt=0.5)
    cache_dir: LocalPath | None = None  # default: $COPUS_CACHE or ~/.cache/copus


class WorkloadConfig(Section):
    model: str = "tiny"
    seq_len: int = Field(128, ge=8)
    dataset: DatasetConfig = DatasetConfig()
    seed: Seed = 0
    init_from: LocalPath | None = None  # a Hugging Face model directory (Llama, Qwen2): shape and initial weights
    tokenizer: LocalPath | None = None  # a tokenizer.json (or a directory holding one) for txt/jsonl/parquet data

    @model_validator(mode="before")
    @classmethod
    def _model_from_init_dir(cls, data: Any) -> Any:
        # With init_from the shape comes from its config.json; the model is named after the directory.
        if isinstance(data, dict) and data.get("init_from"):
            if data.get("model") is not None:  # `--set workload.model=null` drops a template's model
                raise FieldProblem(
                    "workload.model",
                    "leave it out when workload.init_from is set (the shape comes from the directory's config.json)",
                )
            data = {**data, "model": f"hf:{_directory_name(str(data['init_from']))}"}
        return data


def _directory_name(path: str) -> str:
    """The name of the directory a path names (a path that cannot name one is refused by the
    field's own check: `LocalPath`)."""
    try:
        return local_path(path).name
    except StorageError:
        return Path(path).name


class OptimizerConfig(Section):
    name: Literal["adamw"] = "adamw"
    lr: float = Field(3e-3, gt=0.0)
    reference_gbs: int = Field(16, ge=1)  # the GBS at which `lr` is the right LR
    lr_scaling: Literal["sqrt", "linear", "none", "adascale"] = "sqrt"
    betas: tuple[Beta, Beta] = (0.9, 0.95)
    eps: float = Field(1e-8, gt=0.0)
    weight_decay: float = Field(0.1, ge=0.0)
    grad_clip: float | None = Field(1.0, gt=0.0)


class ScheduleConfig(Section):
    # Counted in samples, not steps: the step length changes when the GBS does.
    warmup_samples: int = Field(0, ge=0)
    decay: Literal["constant", "cosine"] = "constant"
    decay_samples: int | None = Field(None, ge=1)
    min_lr_ratio: float = Field(0.1, ge=0.0, le=1.0)


class RampConfig(Section):
    """`policy.name: ramp`: the GBS by samples seen (copus.core.ramp), up to batch.gbs. Megatron's
    linear ramp (start_gbs, increment, samples) or an explicit table [[samples, gbs], ...]."""

    start_gbs: int | None = Field(None, ge=1)
    increment: int | None = Field(None, ge=1)
    samples: int | None = Field(None, ge=1)  # the ramp's length: batch.gbs is reached here
    table: list[tuple[Annotated[int, Field(ge=0)], PositiveInt]] | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _one_form(self) -> "RampConfig":
        linear = {"start_gbs": self.start_gbs, "increment": self.increment, "samples": self.samples}
        if self.table is not None:
            given = [k for k, v in linear.items() if v is not None]
            if given:
                raise FieldProblem(
                    f"batch.ramp.{given[0]}", "give start_gbs, increment and samples, or a table, not both"
                )
            return self
        missing = [k for k, v in linear.items() if v is None]
        if missing:
            raise FieldProblem(f"batch.ramp.{missing[0]}", "required (or give batch.ramp.table: [[samples, gbs], ...])")
        return self


class BatchConfig(Section):
    gbs: int = Field(16, ge=1)  # with batch.ramp: the final GBS, where the ramp ends
    mbs: int = Field(4, ge=1)
    ramp: RampConfig | None = None


class ParallelConfig(Section):
    dp: int = Field(1, ge=1)
    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    pp_schedule: Literal["1f1b", "gpipe"] = "1f1b"
    # Sharded data parallelism: none (every replica holds all), optimizer (AdamW state and
    # gradients sharded over dp), full (parameters too: FSDP2). Activation recomputation: none,
    # selective (attention core, MLP activation), full (every layer from its input).
    dp_shard: DpShard = "none"
    recompute: Recompute = "none"


class GNSConfig(Section):
    enabled: bool = True
    # How far back the estimate reaches (copus.core.gns): progress, a half-life of
    # half_life_share x the samples seen (at least min_half_life reference batches), so it keeps
    # up with a noise scale that grows during training; fixed, smoothing per reference batch.
    horizon: Literal["progress", "fixed"] = "progress"
    half_life_share: float = Field(0.05, gt=0.0, le=1.0)
    min_half_life: float = Field(8.0, gt=0.0)  # in reference batches (optimizer.reference_gbs)
    smoothing: float = Field(0.999, gt=0.0, lt=1.0)  # horizon fixed: EMA factor per reference batch
    critical_factor: float = Field(DEFAULT_CRITICAL_FACTOR, gt=0.0)  # critical batch = factor x B_noise
    precondition: Literal["none", "adam"] = "none"  # divide gradients by sqrt(v_hat) + eps first (AdaptDL)
    # A step whose tr(Sigma) estimate exceeds this multiple of the average's (an outlier batch)
    # counts for that multiple of the average over its tr(Sigma) of its samples; null (default):
    # every step at full weight. docs/noise-scale.md, "Outlier steps".
    outlier_ratio: float | None = Field(None, gt=1.0)


class ProbesConfig(Section):
    """`policy.probes`: the controller measures its critical-batch factor c during the run
    (docs/controller.md, "Probes"). auto: when the run has no calibration (a calibration measured
    c per progress level already), for copus and copus-gbs; true: for those with one too."""

    enabled: bool | Literal["auto"] = "auto"
    max_probes: int = Field(3, ge=1)
    samples: int = Field(1024, ge=1)  # a probe's longest length (the run's own curve it is set against is as long)
    share: float = Field(0.5, gt=0.0)  # a probe's length as a share of the samples seen at its start
    min_steps: int = Field(12, ge=2)  # but at least this many steps of the larger GBS
    spacing: float = Field(2.0, ge=1.0)  # a probe starts at least spacing x the last one's samples
    first_samples: int | None = Field(None, ge=0)  # none before; default: schedule.warmup_samples
    prior_sd: float = Field(0.69, gt=0.0)  # sd of log c before any probe (a factor of 2)
    drift_sd: float = Field(0.5, ge=0.0)  # random walk of log c per e-fold of samples seen
    quantile_z: float = Field(1.0, gt=0.0)  # the decision at c x exp(+-z sd) must agree, else probe
    # ... and the probe must pay: half the goodput at stake over a horizon as long as the run so far,
    # against its samples at the run's speed, at least this many times over (copus.core.probing). 0: no such test.
    min_value_ratio: float = Field(1.0, ge=0.0)


class PolicyConfig(Section):
    name: PolicyName = "static"
    efficiency: EfficiencyForm = "pollux"  # statistical-efficiency form (copus.core.efficiency)
    # How a switch is decided (copus.core.planner): "quantile" weighs each move's gain at its
    # lower quantile against its full cost over the rest of the run; "threshold", the rule before,
    # wants `threshold` ahead at the central estimate and prices a GBS change at 0.
    decision_rule: Literal["quantile", "threshold"] = "quantile"
    gain_quantile_z: float = Field(
        DEFAULT_QUANTILE_Z, ge=0.0
    )  # the quantile rule reads the gain z sd below its estimate
    gain_floor: float = Field(0.0, ge=0.0)  # ... and wants that pessimistic gain at least this high
    # steps of the new GBS a switch's transient costs; default: the calibration's measurement, else 3
    transient_steps: float | None = Field(None, ge=0.0)
    # The rest of the run is read off the validation curve fitted over the latest doubling of the
    # samples (null); N: over the latest N evaluations, the rule before Dec 2026 (8)
    horizon_points: int | None = Field(None, ge=3)
    # Candidates read at the run's own speed: the current configuration at the speed the run
    # measures in it, the others through the step-time model scaled by the same factor (false:
    # the profile's figures as they are, the rule before Dec 2026)
    read_run_speed: bool = True
    # ... where each figure is its profile point and the step-time model's prediction weighed by
    # their precision: this is the sd of log of a point against what a run pays (beyond a factor
    # common to all points), the model's is its held-out error (copus.core.planner.blended_throughputs)
    profile_point_sd: float = Field(DEFAULT_PROFILE_POINT_LOG_SD, ge=0.0)
    # ... and the factor the current configuration's speed carries to the others bounded to
    # [low, high]: beyond it, a slowdown is the configuration's own, not the machine's, and the
    # configurations this run has trained in read at their own speed (null: no bound, the rule
    # before Dec 2026; docs/emulated-cluster.md, "One slow configuration is not a slow machine")
    run_speed_band: RunSpeedBand | None = None
    # how a run's speed in a configuration is read off its latest steps: their median step time,
    # deaf to rare slow steps (the rule before Dec 7, 2026 and the default while the second layout
    # suite runs), or their mean, what the run pays when its steps are bimodal
    run_speed_reading: Literal["median", "mean"] = "median"
    threshold: float = Field(0.10, ge=0.0)  # threshold rule: the best must beat the current goodput by this much
    interval_s: float = Field(30.0, gt=0.0)  # decision interval (wall-clock); the switch must pay off within it
    restart_cost_s: float = Field(30.0, ge=0.0)  # a restart's cost until one has been measured
    # an in-place layout change's cost until the run has measured one: null, what the profile's
    # own in-place changes between its layouts took (copus.cluster.profile_table), else 5 s
    in_place_cost_s: float | None = Field(None, ge=0.0)
    controller_timeout_s: float = Field(10.0, gt=0.0)  # rank 0 waits at most this long for a decision
    layout: Literal["given", "best"] = (
        "given"  # static: the parallel section's layout, or the profile's best for batch.gbs
    )
    probes: ProbesConfig = ProbesConfig()


class StopConfig(Section):
    target_val_loss: float | None = Field(None, gt=0.0)
    max_steps: int | None = Field(None, ge=1)
    max_samples: int | None = Field(None, ge=1)
    max_wall_clock_s: float | None = Field(None, gt=0.0)
    # A step with a non-finite loss or gradient is skipped (no update, counted, logged); more
    # than this many in a row stop the run with an error and a checkpoint of the last finite weights.
    max_nonfinite_steps: int = Field(3, ge=0)


class EvalConfig(Section):
    every_steps: int = Field(20, ge=1)
    # In samples instead (wins over every_steps): the same data between evaluations at any GBS.
    every_samples: int | None = Field(None, ge=1)
    val_samples: int = Field(64, ge=1)


class CheckpointConfig(Section):
    every_steps: int = Field(50, ge=1)
    every_samples: int | None = Field(None, ge=1)  # in samples instead (wins over every_steps)
    every_s: float | None = Field(None, gt=0.0)  # also checkpoint when this much wall-clock has passed
    keep: int = Field(2, ge=1)


class EmulateConfig(Section):
    """A cluster of `nodes` emulated on this machine (copus.cluster.emulate): each node a network
    namespace with its own address on a bridge, its link to the bridge capped at `link_mbit` in
    both directions, its Ray node and workers pinned to its own cores. Needs root."""

    nodes: int = Field(2, ge=2, le=64)
    link_mbit: float = Field(..., gt=0.0, le=100_000.0)  # the inter-node rate, each direction
    # The reference step's compute (`python -m copus.train.reference_step EXPERIMENT`) on the
    # machine link_mbit was chosen on: set, the rate on another machine is link_mbit times this
    # over the step measured there, so that the all-reduce weighs against compute alike
    # (copus.cluster.emulate_link). Unset: link_mbit on every machine.
    compute_reference_s: float | None = Field(None, gt=0.0, le=3600.0)
    # How often this machine's reference step is measured: once per machine and workload
    # (`machine`, kept in a cache), or at the start of every run and profile (`run`), the links
    # of the cluster that is up re-capped to it: on a machine whose speed drifts over the hours a
    # suite runs, every run keeps the ratio the rate was chosen for.
    compute_reference_every: Literal["machine", "run"] = "machine"
    cores_per_node: int = Field(1, ge=1)  # cores each node owns (wrapping round the machine's cores)
    # The TCP congestion control of the links' routes (`ip route ... congctl`); `host` leaves the
    # machine's default. Cubic by default (since Dec 7, 2026; host before): where the machine's
    # default is BBR, a token-bucket link makes a pipeline's 128 KiB sends stall now and then
    # (pp2 mbs 2 on the tiny model: 35% of steps 1.5x slow, 3% with cubic;
    # docs/emulated-cluster.md), which no real link does.
    congestion_control: str = Field("cubic", pattern=r"^[a-z0-9_]{1,16}$")
    subnet: str = "10.77.0.0/24"  # the bridge's; the head is .1, node i is .(10 + i)
    port: int = Field(6390, ge=1024, le=65535)  # the head's GCS port; its dashboard (job API) is port + 1
    state_dir: LocalPath = "/tmp/copus-emu"  # the cluster's state file, token and Ray session files


class ClusterConfig(Section):
    # A Ray cluster to join ("host:port", or "auto" for the one this machine started); RAY_ADDRESS
    # wins over it. Neither set: a private local Ray instance for this command alone.
    address: str | None = None
    emulate: EmulateConfig | None = None  # train on a multi-node cluster emulated on this machine
    num_workers: int = Field(1, ge=1)
    use_gpu: bool = False
    cpus_per_worker: float = Field(1.0, gt=0.0)
    gpus_per_worker: float = Field(1.0, gt=0.0)
    mixed_precision: Literal["no", "bf16", "fp16"] = "no"
    report_every_steps: int = Field(1, ge=1)  # how often rank 0 sends metrics to the driver
    # A worker group that fails (a worker killed, a node lost) is restarted by Ray Train from
    # the last checkpoint, in the layout it had reached, this many times before the run fails.
    max_failures: int = Field(3, ge=0)
    memory_per_worker_gb: float | None = Field(None, gt=0.0)  # default: detected (GPU memory, or host RAM / workers)
    memory_margin: float = Field(0.1, ge=0.0, lt=1.0)  # share of it the memory model keeps free


class SearchConfig(Section):
    """The configurations the profiler measures and the controller may choose from."""

    gbs_min: int | None = Field(None, ge=1)  # default: batch.gbs
    gbs_max: int | None = Field(None, ge=1)  # default: batch.gbs
    mbs: list[PositiveInt] | None = None  # default: [batch.mbs]
    # [dp, tp, pp] each; default: every valid layout
    layouts: list[tuple[PositiveInt, PositiveInt, PositiveInt]] | None = None
    dp_shard: list[DpShard] | None = None  # sharding modes the planner may choose; default: [parallel.dp_shard]
    recompute: list[Recompute] | None = None  # recomputation modes; default: [parallel.recompute]


class ProfileConfig(Section):
    budget_s: float = Field(300.0, gt=0.0)  # measuring stops once this much wall-clock is spent
    warmup_steps: int = Field(2, ge=0)  # steps per configuration before timing (shape changes, caches)
    steps: int = Field(5, ge=1)  # timed steps per configuration (the median is kept)
    gbs_per_shape: int = Field(3, ge=1)  # GBS values measured per (layout, MBS); the model predicts the rest
    max_microbatches: int | None = Field(
        64, ge=1
    )  # measure only GBS values of at most this many micro-batches per step
    folds: int = Field(5, ge=2)  # cross-validation folds for the model's error
    # How a step is timed: "barrier", each from a barrier to its end, or "continuous", the timed
    # steps back to back as training runs them (each from its start to the next one's). Against
    # runs of the same configurations the two read alike (bench/profile_timing.py, docs/profile.md).
    timing: Literal["barrier", "continuous"] = "barrier"
    table_dir: StorageLocation | None = None  # default: OUTPUT_DIR/profiles (share it between experiments)


class LRProbeConfig(Section):
    """The learning-rate rule's share of a batch-size change (docs/calibration.md): continuations at
    `factors` x the rule's LR at each GBS of `gbs`, and at the reference GBS with the LR the rule
    gives `jump_to` (a switch's LR jump without its batch)."""

    gbs: list[PositiveInt] = Field(min_length=1)
    factors: list[Annotated[float, Field(gt=0.0)]] = Field([0.5, 1.0, 2.0], min_length=1)
    jump_to: PositiveInt | None = None  # default: 4 x optimizer.reference_gbs


class CalibrationConfig(Section):
    """`copus calibrate`: branch a reference run at a few points and continue from each at every
    GBS of a grid until the validation loss has dropped by `decrement` (copus.core.calibration)."""

    # The grid; default: powers of 2 over search.gbs_min..gbs_max.
    gbs: list[PositiveInt] | None = Field(None, min_length=1)
    # Where to branch (samples of the reference run, multiples of optimizer.reference_gbs);
    # default: 20, 60, 120, 200 reference steps.
    branch_samples: list[PositiveInt] | None = Field(None, min_length=1)
    decrement: float = Field(0.1, gt=0.0)  # validation-loss drop each continuation trains to
    # Continuations per (branch point, GBS), each on other data. Fewer than 4 leave B_crit's
    # interval a factor 3 wide or more and the goodness-of-fit test with little to go on.
    seeds: int = Field(4, ge=1)
    eval_every_samples: int = Field(64, ge=1)  # validation interval of a continuation, in samples
    # The calibration's validation set; default: see validation_samples.
    val_samples: int | None = Field(None, ge=1)
    max_samples: int = Field(20000, ge=1)  # a continuation that needs more is recorded as not reached
    gns_steps: int = Field(16, ge=2)  # batches the noise scale is measured over at each branch point
    cpus_per_trial: float | None = Field(None, gt=0.0)  # Ray Tune resources per run; default: the driver's cores
    lr_probe: LRProbeConfig | None = None  # the LR rule's share; default: not measured
    # false: runs leave the workload's calibration unread (the controller maps the noise scale
    # with gns.critical_factor and measures c itself, policy.probes): the ablation of a calibration.
    use: bool = True

    def validation_samples(self, eval_val_samples: int, split_samples: int) -> int:
        """The calibration's validation set: val_samples if given; else at least 512 samples
        (a decrement of 0.1 nats is then well above the noise of the loss it is read off, which
        on 64 samples is not) and at least eval.val_samples, but no more than the split holds."""
        return self.val_samples or min(max(512, eval_val_samples), split_samples)


class TrackingConfig(Section):
    uri: str | None = None  # default: sqlite:///<cwd>/mlflow.db
    experiment: str = "copus"
    run_name: str | None = None


class ExperimentConfig(Section):
    name: str = "experiment"
    workload: WorkloadConfig = WorkloadConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    batch: BatchConfig = BatchConfig()
    parallel: ParallelConfig = ParallelConfig()
    policy: PolicyConfig = PolicyConfig()
    gns: GNSConfig = GNSConfig()
    stop: StopConfig = StopConfig()
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    cluster: ClusterConfig = ClusterConfig()
    search: SearchConfig = SearchConfig()
    profile: ProfileConfig = ProfileConfig()
    calibration: CalibrationConfig = CalibrationConfig()
    tracking: TrackingConfig = TrackingConfig()
    # How a change of layout or MBS is made: inside the running workers (in_place), by
    # checkpoint and worker-group restart (restart), or in place with restart as the fallback
    # when the in-place path fails (auto). A change of GBS alone is always made in place.
    reconfigure: Literal["auto", "in_place", "restart"] = "auto"
    output_dir: StorageLocation = "runs/experiment"  # a path, or s3://, gs://... (copus.storage)

    @model_validator(mode="after")
    def _cross_field_rules(self) -> "ExperimentConfig":
        _check_cross_fields(self)
        return self

    # Derived values, computed in one place so driver and workers agree.
    @property
    def world_size(self) -> int:
        return self.parallel.dp * self.parallel.tp * self.parallel.pp

    @property
    def adaptive(self) -> bool:
        """Whether the run needs the Goodput controller (and so a profile)."""
        return self.policy.name not in SCHEDULED or (self.policy.name == "static" and self.policy.layout == "best")

    @property
    def microbatches_per_replica(self) -> int:
        return self.batch.gbs // (self.parallel.dp * self.batch.mbs)

    def gbs_bounds(self) -> tuple[int, int]:
        return (self.search.gbs_min or self.batch.gbs, self.search.gbs_max or self.batch.gbs)

    def mbs_choices(self) -> list[int]:
        return sorted(set(self.search.mbs or [self.batch.mbs]))

    def shard_choices(self) -> list[str]:
        return sorted(set(self.search.dp_shard or [self.parallel.dp_shard]), key=DP_SHARD_MODES.index)

    def recompute_choices(self) -> list[str]:
        return sorted(set(self.search.recompute or [self.parallel.recompute]), key=RECOMPUTE_MODES.index)

    def start_config(self) -> CandidateConfig:
        """The configuration the experiment names: parallel.* and batch.* (a ramp starts at its
        first GBS and ends at batch.gbs)."""
        p, b, ramp = self.parallel, self.batch, self.batch_ramp()
        gbs = ramp.start_gbs if ramp is not None else b.gbs
        return CandidateConfig(p.dp, p.tp, p.pp, b.mbs, gbs, p.dp_shard, p.recompute)

    def batch_ramp(self):
        """batch.ramp as a schedule (a copus.core.ramp.BatchRamp), or None."""
        r = self.batch.ramp
        if r is None:
            return None
        from copus.core.ramp import BatchRamp  # its SwitchOrder pulls in the planner: not for every config

        if r.table is not None:
            return BatchRamp.from_table(r.table)
        return BatchRamp.linear(r.start_gbs, r.increment, r.samples, self.batch.gbs)

    def flavour(self):
        """The model's shape (a workloads.flavours.ModelFlavour): named, or from workload.init_from."""
        return catalog.model_flavour(self.workload.model, self.workload.init_from)

    def layout_choices(self) -> list[tuple[int, int, int]]:
        from copus.core.search import valid_layouts

        if self.search.layouts is not None:
            return [tuple(x) for x in self.search.layouts]
        return valid_layouts(self.cluster.num_workers, self.flavour().shape())

    def calibration_grid(self) -> list[int]:
        """The calibration's GBS grid: as given, or the powers of 2 within the search bounds
        (widened to 16x around the reference GBS when the bounds are narrower)."""
        if self.calibration.gbs is not None:
            return sorted(set(self.calibration.gbs))
        low, high = self.gbs_bounds()
        b0 = self.optimizer.reference_gbs
        low, high = min(low, max(1, b0 // 4)), max(high, b0 * 4)
        return [2**k for k in range(0, 31) if low <= 2**k <= high]

    def calibration_branches(self) -> list[int]:
        b0 = self.optimizer.reference_gbs
        return sorted(set(self.calibration.branch_samples or [b0 * k for k in (20, 60, 120, 200)]))

    def resolved_profile_dir(self) -> Location:
        if not self.profile.table_dir:
            return self.resolved_output_dir() / "profiles"
        return _opened("profile.table_dir", self.profile.table_dir)

    def resolved_tracking_uri(self) -> str:
        return self.tracking.uri or f"sqlite:///{Path.cwd() / 'mlflow.db'}"

    def resolved_output_dir(self) -> Location:
        return _opened("output_dir", self.output_dir)


def _opened(field: str, where: str) -> Location:
    """A location field opened (an object store may be asked for its region): ConfigError naming
    the field when it cannot be."""
    try:
        return Location.parse(where)
    except StorageError as err:
        raise ConfigError(f"{field}: {err}") from None


class FieldProblem(ValueError):
    def __init__(self, path: str, message: str):
        super().__init__(f"{path}: {message}")


def _check_cross_fields(cfg: ExperimentConfig) -> None:
    from copus.core.layout import layout_problems

    p, b, s = cfg.parallel, cfg.batch, cfg.stop
    if cfg.workload.init_from is None and cfg.workload.model not in catalog.flavour_names():
        raise FieldProblem(
            "workload.model", f"unknown flavour {cfg.workload.model!r} (known: {', '.join(catalog.flavour_names())})"
        )
    flavour = _checked_flavour(cfg)
    if not flavour.trainable_on_cpu and not cfg.cluster.use_gpu:
        raise FieldProblem(
            "workload.model",
            f"{flavour.name!r} ({flavour.param_count() / 1e9:.1f}B parameters) is a shape description for GPU clusters; set cluster.use_gpu: true",
        )
    if cfg.workload.seq_len > flavour.max_seq_len:
        raise FieldProblem(
            "workload.seq_len", f"{cfg.workload.seq_len} exceeds the flavour's max_seq_len {flavour.max_seq_len}"
        )
    problems = layout_problems(p.dp, p.tp, p.pp, flavour.shape(), cfg.cluster.num_workers, b.gbs, b.mbs)
    if problems:
        raise FieldProblem(*problems[0])
    if cfg.eval.val_samples // p.dp < p.pp:
        raise FieldProblem(
            "eval.val_samples",
            f"{cfg.eval.val_samples} gives each of the {p.dp} replicas fewer "
            f"validation samples than the {p.pp} pipeline stages",
        )
    if cfg.optimizer.lr_scaling == "adascale" and not cfg.gns.enabled:
        raise FieldProblem("optimizer.lr_scaling", "adascale needs the gradient noise scale: set gns.enabled: true")
    if cfg.policy.name not in SCHEDULED and not cfg.gns.enabled:
        raise FieldProblem(
            "policy.name", f"{cfg.policy.name!r} adapts to the gradient noise scale: set gns.enabled: true"
        )
    _check_ramp(cfg, flavour.shape())
    if all(v is None for v in (s.target_val_loss, s.max_steps, s.max_samples, s.max_wall_clock_s)):
        raise FieldProblem("stop", "set at least one of target_val_loss, max_steps, max_samples, max_wall_clock_s")
    if cfg.schedule.decay == "cosine" and cfg.schedule.decay_samples is None:
        raise FieldProblem("schedule.decay_samples", "required when schedule.decay is 'cosine'")
    ds = cfg.workload.dataset
    _check_tokenizer(cfg, flavour.vocab_size)
    if ds.kind == "stdlib":
        if ds.path is not None:
            raise FieldProblem("workload.dataset.path", "must be empty when workload.dataset.kind is 'stdlib'")
    else:
        if ds.path is None:
            raise FieldProblem("workload.dataset.path", f"required when workload.dataset.kind is {ds.kind!r}")
        _check_dataset_files(ds)
        if ds.kind == "bin" and flavour.vocab_size > 2**16 and ds.dtype == "uint16":
            raise FieldProblem(
                "workload.dataset.dtype",
                f"uint16 cannot hold the vocabulary of {flavour.name!r} ({flavour.vocab_size} tokens)",
            )
    _check_emulate(cfg.cluster)
    if cfg.cluster.mixed_precision == "fp16" and not cfg.cluster.use_gpu:
        raise FieldProblem("cluster.mixed_precision", "fp16 needs cluster.use_gpu: true (use 'bf16' or 'no' on CPU)")
    _check_search(cfg, flavour.shape())


def _check_emulate(c: ClusterConfig) -> None:
    """An emulated cluster holds the run's workers in equal shares, one CPU process group each
    node, and its subnet has room for the head and every node."""
    e = c.emulate
    if e is None:
        return
    if c.use_gpu:
        raise FieldProblem("cluster.emulate", "emulates CPU nodes; leave it out with cluster.use_gpu: true")
    if c.num_workers % e.nodes:
        raise FieldProblem("cluster.emulate.nodes", f"{e.nodes} does not divide cluster.num_workers {c.num_workers}")
    try:
        net = ipaddress.IPv4Network(e.subnet)
    except ValueError as err:
        raise FieldProblem("cluster.emulate.subnet", str(err)) from None
    if net.num_addresses < 12 + e.nodes:
        raise FieldProblem("cluster.emulate.subnet", f"{e.subnet} has no room for the head and {e.nodes} nodes")
    if e.compute_reference_every == "run" and e.compute_reference_s is None:
        raise FieldProblem(
            "cluster.emulate.compute_reference_every", "`run` rescales the links to compute_reference_s: set it too"
        )


def _check_ramp(cfg: ExperimentConfig, shape) -> None:
    """batch.ramp goes with policy.name: ramp, both ways; its schedule rises to batch.gbs and
    every GBS in it fits the layout and MBS, which stay (only the micro-batches per step change)."""
    r, b = cfg.batch.ramp, cfg.batch
    if cfg.policy.name != "ramp":
        if r is not None:
            raise FieldProblem("batch.ramp", f"applies to policy.name: ramp only (policy.name is {cfg.policy.name!r})")
        return
    if r is None:
        raise FieldProblem("batch.ramp", "required with policy.name: ramp ({start_gbs, increment, samples} or {table})")
    if cfg.policy.layout == "best":
        raise FieldProblem("policy.layout", "'best' applies to the static policy; a ramp trains in the given layout")
    from copus.core.layout import layout_problems

    p = cfg.parallel
    if r.table is None:
        _check_linear_ramp(r, b.gbs)
        # Every later GBS is start_gbs + k x increment: divisible when both are, more micro-batches.
        steps = [("batch.ramp.start_gbs", r.start_gbs)]
    else:
        _check_ramp_table(r.table, b.gbs)
        steps = [(f"batch.ramp.table.{i}", gbs) for i, (_, gbs) in enumerate(r.table)]
    for field, gbs in steps:
        problems = [m for f, m in layout_problems(p.dp, p.tp, p.pp, shape, None, gbs, b.mbs) if f == "batch.gbs"]
        if problems:
            raise FieldProblem(field, f"GBS {problems[0]}")
    if r.table is None and r.increment % (p.dp * b.mbs):
        raise FieldProblem(
            "batch.ramp.increment",
            f"{r.increment} is not a multiple of parallel.dp x batch.mbs = {p.dp} x {b.mbs} (every GBS of the ramp must be)",
        )


def _check_linear_ramp(r: RampConfig, final_gbs: int) -> None:
    if r.start_gbs >= final_gbs:
        raise FieldProblem(
            "batch.ramp.start_gbs", f"{r.start_gbs} must be below batch.gbs {final_gbs}, where the ramp ends"
        )
    if (final_gbs - r.start_gbs) % r.increment:
        raise FieldProblem(
            "batch.ramp.increment",
            f"{r.increment} does not divide batch.gbs - start_gbs = {final_gbs} - {r.start_gbs} = {final_gbs - r.start_gbs}",
        )


def _check_ramp_table(table: list[tuple[int, int]], final_gbs: int) -> None:
    if table[0][0] != 0:
        raise FieldProblem("batch.ramp.table.0", f"the first entry must be at 0 samples (got {table[0][0]})")
    for i in range(1, len(table)):
        if table[i][0] <= table[i - 1][0]:
            raise FieldProblem(
                f"batch.ramp.table.{i}",
                f"samples must increase from entry to entry ({table[i][0]} after {table[i - 1][0]})",
            )
    if table[-1][1] != final_gbs:
        raise FieldProblem(
            f"batch.ramp.table.{len(table) - 1}",
            f"the last GBS {table[-1][1]} must be batch.gbs {final_gbs}, where the ramp ends",
        )


def _checked_flavour(cfg: ExperimentConfig):
    """The flavour, with a Hugging Face directory's config.json and safetensors headers checked."""
    try:
        flavour = cfg.flavour()
        if cfg.workload.init_from is not None:
            catalog.check_model_files(cfg.workload.init_from, flavour)
        return flavour
    except catalog.WorkloadError as err:
        raise FieldProblem("workload.init_from", str(err)) from None


def _check_tokenizer(cfg: ExperimentConfig, vocab_size: int) -> None:
    tok, kind, byte_vocab = cfg.workload.tokenizer, cfg.workload.dataset.kind, catalog.BYTE_VOCAB
    if tok is None:
        if kind != "bin" and vocab_size < byte_vocab:  # stdlib, txt, jsonl, parquet: one token per byte
            raise FieldProblem(
                "workload.init_from" if cfg.workload.init_from else "workload.model",
                f"a vocabulary of {vocab_size} cannot hold the {byte_vocab} byte tokens of {kind!r} data "
                "(give workload.tokenizer, or a model with a larger vocabulary)",
            )
        return
    if kind in ("stdlib", "bin"):
        raise FieldProblem("workload.tokenizer", f"applies to txt, jsonl and parquet data, not {kind!r}")
    try:
        size = catalog.tokenizer_size(tok)
    except catalog.WorkloadError as err:
        raise FieldProblem("workload.tokenizer", str(err)) from None
    if size > vocab_size:
        raise FieldProblem(
            "workload.tokenizer", f"{tok} has {size} tokens, more than the model's vocabulary of {vocab_size}"
        )


def _check_dataset_files(ds: DatasetConfig) -> None:
    for key, value in (("path", ds.path), ("val_path", ds.val_path)):
        if value is None:
            continue
        if ds.kind == "bin" and not Path(value).expanduser().is_file():
            raise FieldProblem(f"workload.dataset.{key}", f"file not found: {value}")
        if ds.kind != "bin" and not catalog.dataset_files(value, ds.kind):
            raise FieldProblem(f"workload.dataset.{key}", f"file not found: {value}")


def _check_search(cfg: ExperimentConfig, shape) -> None:
    """The search space must contain the starting configuration and only valid layouts."""
    from copus.core.layout import layout_problems

    lo, hi = cfg.gbs_bounds()
    if lo > hi:
        raise FieldProblem("search.gbs_min", f"{lo} exceeds search.gbs_max {hi}")
    if not lo <= cfg.batch.gbs <= hi:
        raise FieldProblem("batch.gbs", f"{cfg.batch.gbs} is outside search.gbs_min..gbs_max = {lo}..{hi}")
    mbs = cfg.search.mbs
    if mbs is not None:
        if not mbs or min(mbs) < 1:
            raise FieldProblem("search.mbs", f"must list positive micro-batch sizes (got {mbs})")
        if cfg.batch.mbs not in mbs:
            raise FieldProblem("search.mbs", f"must include batch.mbs {cfg.batch.mbs} (got {mbs})")
    if cfg.search.layouts is not None:
        if not cfg.search.layouts:
            raise FieldProblem("search.layouts", "must list at least one [dp, tp, pp]")
        for i, (dp, tp, pp) in enumerate(cfg.search.layouts):
            problems = layout_problems(dp, tp, pp, shape, cfg.cluster.num_workers)
            if problems:
                raise FieldProblem(f"search.layouts.{i}", f"[{dp}, {tp}, {pp}]: {problems[0][1]}")
        p = cfg.parallel
        if (p.dp, p.tp, p.pp) not in [tuple(x) for x in cfg.search.layouts]:
            raise FieldProblem(
                "search.layouts", f"must include the starting layout parallel = [{p.dp}, {p.tp}, {p.pp}]"
            )


# How much of a refused value a message echoes: one line, whatever the value (a YAML alias can
# make a small file into a huge value).
_ECHO = reprlib.Repr()
_ECHO.maxlevel, _ECHO.maxstring, _ECHO.maxother = 3, 80, 80
_ECHO.maxlist = _ECHO.maxtuple = _ECHO.maxdict = _ECHO.maxset = 6


def format_pydantic_error(err: ValidationError) -> str:
    first = err.errors(include_url=False, include_input=True)[0]
    loc = ".".join(shown(str(part), 60) for part in first["loc"])
    msg = first["msg"]
    error = first.get("ctx", {}).get("error")
    if first["type"] == "extra_forbidden":
        msg = "unknown key"
    elif first["type"] == "value_error" and isinstance(error, FieldProblem):
        return str(error)
    elif first["type"] == "value_error" and error is not None:  # a field's own check (AfterValidator)
        msg = str(error)
    elif "input" in first and first["type"] not in ("missing",):
        msg = f"{msg} (got {shown(_ECHO.repr(first['input']), 200)})"
    return f"{loc}: {msg}" if loc else msg


def _parse_override_value(item: str, text: str) -> Any:
    # YAML values, so `--set stop.max_steps=10` gives an int and `--set cluster.use_gpu=true` a bool;
    # read by the experiment file's own loader (same tags refused, same size limit).
    if text == "":
        return ""
    try:
        return parse_yaml(text)
    except ConfigError as err:
        raise ConfigError(f"--set {shown(item)}: {err}") from None


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Apply ``key.sub=value`` overrides to the raw YAML mapping (before validation)."""
    data = copy.deepcopy(raw)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {shown(item)}: expected key.sub=value")
        key, value = item.split("=", 1)
        parts = key.strip().split(".")
        if not all(parts):
            raise ConfigError(f"--set {shown(item)}: expected key.sub=value (an empty key name)")
        node = data
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{key}: cannot set below {part!r}, which is not a section")
            node = child
        node[parts[-1]] = _parse_override_value(item, value)
    return data


def config_from_mapping(raw: Any, overrides: list[str] | None = None) -> ExperimentConfig:
    if not isinstance(raw, dict):
        raise ConfigError("(top level): expected a mapping of sections")
    data = apply_overrides(raw, overrides or [])
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_pydantic_error(err)) from None


class _StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader (plain data only: a tag that would construct an object is an error)
    that also refuses a key given twice in one mapping, which plain YAML silently resolves to
    the last value: a config typo must never pass unnoticed."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node):
        # YAML 1.2 (as most YAML readers today): 032 is 32, not YAML 1.1's octal 26, and 1:30 is
        # text, not the sexagesimal 90: a leading zero must not change a number silently.
        text = str(self.construct_scalar(node))
        if ":" in text:
            return text
        if re.fullmatch(r"[-+]?0[0-9_]+", text):
            return int(text.replace("_", ""), 10)
        return super().construct_yaml_int(node)


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_yaml_int)

# The most values a YAML document may hold once its aliases are expanded: far above any
# experiment, far below what a "billion laughs" alias bomb builds from a few lines.
MAX_YAML_VALUES = 100_000


def _expanded_size(value: Any, memo: dict[int, int], active: set[int]) -> int:
    """How many values `value` holds with every alias expanded (an alias shares one object, so
    each is counted once per reference but computed once)."""
    if not isinstance(value, (dict, list)):
        return 1
    key = id(value)
    if key in active:
        raise ConfigError("an alias refers to the value that contains it")
    if key not in memo:
        active.add(key)
        children = list(value.keys()) + list(value.values()) if isinstance(value, dict) else value
        memo[key] = 1 + sum(_expanded_size(child, memo, active) for child in children)
        active.discard(key)
    return memo[key]


def parse_yaml(text: str) -> Any:
    """YAML text to plain data: ConfigError (one line) for a syntax error, a tag that would
    build an object, or a document whose aliases expand past MAX_YAML_VALUES."""
    try:
        data = yaml.load(text, Loader=_StrictLoader)
        size = _expanded_size(data, {}, set())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1} " if mark else ""
        problem = first_line(str(getattr(err, "problem", None) or err), 200)
        raise ConfigError(f"{where}not valid YAML ({shown(problem, 200)})") from None
    except (ValueError, TypeError) as err:  # a tag's constructor refusing its text (!!int abc)
        raise ConfigError(f"not valid YAML ({shown(str(err), 200)})") from None
    except RecursionError:
        raise ConfigError("not valid YAML (nested too deeply)") from None
    if size > MAX_YAML_VALUES:
        raise ConfigError(f"not valid YAML (its aliases expand to more than {MAX_YAML_VALUES:,} values)")
    return data


def read_yaml(path: str | os.PathLike, what: str = "experiment") -> Any:
    try:
        local_path(path)  # a path that cannot name a file (too long, a symlink loop) is refused here
    except StorageError as err:
        raise ConfigError(f"{err} (the {what} file)") from None
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: {what} file not found")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read the {what} file ({getattr(err, 'strerror', None) or err})") from None
    try:
        return parse_yaml(text) or {}
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


def load_config(path: str | os.PathLike, overrides: list[str] | None = None) -> ExperimentConfig:
    """Load, override and validate an experiment YAML. Raises ConfigError (one line)."""
    return config_from_mapping(read_yaml(path), overrides)


def _listed_once(field: str, values: list) -> None:
    repeated = next((v for i, v in enumerate(values) if v in values[:i]), None)
    if repeated is not None:
        raise FieldProblem(field, f"{repeated} listed twice")


class TuneRampConfig(Section):
    """A suite's ramp candidates (copus.core.tuning): Megatron's `--rampup-batch-size start_gbs
    increment samples`, one candidate per ramp length in `samples`, in one layout and MBS."""

    start_gbs: PositiveInt
    increment: PositiveInt
    samples: list[PositiveInt] = Field(min_length=1)  # the ramp lengths to tune over
    gbs: PositiveInt | None = None  # the final GBS (default: the experiment's batch.gbs)
    mbs: PositiveInt | None = None  # default: the experiment's batch.mbs
    layout: tuple[PositiveInt, PositiveInt, PositiveInt] | None = None  # [dp, tp, pp]; default: parallel.*

    @model_validator(mode="after")
    def _distinct(self) -> "TuneRampConfig":
        _listed_once("tune.ramp.samples", self.samples)
        return self


class TuneConfig(Section):
    """What a suite tunes on its tuning seeds before the evaluation: static at each GBS of
    `static_gbs` (the profile's fastest layout and MBS for each) and the ramp candidates."""

    static_gbs: list[PositiveInt] = []
    ramp: TuneRampConfig | None = None

    @model_validator(mode="after")
    def _something(self) -> "TuneConfig":
        if not self.static_gbs and self.ramp is None:
            raise FieldProblem("tune", "give static_gbs, ramp or both (nothing to tune)")
        _listed_once("tune.static_gbs", self.static_gbs)
        return self


class VariantConfig(Section):
    """A suite entry that runs a policy with settings of its own, beside the plain policies: an
    ablation of a setting (for example copus without its calibration: calibration.use=false)."""

    policy: PolicyName
    set: list[str] = Field(min_length=1)  # its overrides, on top of the suite's


class SuiteConfig(Section):
    """A comparison suite: one experiment run under several policies (`copus compare`)."""

    name: str = "comparison"
    experiment: str | dict[str, Any]  # experiment YAML (relative to the suite file) or inline
    set: list[str] = []  # overrides applied to the experiment, as with --set
    policies: list[PolicyName] = list(DEFAULT_SUITE)
    repeats: int = Field(1, ge=1)
    # same: repeat r of every policy uses seed workload.seed + r (paired: the policies see the same
    # initial weights and data order); vary: every run gets its own seed.
    seeds: Literal["same", "vary"] = "same"
    # static: the profile's fastest layout for batch.gbs (the paper's Static-GBS baseline), or
    # the experiment's own layout.
    static_layout: Literal["best", "given"] = "best"
    # shuffled: each repeat runs the policies in an order drawn from (order_seed, repeat), so no
    # policy always runs first; listed: in the order of `policies`. The order is recorded.
    order: Literal["shuffled", "listed"] = "shuffled"
    order_seed: int = Field(0, ge=0)
    output_dir: StorageLocation = "runs/comparison"
    # The tuned baselines (copus.core.tuning) are chosen on tuning_seeds and measured, beside the
    # policies, on evaluation_seeds: repeat r of every entry uses evaluation_seeds[r] (paired;
    # they replace `repeats` and `seeds: same`). Disjoint, so no evaluation run steers the choice.
    tuning_seeds: list[Seed] = []
    evaluation_seeds: list[Seed] = []
    tune: TuneConfig | None = None
    # Entries beside the policies, each a policy with its own overrides, run on the same seeds
    # (named freely, but not like a policy or a tuned entry).
    variants: dict[str, VariantConfig] = {}

    @model_validator(mode="after")
    def _protocol(self) -> "SuiteConfig":
        _listed_once("tuning_seeds", self.tuning_seeds)
        _listed_once("evaluation_seeds", self.evaluation_seeds)
        shared = next((s for s in self.evaluation_seeds if s in self.tuning_seeds), None)
        if shared is not None:
            raise FieldProblem(
                "evaluation_seeds", f"{shared} is also a tuning seed (tuning and evaluation seeds must be disjoint)"
            )
        if (self.tune is None) != (not self.tuning_seeds):
            missing = "tuning_seeds" if self.tune is not None else "tune"
            raise FieldProblem(missing, "tune and tuning_seeds go together (what to tune, and on which seeds)")
        if self.tune is not None and not self.evaluation_seeds:
            raise FieldProblem("evaluation_seeds", "required with tune (the tuned baselines are measured on them)")
        if self.evaluation_seeds and "repeats" in self.model_fields_set and self.repeats != len(self.evaluation_seeds):
            raise FieldProblem(
                "repeats",
                f"{self.repeats} with {len(self.evaluation_seeds)} evaluation_seeds: "
                "each evaluation seed is one repeat (leave repeats out)",
            )
        if self.evaluation_seeds and self.seeds == "vary":
            raise FieldProblem(
                "seeds", "'vary' with evaluation_seeds: every entry of a repeat runs its evaluation seed"
            )
        taken = next((v for v in self.variants if v in POLICIES or v in TUNED_ENTRY.values()), None)
        if taken is not None:
            raise FieldProblem(
                f"variants.{taken}", "is the name of a policy or a tuned entry: give the variant its own"
            )
        return self

    @property
    def evaluation_repeats(self) -> int:
        return len(self.evaluation_seeds) or self.repeats

    def run_seed(self, base_seed: int, repeat: int, index: int) -> int:
        """The workload seed of repeat `repeat` of the entry listed `index`-th: the repeat's
        evaluation seed; else workload.seed + repeat (`seeds: same`) or one seed per run (`vary`)."""
        if self.evaluation_seeds:
            return self.evaluation_seeds[repeat]
        if self.seeds == "same":
            return base_seed + repeat
        return base_seed + repeat * len(self.policies) + index


def is_suite_file(path: str | os.PathLike) -> bool:
    """Whether a YAML file is a comparison suite (it names `policies` or an `experiment`) rather
    than an experiment. Unreadable files are left to the experiment loader's error."""
    try:
        raw = read_yaml(path)
    except ConfigError:
        return False
    return isinstance(raw, dict) and ("policies" in raw or "experiment" in raw)


def load_suite(path: str | os.PathLike, overrides: list[str] | None = None) -> tuple[SuiteConfig, dict]:
    """The suite and its experiment as a raw mapping. Raises ConfigError (one line)."""
    raw = read_yaml(path, "suite")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping")
    try:
        suite = SuiteConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(f"{path}: {format_pydantic_error(err)}") from None
    if len(set(suite.policies)) != len(suite.policies) or not suite.policies:
        raise ConfigError(f"{path}: policies: list each policy once, at least one (got {suite.policies})")
    if isinstance(suite.experiment, dict):
        raw = suite.experiment
    else:
        experiment = (Path(path).parent / suite.experiment).resolve()
        if not experiment.is_file():
            raise ConfigError(f"{path}: experiment: file not found: {experiment}")
        raw = read_yaml(experiment)
    try:  # the base must be valid before anything runs
        base = config_from_mapping(raw, suite.set + (overrides or []))
    except ConfigError as err:
        raise ConfigError(f"{path}: experiment: {err}") from None
    _check_tuning_runs(path, suite, raw, base, overrides or [])
    _check_variant_runs(path, suite, raw, overrides or [])
    return suite, raw


def _check_variant_runs(path, suite: SuiteConfig, raw: dict, overrides: list[str]) -> None:
    """Every variant's run must be valid before anything runs, like the base."""
    for name, variant in suite.variants.items():
        try:
            config_from_mapping(raw, suite.set + overrides + variant.set + [f"policy.name={variant.policy}"])
        except ConfigError as err:
            raise ConfigError(f"{path}: variants.{name}: {err}") from None


def tuning_candidates(suite: SuiteConfig, base: ExperimentConfig) -> list:
    """The suite's tuning candidates (copus.core.tuning.TuningCandidate) on its experiment `base`:
    static at each `tune.static_gbs`, then the ramp at each `tune.ramp.samples`. FieldProblem
    when a static GBS is off the search space (its run could not start in the fastest layout)."""
    from copus.core.search import candidates, gbs_grid
    from copus.core.tuning import ramp_candidate, start_for_gbs, static_candidate

    if suite.tune is None:
        return []
    out = []
    for i, gbs in enumerate(suite.tune.static_gbs):
        grid = gbs_grid(base.search.gbs_min or gbs, base.search.gbs_max or gbs)
        space = candidates(base.layout_choices(), base.mbs_choices(), [gbs], base.flavour().shape())
        start = start_for_gbs(gbs, base.start_config(), space) if gbs in grid else None
        if start is None:
            raise FieldProblem(
                f"tune.static_gbs.{i}",
                f"GBS {gbs} is not a GBS of the search space (search.gbs_min/gbs_max grid {grid}, "
                "search.layouts, search.mbs): static there could not start in the profile's fastest layout",
            )
        out.append(static_candidate(gbs, start))
    ramp, p = suite.tune.ramp, base.parallel
    if ramp is not None:
        layout = ramp.layout or (p.dp, p.tp, p.pp)
        final, mbs = ramp.gbs or base.batch.gbs, ramp.mbs or base.batch.mbs
        out += [ramp_candidate(ramp.start_gbs, ramp.increment, s, final, mbs, layout) for s in ramp.samples]
    return out


def _check_tuning_runs(path, suite: SuiteConfig, raw: dict, base: ExperimentConfig, overrides: list[str]) -> None:
    """Every tuning candidate's run must be valid before anything runs, like the base."""
    try:
        candidates = tuning_candidates(suite, base)
    except FieldProblem as err:
        raise ConfigError(f"{path}: {err}") from None
    for candidate in candidates:
        try:
            config_from_mapping(raw, suite.set + overrides + list(candidate.overrides))
        except ConfigError as err:
            field = "tune.static_gbs" if candidate.kind == "static" else "tune.ramp"
            raise ConfigError(f"{path}: {field} ({candidate.name}): {err}") from None
