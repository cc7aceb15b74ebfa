"""The plain values a training worker needs, cut out of the typed config at the edge.

Workers never see `ExperimentConfig`: they get a `WorkerPlan`, which pickles cheaply to Ray
workers and is trivial to build by hand in tests.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

from copus.core.efficiency import DEFAULT_CRITICAL_FACTOR
from copus.core.gns import Horizon
from copus.core.layout import CandidateConfig
from copus.core.schedule import LRSchedule
from workloads.flavours import ModelFlavour
from workloads.hf_config import workload_flavour

_CONFIG_FIELDS = {f.name for f in fields(CandidateConfig)}

if TYPE_CHECKING:  # the worker side never imports the typed config (nor pydantic)
    from copus.config import ExperimentConfig
    from copus.core.ramp import BatchRamp


@dataclass(frozen=True)
class StopRule:
    target_val_loss: float | None = None
    max_steps: int | None = None
    max_samples: int | None = None
    max_wall_clock_s: float | None = None
    max_nonfinite_steps: int = 3  # consecutive skipped (non-finite) steps tolerated before the run stops

    def budget_reason(self, steps: int, samples: int, wall_clock_s: float) -> str | None:
        """Why the budget is spent after this step, or None."""
        if self.max_steps is not None and steps >= self.max_steps:
            return "max_steps"
        if self.max_samples is not None and samples >= self.max_samples:
            return "max_samples"
        if self.max_wall_clock_s is not None and wall_clock_s >= self.max_wall_clock_s:
            return "max_wall_clock_s"
        return None


@dataclass(frozen=True)
class OptimizerPlan:
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float | None = 1.0


@dataclass(frozen=True)
class GNSPlan:
    enabled: bool = True
    smoothing: float = 0.999  # used when half_life_share is None (the fixed horizon)
    critical_factor: float = DEFAULT_CRITICAL_FACTOR
    precondition: str = "none"
    reference_gbs: int | None = None  # B0 of the noise scale and efficiency; None: the plan's GBS
    half_life_share: float | None = 0.05  # the progress horizon (copus.core.gns.Horizon); None: fixed
    min_half_life: float = 8.0  # in reference batches
    # a step's tr(Sigma) above this multiple of the average's is down-weighted; None: never (the
    # fixed-weight measurements, where nothing drifts and every batch is the same population)
    outlier_ratio: float | None = None

    def horizon(self, reference_gbs: int) -> Horizon:
        return Horizon(self.half_life_share, self.min_half_life * reference_gbs, self.smoothing)


@dataclass(frozen=True)
class WorkerPlan:
    model: str
    seq_len: int
    seed: int
    train_tokens: str
    val_tokens: str
    token_dtype: str
    config: CandidateConfig  # the layout and batch shape this worker group trains in
    lr: LRSchedule
    pp_schedule: str = "1f1b"
    optimizer: OptimizerPlan = field(default_factory=OptimizerPlan)
    stop: StopRule = field(default_factory=StopRule)
    gns: GNSPlan = field(default_factory=GNSPlan)
    eval_every_steps: int = 20
    eval_every_samples: int | None = None  # wins over eval_every_steps (core.schedule.Cadence)
    val_samples: int = 64
    checkpoint_every_steps: int = 50
    checkpoint_every_samples: int | None = None
    checkpoint_every_s: float | None = None
    report_every_steps: int = 1
    use_gpu: bool = False
    mixed_precision: str = "no"
    init_from: str | None = None  # a Hugging Face model directory: its shape, and the weights of a fresh start
    # policy.name ramp: the GBS by samples seen, followed by the loop itself. Set by `copus run`'s
    # driver only: a calibration or profile of the experiment trains at the batch sizes it chooses.
    ramp: BatchRamp | None = None

    def as_dict(self) -> dict:
        return asdict(self)

    # The configuration's fields read through the plan: the loop reads plan.dp, plan.gbs, ...
    dp = property(lambda self: self.config.dp)
    tp = property(lambda self: self.config.tp)
    pp = property(lambda self: self.config.pp)
    mbs = property(lambda self: self.config.mbs)
    gbs = property(lambda self: self.config.gbs)

    def replaced(self, **changes) -> WorkerPlan:
        """`dataclasses.replace` that also takes the configuration's fields (dp=2, gbs=64, ...)."""
        mine = {k: changes.pop(k) for k in list(changes) if k in _CONFIG_FIELDS}
        return replace(self, config=replace(self.config, **mine), **changes)

    @property
    def flavour(self) -> ModelFlavour:
        return workload_flavour(self.model, self.init_from)


def gns_plan(cfg: "ExperimentConfig") -> GNSPlan:
    g = cfg.gns
    share = g.half_life_share if g.horizon == "progress" else None
    return GNSPlan(
        g.enabled,
        g.smoothing,
        g.critical_factor,
        g.precondition,
        cfg.optimizer.reference_gbs,
        share,
        g.min_half_life,
        g.outlier_ratio,
    )


def plan_from_config(cfg: "ExperimentConfig", train_tokens: str, val_tokens: str, token_dtype: str) -> WorkerPlan:
    o, s = cfg.optimizer, cfg.schedule
    return WorkerPlan(
        model=cfg.workload.model,
        seq_len=cfg.workload.seq_len,
        seed=cfg.workload.seed,
        train_tokens=train_tokens,
        val_tokens=val_tokens,
        token_dtype=token_dtype,
        config=cfg.start_config(),
        pp_schedule=cfg.parallel.pp_schedule,
        lr=LRSchedule(o.lr, o.reference_gbs, o.lr_scaling, s.warmup_samples, s.decay, s.decay_samples, s.min_lr_ratio),
        optimizer=OptimizerPlan(tuple(o.betas), o.eps, o.weight_decay, o.grad_clip),
        stop=StopRule(
            cfg.stop.target_val_loss,
            cfg.stop.max_steps,
            cfg.stop.max_samples,
            cfg.stop.max_wall_clock_s,
            cfg.stop.max_nonfinite_steps,
        ),
        gns=gns_plan(cfg),
        eval_every_steps=cfg.eval.every_steps,
        eval_every_samples=cfg.eval.every_samples,
        val_samples=cfg.eval.val_samples,
        checkpoint_every_steps=cfg.checkpoint.every_steps,
        checkpoint_every_samples=cfg.checkpoint.every_samples,
        checkpoint_every_s=cfg.checkpoint.every_s,
        report_every_steps=cfg.cluster.report_every_steps,
        use_gpu=cfg.cluster.use_gpu,
        mixed_precision=cfg.cluster.mixed_precision,
        init_from=str(Path(cfg.workload.init_from).expanduser().resolve()) if cfg.workload.init_from else None,
    )
