"""Cluster-scale simulator: the real planner and policies against a modelled cluster.

Three models stand in for what a real run measures:

- **Step time** of every candidate configuration from the hardware description: the same
  step-time formula (`copus.core.throughput`) the profiler fits on real machines, with its
  coefficients derived from the hardware instead of fitted (`hardware_params`): compute from
  peak bf16 FLOP/s and an MFU curve in a micro-batch's tokens (the rank's share by default, or
  all of them, as Megatron's tensor parallelism keeps them), tensor-parallel all-reduces and
  stage-to-stage sends over NVLink/Infinity Fabric or the network (whichever the group spans),
  the data-parallel ring all-reduce, the optimiser step over HBM. Memory feasibility from
  `copus.core.memory` (bf16 activations; the candidate's own data-parallel sharding and
  recomputation, which the search space varies like the layout).
- **Training truth**, kept apart from what the planner believes (its form and critical
  factor are never used here). Loss as a function of effective tokens, Hoffmann et al. 2022
  (Chinchilla): L(N, D) = E + A / N^α + B / D^β, never above the loss at zero data, ln(vocab)
  (`LossCurve`); the true critical batch as a function of the loss, either Kaplan et al. 2020,
  B_crit(L) = B* / L^(1/α_B) tokens (`CriticalBatch`), or measured by `copus calibrate`
  (`CalibratedCriticalBatch`: branch points' B_crit interpolated linearly in the loss).
  Progress follows McCandlish et al. 2018: E(B) = E_min (1 + B / B_crit), so a step of B
  samples is worth B · B_crit / (B_crit + B) samples at a vanishingly small batch; D counts
  those ("tokens at a small batch"); less for a few steps after a GBS change (`LrTransient`).
- **The planner's view** (`NoiseEstimate`, `LiveEstimate`): the noise scale a controller would
  report, b_noise = m · ε · B_crit(lagged) / c: the true critical batch the EMA's mean age ago,
  off by a mapping error m and an estimation noise ε autocorrelated over decisions (seeded), so
  the planner's own c × b_noise is m · ε · B_crit(lagged). With m = 1, ε = 1 and no lag the
  planner's critical batch is the true one; its SE form is its own.
- **Or a measured step time** (`MeasuredSteps`): for a setting that stands for a cluster we can
  also run (the emulated one), the step times of a real `copus profile` table, measured where
  measured and fitted elsewhere, so the simulator's predictions can be checked against runs.
- **Reconfiguration cost** (`ReconfigurationCosts`): a fixed start-up plus the training state
  moved over the network (in place) or written to and read from storage (restart).

Time advances step by step; every `interval_s` of simulated time the policy decides through
`copus.core.policies.decide` and `copus.core.planner.Planner`, the objects a real run's
controller uses (hysteresis, switching cost and all); a ramp (`copus.core.ramp.BatchRamp`)
changes the GBS by samples seen instead. Pure: no torch, no ray.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right
from dataclasses import dataclass, field, replace

import numpy as np

from copus.core import planner as planner_module
from copus.core import policies
from copus.core.belief import PRIOR_LOG_SD
from copus.core.datasheets import NodeSpec
from copus.core.decision_rule import critical_batch_log_sd, factor_log_sd_at
from copus.core.horizon import fit_window, rest_of_run
from copus.core.layout import CandidateConfig, ModelShape, layout_problems
from copus.core.megatron import (
    MegatronFramework,
    attention_flops_per_token,
    matmul_flops_per_token,
    megatron_terms,
    stage_link_span,
)
from copus.core.memory import ENGINE, config_bytes, fits
from copus.core.planner import RuleSettings, SwitchCosts
from copus.core.policy_names import SCHEDULED
from copus.core.ramp import BatchRamp
from copus.core.reconfiguration import reversed_switches
from copus.core.search import candidates, gbs_grid, valid_layouts
from copus.core.sim_calibration import CalibrationSampling, calibration_truth, simulated_calibration
from copus.core.sim_view import PlannerView, ProfileSampling, profiled_view, table_view
from copus.core.throughput import GRAD_BYTES, StepTimeModel, StepTimeParams, Terms, rank_grad_bytes

BF16 = 2
# Bytes of training state per parameter with bf16 mixed precision: bf16 weights and gradients,
# fp32 master weights and AdamW's two moments.
STATE_BYTES_PER_PARAM = 2 + 2 + 4 + 4 + 4
# AdamW reads parameter, gradient and both moments and writes three of them, in fp32.
ADAM_BYTES_PER_PARAM = 7 * 4


@dataclass(frozen=True)
class LossCurve:
    """L(N, D) = e + a / N^alpha + b / D^beta, N parameters, D tokens (Hoffmann et al. 2022,
    the fitted values of their approach 3), never above `initial`, the loss at zero data.

    Why the cap: the fitted form diverges as D -> 0 (412 nats at one token), where the critical
    batch of the published fit is ~1e-8 sequences, so a step made almost no progress and a run
    spent most of its simulated time escaping a loss no model ever has. An untrained model
    predicts about uniformly over its vocabulary: its loss is ln(vocab) (10.4 nats for 32,000
    tokens), which `simulate` puts here when `initial` is None."""

    e: float = 1.69
    a: float = 406.4
    alpha: float = 0.34
    b: float = 410.7
    beta: float = 0.28
    initial: float | None = None

    def loss(self, params: float, tokens: float) -> float:
        fitted = self.floor(params) + self.b / power(max(tokens, 1.0), self.beta)
        return fitted if self.initial is None else min(fitted, self.initial)

    def floor(self, params: float) -> float:
        """The loss after infinitely many tokens: no target at or below it is ever reached."""
        return self.e + self.a / power(params, self.alpha)

    def tokens_to(self, params: float, target: float) -> float | None:
        """Tokens (at a vanishingly small batch) the curve needs to reach `target`; None when never."""
        floor = self.floor(params)
        return power(self.b / (target - floor), 1.0 / self.beta) if target > floor else None


def power(x: float, y: float) -> float:
    """x ** y, infinite where a float overflows (a fit's exponent far outside the published ones
    must give a run that never gets there, not an error)."""
    try:
        return x**y
    except OverflowError:
        return math.inf


@dataclass(frozen=True)
class CriticalBatch:
    """B_crit(L) = b_star_tokens / L^(1/alpha_b) tokens (Kaplan et al. 2020, eq. 1.4:
    B* ≈ 2e8 tokens, α_B ≈ 0.21). `flat_tokens` replaces it by a constant."""

    b_star_tokens: float = 2.1e8
    alpha_b: float = 0.21
    flat_tokens: float | None = None

    @property
    def source(self) -> str:
        return "flat" if self.flat_tokens is not None else "published fit (Kaplan et al. 2020)"

    def scaled(self, factor: float) -> "CriticalBatch":
        """The same law with every critical batch `factor` times larger (a user's guess off by it)."""
        flat = self.flat_tokens * factor if self.flat_tokens is not None else None
        return replace(self, b_star_tokens=self.b_star_tokens * factor, flat_tokens=flat)

    def tokens(self, loss: float) -> float:
        if self.flat_tokens is not None:
            return self.flat_tokens
        return self.b_star_tokens / power(loss, 1.0 / self.alpha_b)


@dataclass(frozen=True)
class CalibratedCriticalBatch:
    """B_crit(L) measured at branch points (`copus calibrate`): linear in the loss between
    them, held at the end values beyond them. `losses` and `b_crit_tokens` pair up."""

    losses: tuple[float, ...]
    b_crit_tokens: tuple[float, ...]
    source: str = "calibration"

    def __post_init__(self):
        if not self.losses or len(self.losses) != len(self.b_crit_tokens):
            raise ValueError("calibration: branch points need a loss and a critical batch each")

    @classmethod
    def from_branch_points(
        cls, points: list[dict], seq_len: int, source: str = "calibration"
    ) -> "CalibratedCriticalBatch":
        """From `branch_points` entries (`val_loss`, `b_crit` in sequences; `decrement`, when
        given, places the measurement at the middle of the loss drop it ran over, as
        `copus.core.calibration.BranchFit.level`). A null `b_crit` (none measured) is left out."""
        pairs = sorted(
            (p["val_loss"] - p.get("decrement", 0.0) / 2, p["b_crit"] * seq_len)
            for p in points
            if p.get("b_crit") is not None
        )
        return cls(tuple(x for x, _ in pairs), tuple(y for _, y in pairs), source)

    def scaled(self, factor: float) -> "CalibratedCriticalBatch":
        """Every branch point's critical batch `factor` times larger."""
        return replace(self, b_crit_tokens=tuple(b * factor for b in self.b_crit_tokens))

    def tokens(self, loss: float) -> float:
        return float(np.interp(loss, self.losses, self.b_crit_tokens))


@dataclass(frozen=True)
class NoiseEstimate:
    """How the noise scale the planner is given departs from the truth (samples):

        b_noise = m · ε · B_crit(loss `lag` samples ago) / c

    - lag: the live estimate is an EMA whose half-life is `half_life_share` of the samples seen,
      at least `min_half_life` reference batches (`copus.core.gns.Horizon`, the product's
      defaults 0.05 and 8); its mean age, h / ln 2, is how far behind the present it reads.
    - m, the mapping error: how far the planner's c × B_noise is off the true critical batch
      (c the planner's critical factor).
    - ε, the estimate's relative noise, exp(σ z) (lognormal) or max(1 + σ z, 0.01) (gaussian),
      z ~ N(0, 1) from a generator seeded with `seed`, an AR(1) over decisions: an EMA's error
      persists, so z keeps the correlation 0.5^(samples between two decisions / h) that the
      average's own weights give.

    Defaults from the trade-off workload (`bench/noise_tracking.py`, the live estimate against
    B_noise measured at fixed weights at 320, 1280, 3840 and 9600 samples): ratios 0.47, 0.72,
    1.14, 1.31, median 0.93 (the lag's ~7% for a noise scale growing as the samples), sd of log
    0.45, part of which is the fixed-weight measurement's own noise: σ = 0.35. c = B_crit / live
    estimate read 1.1, 3.0, 0.6 and 6.0 there, geometric mean 1.9 against the configured 2: m = 1.
    `half_life_share` 0 with `min_half_life` 0 and `noise` 0 is the oracle (the planner reads
    the present truth)."""

    mapping_error: float = 1.0
    noise: float = 0.35
    distribution: str = "lognormal"
    seed: int = 0
    half_life_share: float = 0.05
    min_half_life: float = 8.0  # reference batches

    def rng(self) -> np.random.Generator:
        return np.random.default_rng(self.seed)

    def half_life(self, samples: float, reference_gbs: float) -> float:
        return max(self.half_life_share * samples, self.min_half_life * reference_gbs)

    def lag(self, samples: float, reference_gbs: float) -> float:
        """Samples the estimate trails the present by: the EMA's mean age, h / ln 2."""
        return self.half_life(samples, reference_gbs) / math.log(2)

    def relative_error(self, z: float) -> float:
        """ε of a standard normal draw z."""
        if self.noise <= 0:
            return 1.0
        if self.distribution == "lognormal":
            return math.exp(self.noise * z)
        if self.distribution == "gaussian":
            return max(1.0 + self.noise * z, 0.01)
        raise ValueError(
            f"estimate.distribution: unknown distribution {self.distribution!r} (known: lognormal, gaussian)"
        )

    def factor(self, rng: np.random.Generator) -> float:
        """ε of an independent draw."""
        return self.relative_error(float(rng.standard_normal())) if self.noise > 0 else 1.0


class LiveEstimate:
    """The noise scale one run's controller reads, decision after decision (`NoiseEstimate`):
    the lagged truth, the mapping error and the autocorrelated relative noise."""

    def __init__(self, estimate: NoiseEstimate, critical_factor: float, reference_gbs: float):
        self.estimate, self.critical_factor, self.reference_gbs = estimate, critical_factor, reference_gbs
        self.rng = estimate.rng()
        self.z: float | None = None  # the AR(1) state, None before the first draw
        self.samples_then = 0.0  # samples seen at the previous draw

    def _error(self, samples: float) -> float:
        if self.estimate.noise <= 0:
            return 1.0
        fresh = float(self.rng.standard_normal())
        if self.z is None:
            self.z = fresh
        else:
            h = self.estimate.half_life(samples, self.reference_gbs)
            rho = 0.5 ** ((samples - self.samples_then) / h) if h > 0 else 0.0
            self.z = rho * self.z + math.sqrt(1.0 - rho * rho) * fresh
        self.samples_then = samples
        return self.estimate.relative_error(self.z)

    def read(self, model: TrainingModel) -> float:
        s = model.samples
        lagged = model.b_crit_at(s - self.estimate.lag(s, self.reference_gbs))
        return self.estimate.mapping_error * self._error(s) * lagged / self.critical_factor


@dataclass(frozen=True)
class LrTransient:
    """The first steps after a GBS change make less progress: AdamW's second moments were set
    at the old batch's gradient noise and the √ LR rule jumps the step size, so the update is
    mis-scaled until the moments re-adapt, ~1/(1 - β2) = 20 steps at β2 = 0.95. A step k < `steps`
    after a change counts for 1 - depth (1 - `efficiency`)(1 - k / `steps`) of its progress,
    depth = |log2(new GBS / old GBS)| at most 1: a doubling or more costs the whole transient,
    a ramp's small increment a share of it. Our assumption, not a measurement."""

    steps: int = 20
    efficiency: float = 0.5

    @staticmethod
    def depth(old_gbs: int, new_gbs: int) -> float:
        return min(1.0, abs(math.log2(new_gbs / old_gbs)))

    def factor(self, since_change: int, depth: float) -> float:
        if since_change >= self.steps or depth <= 0:
            return 1.0
        return 1.0 - depth * (1.0 - self.efficiency) * (1.0 - since_change / self.steps)

    def residual(self, since_change: int, depth: float) -> float:
        """What is left of a transient's depth `since_change` steps into it."""
        return depth * max(0.0, 1.0 - since_change / self.steps) if self.steps > 0 else 0.0


@dataclass
class TrainingModel:
    """The statistical truth of a simulated run: effective tokens seen, loss, critical batch.
    A step of B samples is worth B · B_crit / (B_crit + B) samples at a vanishingly small
    batch (McCandlish et al. 2018, E(B) = E_min (1 + B / B_crit), B_crit at the current loss),
    less during an LR transient after a GBS change (`LrTransient`): nothing of the planner's
    form or critical factor enters, so the truth does not follow what the planner believes, nor
    depend on where a policy starts. With `keep_history` it remembers the effective tokens after
    every step, for the critical batch the run had earlier (`b_crit_at`, the estimate's lag)."""

    params: float
    seq_len: int
    curve: LossCurve = field(default_factory=LossCurve)
    critical: CriticalBatch | CalibratedCriticalBatch = field(default_factory=CriticalBatch)
    transient: LrTransient = field(default_factory=LrTransient)
    keep_history: bool = False
    tokens: float = (
        0.0  # effective tokens: tokens at a vanishingly small batch that would have brought the same progress
    )
    samples: int = 0  # samples actually trained on

    def __post_init__(self):
        self._gbs: int | None = None  # the previous step's GBS
        self._since_change = 0
        self._depth = 0.0
        # Compact: a run keeps millions of steps' history.
        self._history_samples = array("d", [float(self.samples)])
        self._history_tokens = array("d", [self.tokens])
        self._floor = self.curve.floor(self.params)  # a step costs microseconds: computed once
        self._cap = self.curve.initial if self.curve.initial is not None else math.inf

    @property
    def floor(self) -> float:
        """The loss this model approaches and never goes below (`LossCurve.floor`)."""
        return self._floor

    def loss_of(self, tokens: float) -> float:
        """`curve.loss` at these effective tokens (its floor computed once)."""
        return min(self._floor + self.curve.b / power(max(tokens, 1.0), self.curve.beta), self._cap)

    @property
    def loss(self) -> float:
        return self.loss_of(self.tokens)

    @property
    def b_crit(self) -> float:
        """The true critical batch in samples (sequences) at the current loss."""
        return self.b_crit_of(self.tokens)

    def b_crit_of(self, tokens: float) -> float:
        return self.critical.tokens(self.loss_of(tokens)) / self.seq_len

    def b_crit_at(self, samples: float) -> float:
        """The true critical batch when the run had seen `samples` samples (interpolated between
        steps, held at the start before 0 and at the present beyond it): needs `keep_history`."""
        xs, ys = self._history_samples, self._history_tokens
        if not self.keep_history or samples >= xs[-1]:
            return self.b_crit
        i = bisect_right(xs, samples)
        if i == 0:
            return self.b_crit_of(ys[0])
        share = (samples - xs[i - 1]) / (xs[i] - xs[i - 1])
        return self.b_crit_of(ys[i - 1] + share * (ys[i] - ys[i - 1]))

    def _transient_factor(self, gbs: int) -> float:
        if self._gbs is not None and gbs != self._gbs:
            left = self.transient.residual(self._since_change, self._depth)
            self._depth = min(1.0, left + self.transient.depth(self._gbs, gbs))
            self._since_change = 0
        self._gbs = gbs
        factor = self.transient.factor(self._since_change, self._depth)
        self._since_change += 1
        return factor

    def continues_from(self, gbs: int) -> "TrainingModel":
        """This model continues a run that last trained at `gbs` (and had left its last transient
        behind): a step at another GBS pays the transient. Returns the model."""
        self._gbs, self._since_change = gbs, self.transient.steps
        return self

    def step(self, gbs: int) -> None:
        b_crit = self.b_crit_of(self.tokens)
        steady = gbs == self._gbs and self._since_change >= self.transient.steps
        progress = gbs * self.seq_len * b_crit / (b_crit + gbs)
        self.tokens += progress if steady else progress * self._transient_factor(gbs)
        self.samples += gbs
        if self.keep_history:
            self._history_samples.append(self.samples)
            self._history_tokens.append(self.tokens)


@dataclass(frozen=True)
class Cluster:
    node: NodeSpec
    nodes: int
    # The framework whose run is the truth (copus.core.megatron); None: the plain datasheet model,
    # the fitted form's own shape.
    framework: MegatronFramework | None = None

    @property
    def world(self) -> int:
        return self.node.accelerators_per_node * self.nodes

    def link(self, group_span: int) -> tuple[float, float]:
        """(bandwidth, latency) of a group whose members are `group_span` ranks apart at most:
        within a node over NVLink / Infinity Fabric, else over the network."""
        n = self.node
        if group_span <= n.accelerators_per_node:
            return n.intra_node_bandwidth, n.intra_node_latency_s
        return n.inter_node_bandwidth, n.inter_node_latency_s


def training_flops_per_token(shape: ModelShape, seq_len: int) -> float:
    """Forward and backward: 6 per parameter, plus attention scores and values (12 L d s)."""
    return 6.0 * shape.param_count() + attention_flops_per_token(shape, seq_len)


def hardware_params(cluster: Cluster, shape: ModelShape, seq_len: int, cfg: CandidateConfig) -> StepTimeParams:
    """Step-time coefficients of `cfg` on `cluster`. Ranks are laid out (pp, dp, tp), tp
    innermost (as `copus.parallel.dims`): a tp group spans tp ranks, a dp group dp × tp; the plain
    model's stage-to-stage link crosses nodes once dp × tp fills a node, a Megatron run's once its
    pipeline spans nodes (`copus.core.megatron.stage_link_span`), and a Megatron run counts no
    matmul work for the embedding."""
    acc, fw = cluster.node.accelerator, cluster.framework
    per_token = training_flops_per_token(shape, seq_len) if fw is None else matmul_flops_per_token(shape, seq_len)
    rate = acc.peak_bf16_flops * acc.mfu_max
    # compute = (a0 + a1 mbs / tp), the rank's FLOPs (per_token mbs seq_len / tp) over
    # peak x MFU(w), MFU(w) = mfu_max w / (w + h): with w the rank's tokens (mbs seq_len / tp) the
    # fixed part is per_token h / rate; with w the micro-batch's (mbs seq_len) it shrinks with tp.
    a1 = per_token * seq_len / rate
    a0 = per_token * acc.mfu_half_tokens / rate
    if acc.mfu_tokens == "micro_batch":
        a0 /= cfg.tp
    act = seq_len * shape.dim * BF16  # one sample's activations at a layer boundary
    tp_bw, tp_lat = cluster.link(cfg.tp)
    dp_bw, dp_lat = cluster.link(cfg.dp * cfg.tp)
    span = cfg.dp * cfg.tp + 1 if fw is None else stage_link_span(cfg, cluster.node.accelerators_per_node)
    pp_bw, pp_lat = cluster.link(span)
    return StepTimeParams(
        a0=a0,
        a1=a1,
        # Megatron TP: two all-reduces of the activations per layer forward, two backward.
        c0=4 * 2 * (cfg.tp - 1) * tp_lat,
        c1=4 * act / tp_bw,
        # Activations forward and their gradients backward, per micro-batch.
        p0=2 * pp_lat,
        p1=2 * act / pp_bw,
        # Ring all-reduce of the rank's gradients (bf16 on the wire, the model counts fp32 bytes).
        d0=2 * (cfg.dp - 1) * dp_lat,
        d1=(BF16 / GRAD_BYTES) / dp_bw,
        o0=0.005,
        o1=(ADAM_BYTES_PER_PARAM / GRAD_BYTES) / acc.memory_bandwidth,
    )


def step_terms(cluster: Cluster, shape: ModelShape, seq_len: int, cfg: CandidateConfig) -> Terms:
    """The pieces of a step of `cfg` in the cluster's truth: the plain model's, or a Megatron
    run's (its overlap, its interleaving, its fp32 gradient reduction)."""
    params = hardware_params(cluster, shape, seq_len, cfg)
    if cluster.framework is None:
        return StepTimeModel(params, shape).terms(cfg)
    dp_bw, _ = cluster.link(cfg.dp * cfg.tp)
    ring = 2 * (cfg.dp - 1) / cfg.dp * rank_grad_bytes(shape, cfg.tp, cfg.pp)  # fp32 bytes each rank sends
    return megatron_terms(params, shape, seq_len, cfg, cluster.framework, params.d0 + ring / dp_bw)


def step_time(cluster: Cluster, shape: ModelShape, seq_len: int, cfg: CandidateConfig) -> float:
    return step_terms(cluster, shape, seq_len, cfg).step


def dp_allreduce_ratio(cluster: Cluster, shape: ModelShape, seq_len: int, gbs: int) -> float:
    """The data-parallel all-reduce time per step over the compute time per step of the
    all-data-parallel layout (dp = every accelerator, mbs 1) at `gbs`, a multiple of the world
    size: the dimensionless ratio an emulated cluster's link rate is set to match
    (docs/emulated-cluster.md, bench/link_rate.py). Of the plain model: the all-reduce a run
    exposes without overlap."""
    cfg = CandidateConfig(dp=cluster.world, tp=1, pp=1, mbs=1, gbs=gbs)
    t = StepTimeModel(hardware_params(cluster, shape, seq_len, cfg), shape).terms(cfg)
    return t.dp_allreduce / (t.pipeline + t.bubble)


def memory_fits(cluster: Cluster, shape: ModelShape, seq_len: int, cfg: CandidateConfig, margin: float = 0.1) -> bool:
    node, fw = cluster.node, cluster.framework
    precision = ENGINE if fw is None else fw.precision
    need = config_bytes(
        shape, cfg, seq_len, act_bytes=BF16, overhead_bytes=node.runtime_overhead_bytes, precision=precision
    )
    return fits(need, node.accelerator.memory_bytes, margin)[0]


@dataclass(frozen=True)
class ReconfigurationCosts:
    """Seconds a layout change costs. In place: a fixed part (new communicators, schedule,
    synchronisation) plus every rank receiving its new share of the training state over the
    network. Restart: a fixed part (job relaunch, process and CUDA start-up, communicator
    set-up) plus writing and reading the whole state to and from storage, every node at
    `storage_bandwidth`. The defaults are our assumptions, sized to the magnitudes the COPUS
    paper reports (in place 30-56 s, restart 231-809 s on its clusters); override them."""

    in_place_fixed_s: float = 25.0
    restart_fixed_s: float = 180.0
    storage_bandwidth: float = 1e9

    def in_place_s(self, cluster: Cluster, shape: ModelShape) -> float:
        per_rank = shape.param_count() * STATE_BYTES_PER_PARAM / cluster.world
        return self.in_place_fixed_s + per_rank / cluster.node.inter_node_bandwidth

    def restart_s(self, cluster: Cluster, shape: ModelShape) -> float:
        state = shape.param_count() * STATE_BYTES_PER_PARAM
        return self.restart_fixed_s + 2 * state / (self.storage_bandwidth * cluster.nodes)

    def switch_costs(self, cluster: Cluster, shape: ModelShape, mode: str) -> SwitchCosts:
        """As the controller sees them: an MBS change in place only rebuilds the schedule."""
        if mode == "restart":
            cost = self.restart_s(cluster, shape)
            return SwitchCosts(cost, cost)
        return SwitchCosts(self.in_place_s(cluster, shape), 0.0)


@dataclass(frozen=True)
class MeasuredSteps:
    """A throughput truth read off a real profile (`copus profile`'s table) instead of derived
    from datasheets: a configuration's step time where the profile measured it, the profile's
    fitted model elsewhere; what the profile found infeasible, or a parallel degree it never
    measured, is out of the search space. A setting with it stands for a cluster that can also
    be run (the emulated one, docs/emulated-cluster.md), so what it predicts can be checked."""

    measured: tuple[tuple[CandidateConfig, float], ...]  # seconds per step, as measured
    model: StepTimeModel
    infeasible: frozenset[CandidateConfig] = frozenset()
    source: str = ""
    held_out: tuple[float, float] = (0.0, 0.0)  # the fit's held-out (mean, worst) relative error
    # What real runs paid per step over the profile's reading, by layout label (dpX-tpY-ppZ;
    # 1 where not named), or by layout and MBS (dpX-tpY-ppZ mbsM, which comes first): a profile's
    # few steps on a fresh worker group read under a run's steady state, by a measurable factor
    # (copus.sim.fit --profile).
    run_factor: tuple[tuple[str, float], ...] = ()

    def profile_step_time(self, cfg: CandidateConfig) -> float:
        """The profile's own reading: measured where measured, its fitted model elsewhere."""
        seconds = dict(self.measured).get(cfg)
        return seconds if seconds is not None else self.model.step_time(cfg)

    def step_time(self, cfg: CandidateConfig) -> float:
        factors = dict(self.run_factor)
        return self.profile_step_time(cfg) * factors.get(cfg.shape_label(), factors.get(cfg.layout_label(), 1.0))

    def admits(self, cfg: CandidateConfig) -> bool:
        return cfg not in self.infeasible and not self.model.extrapolates(cfg)


@dataclass(frozen=True)
class RunOverheads:
    """Wall-clock a real run spends outside its training steps, which a simulated run of a
    cluster that can also be run adds to its time to target (measured by `copus.sim.fit` on
    real runs): the start-up before the first step (workers, model, the step-0 evaluation), the
    time between two steps beyond the step itself (logging, the controller's calls), and an
    evaluation every `eval_every_steps` steps, `eval_s` seconds by layout label (dpX-tpY-ppZ; a
    layout not named costs the mean of those named). With evaluations priced, the target is
    seen only at an evaluation, as a real run sees it, and each evaluation reads the truth's
    loss off by `eval_noise` nats (sd; a real validation loss on a few batches is noisy, and a
    run stops at the first reading below the target, so the noise brings the stop forward;
    seeded by the estimate's seed). All zero (the default): a GPU cluster's run of days, where
    they are noise."""

    startup_s: float = 0.0
    between_steps_s: float = 0.0
    eval_every_steps: int = 0
    eval_s: tuple[tuple[str, float], ...] = ()
    eval_noise: float = 0.0

    def eval_seconds(self, cfg: CandidateConfig) -> float:
        by_layout = dict(self.eval_s)
        mean = float(np.mean(list(by_layout.values()))) if by_layout else 0.0
        return by_layout.get(cfg.layout_label(), mean)

    def evaluates_after(self, steps: int) -> bool:
        return self.eval_every_steps <= 0 or steps % self.eval_every_steps == 0


@dataclass(frozen=True)
class Setting:
    """One simulated cluster and workload, and the policies' common knobs."""

    cluster: Cluster
    shape: ModelShape
    seq_len: int
    start: CandidateConfig  # the experiment's configuration (batch.gbs, batch.mbs, its layout)
    gbs_min: int
    gbs_max: int
    mbs: tuple[int, ...]
    target_loss: float
    form: str = "pollux"  # the planner's beliefs: SE form and critical factor
    critical_factor: float = 2.0
    threshold: float = 0.10
    rule: RuleSettings = RuleSettings()  # how the planner decides to switch (copus.core.planner)
    factor_log_sd: float = PRIOR_LOG_SD  # sd of log c the planner reads the critical batch with
    interval_s: float = 600.0
    reconfigure: str = "in_place"
    costs: ReconfigurationCosts = ReconfigurationCosts()
    curve: LossCurve = LossCurve()  # the truth: loss curve (initial None: ln(vocab)) and critical batch
    critical: CriticalBatch | CalibratedCriticalBatch = CriticalBatch()
    transient: LrTransient = LrTransient()  # the truth's progress lost after a GBS change
    estimate: NoiseEstimate = NoiseEstimate()  # what the planner is told of the truth
    max_hours: float = 24.0 * 60
    layouts: tuple[tuple[int, int, int], ...] | None = None
    dp_shard: tuple[str, ...] = ("none", "optimizer", "full")  # what the planner may choose besides the layout
    recompute: tuple[str, ...] = ("none", "selective", "full")
    ramp: BatchRamp | None = None  # the ramp policy's schedule
    # How the planner's step-time table is made (copus.core.sim_view): exact, the truth's own, by
    # default here; `copus simulate` profiles the simulated cluster unless told otherwise.
    profile: ProfileSampling = ProfileSampling(exact=True)
    measured: MeasuredSteps | None = None  # the step times' truth from a real profile, not the cluster's datasheet
    # What the planner reads instead of profiling the simulated cluster: a real profile file (the
    # one a real run of this cluster reads), not the truth's.
    planner_table: MeasuredSteps | None = None
    overheads: RunOverheads = RunOverheads()  # a real run's time outside its steps (none by default)
    # How the planner's efficiency mapping is made (copus.core.sim_calibration): the configured
    # c x B_noise by default here; `copus simulate` simulates a calibration unless told otherwise.
    calibration: CalibrationSampling = CalibrationSampling()

    def truth_model(
        self, keep_history: bool = False, tokens: float = 0.0, last_gbs: int | None = None
    ) -> TrainingModel:
        """The statistical truth at `tokens` effective tokens (0: a fresh run), continuing a run
        that last trained at `last_gbs` if given."""
        model = TrainingModel(
            self.shape.param_count(),
            self.seq_len,
            self.truth_curve(),
            self.critical,
            self.transient,
            keep_history=keep_history,
            tokens=tokens,
        )
        return model.continues_from(last_gbs) if last_gbs is not None else model

    def truth_curve(self) -> LossCurve:
        """The loss curve the truth follows: capped at ln(vocab) unless the setting names a cap."""
        return (
            self.curve
            if self.curve.initial is not None
            else replace(self.curve, initial=math.log(self.shape.vocab_size))
        )


# The most steps and planner decisions one simulated run takes: above the paper's settings (a
# 3B model at GBS 8 to loss 2.3 takes about 2.5 million steps; COPUS about 100,000-1,000,000
# steps and 2,500 decisions), few enough that any setting ends within seconds (a step costs
# a microsecond or two, a decision the planner makes about a millisecond; a static policy's
# "nothing to decide" costs nothing and is not counted). A run stopped there has not reached
# the target; `SimResult.stopped` says why.
MAX_STEPS = 3_000_000
EVAL_STREAM = 7  # the generator stream of the evaluations' noise (the estimate's uses the seed alone)
MAX_DECISIONS = 5_000


def search_space(
    s: Setting, gbs_min: int | None = None, gbs_values: list[int] | None = None
) -> tuple[list[CandidateConfig], np.ndarray]:
    """Memory-feasible candidates and their samples/s on the modelled cluster (GBS of the grid
    from `gbs_min`, default the setting's, to the setting's largest; or exactly `gbs_values`)."""
    layouts = list(s.layouts) if s.layouts else valid_layouts(s.cluster.world, s.shape)
    grid = gbs_values if gbs_values is not None else gbs_grid(gbs_min or s.gbs_min, s.gbs_max)
    cands = [c for c in candidates(layouts, list(s.mbs), grid, s.shape, s.dp_shard, s.recompute) if admitted(s, c)]
    if not cands:
        raise ValueError("search: no configuration of the search space fits the modelled memory")
    return cands, np.array([c.gbs / true_step_time(s, c) for c in cands])


def true_step_time(s: Setting, cfg: CandidateConfig) -> float:
    """Seconds per step of `cfg` in the setting's truth: the measured profile's, else the model's
    of the cluster's hardware."""
    if s.measured is not None:
        return s.measured.step_time(cfg)
    return step_time(s.cluster, s.shape, s.seq_len, cfg)


def profile_readings(s: Setting, space: tuple[list[CandidateConfig], np.ndarray]) -> np.ndarray:
    """Samples/s of each candidate as a profile of the cluster reads them: the truth's, less
    what runs pay beyond a profile's reading (`MeasuredSteps.run_factor`), which only a run sees."""
    cands, throughputs = space
    if s.measured is None or not s.measured.run_factor:
        return throughputs
    return np.array([c.gbs / s.measured.profile_step_time(c) for c in cands])


def admitted(s: Setting, cfg: CandidateConfig) -> bool:
    """Whether `cfg` may run at all: within the measured profile, else within modelled memory."""
    return s.measured.admits(cfg) if s.measured is not None else memory_fits(s.cluster, s.shape, s.seq_len, cfg)


def planner_view(s: Setting, space: tuple[list[CandidateConfig], np.ndarray], seed: int | None = None) -> PlannerView:
    """The step-time table the planner reads (`s.profile`), its timing noise drawn with `seed`
    (default the estimate's: each evaluation seed profiles the cluster anew); or the real profile
    file `s.planner_table`, the same at every seed, as a real suite's runs read one file."""
    cands, throughputs = space
    seed = s.estimate.seed if seed is None else seed
    if s.planner_table is not None:
        view = table_view(s.planner_table, cands, throughputs, s.planner_table.source)
    else:
        view = profiled_view(s.shape, cands, profile_readings(s, space), s.profile, seed)
    if not s.calibration.use:
        return view
    truth = calibration_truth(s, s.calibration, best_speed_by_gbs(space))
    calibration, report = simulated_calibration(s, s.calibration, truth, seed)
    return replace(view, calibration=calibration, calibration_report=report)


def best_speed_by_gbs(space: tuple[list[CandidateConfig], np.ndarray]) -> dict[int, float]:
    """{gbs: the truth's best samples/s at it} over the search space."""
    best: dict[int, float] = {}
    for c, t in zip(*space):
        best[c.gbs] = max(best.get(c.gbs, 0.0), float(t))
    return best


def make_planner(s: Setting, view: PlannerView):
    # Looked up on the module at call time, so a test that patches the planner sees its effect.
    rule = replace(s.rule, throughput_log_sd=view.throughput_log_sd)
    return planner_module.Planner.from_table(
        view.throughputs,
        s.start.gbs,
        s.form,
        s.critical_factor,
        s.threshold,
        calibration=view.calibration,
        rule=rule,
        model=view.model_throughputs,
    )


def admits_ramp(cfg: CandidateConfig, ramp: BatchRamp, shape: ModelShape) -> bool:
    """Whether `cfg`'s layout and MBS can train every GBS of `ramp`: each a multiple of dp × MBS
    (their gcd is), the smallest with at least pp micro-batches (the larger then have more)."""
    gbs_values = [g for _, g in ramp.points]
    smallest = min(gbs_values)
    return math.gcd(*gbs_values) % (cfg.dp * cfg.mbs) == 0 and not layout_problems(
        cfg.dp, cfg.tp, cfg.pp, shape, None, smallest, cfg.mbs
    )


def ramp_config(s: Setting, ramp: BatchRamp, view: PlannerView | None = None) -> CandidateConfig:
    """Where a ramp trains, as Megatron-LM's: one layout and MBS for the whole run, the ones of
    best throughput at the ramp's final GBS (where most of a run's samples go) among those that
    admit every GBS of the ramp; only the micro-batches per step change. Throughput as `view`
    reads it (a profile), else the truth's."""
    if view is None:
        cands, throughputs = search_space(s, gbs_values=[ramp.final_gbs])
    else:
        cands = [c for c in view.throughputs if c.gbs == ramp.final_gbs]
        throughputs = np.array([view.throughputs[c] for c in cands])
    fit = [i for i, c in enumerate(cands) if admits_ramp(c, ramp, s.shape)]
    if not fit:
        raise ValueError(f"ramp: no configuration of the search space admits every GBS of the ramp ({ramp.describe()})")
    return replace(cands[max(fit, key=lambda i: throughputs[i])], gbs=ramp.start_gbs)


@dataclass
class SimResult:
    policy: str
    time_to_target_s: float | None
    steps: int
    samples: int
    reconfigurations: list[dict]
    final_loss: float
    start: CandidateConfig
    final: CandidateConfig
    timeline: list[dict]  # (time, samples, loss, b_crit, b_noise, gbs, layout) about every decision interval
    stopped: str | None = None  # why a run that did not reach the target ended: max_hours, max_steps, max_decisions

    interval_s: float = 600.0  # the decision interval, for `reversed_switches`

    @property
    def reversed_switches(self) -> int:
        """Switches undone at the next decision (`copus.core.reconfiguration.reversed_switches`)."""
        return reversed_switches(self.reconfigurations, self.interval_s, "t")

    @property
    def replica_changes(self) -> int:
        """Changes of the replica (the planner's kind "layout": the 3D layout, sharding or
        recomputation), not of GBS or MBS alone."""
        return sum(c["change"] == "layout" for c in self.reconfigurations)

    @property
    def layout_changes(self) -> int:
        """Changes of the 3D layout itself (dp, tp, pp): what the COPUS paper calls one."""
        mesh = lambda c: (c["dp"], c["tp"], c["pp"])  # noqa: E731 - a small key
        return sum(mesh(c["from"]) != mesh(c["to"]) for c in self.reconfigurations)

    def as_dict(self) -> dict:
        return {
            "time_to_target_s": self.time_to_target_s,
            "steps": self.steps,
            "samples": self.samples,
            "reconfigurations": len(self.reconfigurations),
            "layout_changes": self.layout_changes,
            "replica_changes": self.replica_changes,
            "reversed_switches": self.reversed_switches,
            "changes": self.reconfigurations,
            "final_loss": self.final_loss,
            "start": self.start.as_dict(),
            "final": self.final.as_dict(),
            "stopped": self.stopped,
        }


class _Run:
    """One simulated run in progress: the truth, the clock, the configuration and its changes."""

    def __init__(self, s: Setting, policy: str, start: CandidateConfig, first: CandidateConfig, step_times: dict):
        self.s, self.policy, self.start, self.current = s, policy, start, first
        # Only a policy that reads the noise estimate needs the run's past (the estimate's lag).
        self.reads = policy not in SCHEDULED
        self.model = s.truth_model(keep_history=self.reads)
        self.step_times = dict(step_times)  # seconds by configuration; a ramp adds GBS off the grid
        self.t, self.steps, self.decided = s.overheads.startup_s, 0, 0
        self.reached = False  # the target seen reached (at an evaluation, where those are priced)
        self.eval_rng = np.random.default_rng([s.estimate.seed, EVAL_STREAM])
        self.limit = s.max_hours * 3600
        self.changes: list[dict] = []
        self.timeline = [self.point(float("nan"))]
        self.measured: dict[CandidateConfig, float] = {}  # samples/s the run has paid in each configuration

    def going(self) -> bool:
        return not self.reached and self.t < self.limit and self.steps < MAX_STEPS and self.decided < MAX_DECISIONS

    def train_step(self) -> None:
        seconds = self.step_times.get(self.current)
        if seconds is None:
            seconds = self.step_times[self.current] = true_step_time(self.s, self.current)
        o = self.s.overheads
        self.t += seconds + o.between_steps_s
        self.model.step(self.current.gbs)
        self.steps += 1
        if o.evaluates_after(self.steps):
            self.t += o.eval_seconds(self.current) if o.eval_every_steps > 0 else 0.0
            seen = self.model.loss + (o.eval_noise * float(self.eval_rng.standard_normal()) if o.eval_noise else 0.0)
            self.reached = seen <= self.s.target_loss

    def point(self, b_noise: float) -> dict:
        """Where the run stands: loss, true critical batch, the noise scale the policy saw (NaN for
        a policy that reads none), and the configuration it trains in."""
        m, c = self.model, self.current
        where = {"t": self.t, "samples": m.samples, "loss": m.loss, "b_crit": m.b_crit}
        return where | {"b_noise": b_noise, "gbs": c.gbs, "layout": c.label()}

    def switch(self, target: CandidateConfig, kind: str, downtime: float, **why) -> None:
        self.changes.append(
            {"t": self.t, "samples": self.model.samples, "from": self.current.as_dict(), "to": target.as_dict()}
            | {"change": kind, "downtime_s": downtime, "b_crit": self.model.b_crit}
            | why
        )
        self.t += downtime
        self.current = target

    def stopped(self) -> str | None:
        """Why a run that did not reach the target ended; None when it did."""
        if self.reached:
            return None
        if self.t >= self.limit:
            return "max_hours"
        return "max_steps" if self.steps >= MAX_STEPS else "max_decisions"

    def result(self) -> SimResult:
        m, stopped = self.model, self.stopped()
        reached = stopped is None
        return SimResult(
            self.policy,
            self.t if reached else None,
            self.steps,
            m.samples,
            self.changes,
            m.loss,
            self.start,
            self.current,
            self.timeline,
            stopped,
            self.s.interval_s,
        )


def _follow_policy(run: _Run, plan) -> None:
    """Train and, every `interval_s` of simulated time, let the policy decide on the noise scale
    its controller would read (`LiveEstimate`), through `copus.core.policies.decide`."""
    s = run.s
    estimate = LiveEstimate(s.estimate, s.critical_factor, s.start.gbs) if run.reads else None
    costs = s.costs.switch_costs(s.cluster, s.shape, s.reconfigure)
    next_decision = run.t + s.interval_s  # the clock starts after the start-up
    while run.going():
        run.train_step()
        if run.t < next_decision:
            continue
        next_decision = run.t + s.interval_s
        b_noise = estimate.read(run.model) if estimate is not None else float("nan")
        run.timeline.append(run.point(b_noise))
        context = _decision_context(run, plan, b_noise)
        # the run's speed in its configuration is the truth's (a run measures it over many steps)
        speed = run.measured[run.current] = context.pop("speed")
        at_speed = plan.at_run_speed(run.current, speed, run.measured)
        d = policies.decide(run.policy, at_speed, run.current, b_noise, s.interval_s, costs, **context)
        run.decided += d is not None
        if d is not None and d.switch:
            figures = {k: d.figures()[k] for k in ("gain_low", "horizon_s", "horizon_source") if k in d.figures()}
            run.switch(
                d.target,
                d.kind,
                costs.of(run.current, d.target),
                b_noise=b_noise,
                predicted_gain=d.predicted_gain,
                **figures,
            )


def _decision_context(run: _Run, plan, b_noise: float) -> dict:
    """What a controller knows at a decision besides the noise scale, as the run's controller
    reads it (`copus.cluster.controller`): the rest of the run off the loss curve so far (the
    timeline's losses at the decisions: a run's validation curve) and the target, and the
    critical batch's uncertainty."""
    s, points = run.s, run.timeline
    speed = run.current.gbs / run.step_times[run.current] if run.current in run.step_times else math.nan
    horizon = rest_of_run(
        [p["samples"] for p in points],
        [p["loss"] for p in points],
        s.target_loss,
        run.model.samples,
        speed,
        run.t,
        s.interval_s,
        s.rule.quantile_z,
        fit_window(s.rule.horizon_points),
    )
    loss = points[-1]["loss"]  # the run's latest reading of its loss, as a controller's last evaluation
    sd = critical_batch_log_sd(factor_log_sd_at(plan.mapping, loss, s.factor_log_sd)) if math.isfinite(b_noise) else 0.0
    return {"loss": loss, "elapsed_s": run.t, "horizon": horizon, "log_b_crit_sd": sd, "speed": speed}


def _follow_ramp(run: _Run, ramp: BatchRamp) -> None:
    """Train with the GBS the ramp gives the samples seen; the layout and MBS stay, so every
    change is made in place at no cost (as `copus.core.ramp.ramp_order`)."""
    points, k = ramp.points, 0
    next_point = run.t + run.s.interval_s
    while run.going():
        run.train_step()
        while k + 1 < len(points) and run.model.samples >= points[k + 1][0]:
            k += 1
        if points[k][1] != run.current.gbs:
            run.switch(replace(run.current, gbs=points[k][1]), "gbs", 0.0, reason="ramp")
        if run.t >= next_point:
            next_point = run.t + run.s.interval_s
            run.timeline.append(run.point(float("nan")))


def simulate(
    s: Setting,
    policy: str,
    space: tuple[list[CandidateConfig], np.ndarray] | None = None,
    view: PlannerView | None = None,
    ramp_at: CandidateConfig | None = None,
) -> SimResult:
    """One simulated run of `policy` until the target loss (or `max_hours` of simulated time).
    The truth (`TrainingModel`, the step times of `space`) advances every step; every choice of
    a configuration reads `view` (default `planner_view`: the setting's profile at the
    estimate's seed); at every decision the policy sees the noise-scale estimate `s.estimate`
    draws from the truth. `ramp` follows `s.ramp`, in `ramp_at`'s layout and MBS where a suite
    fixes them (default `ramp_config`'s)."""
    space = space or search_space(s)
    cands, throughputs = space
    step_times = {c: c.gbs / t for c, t in zip(cands, throughputs)}
    view = view or planner_view(s, space)
    if policy == "ramp":
        if s.ramp is None:
            raise ValueError("policies: 'ramp' needs a ramp schedule (the simulation YAML's ramp section)")
        first = ramp_at or ramp_config(s, s.ramp, None if view.report.get("exact") else view)
        run = _Run(s, policy, first, first, step_times)
        _follow_ramp(run, s.ramp)
        return run.result()
    plan = make_planner(s, view)
    start = s.start if s.start in step_times else min(cands, key=lambda c: abs(math.log(c.gbs / s.start.gbs)))
    run = _Run(s, policy, start, policies.initial_config(policy, plan, start, "best"), step_times)
    _follow_policy(run, plan)
    return run.result()


def best_layout_by_gbs(s: Setting) -> list[dict]:
    """For each GBS from the smallest any layout admits up to the setting's largest, the
    throughput-optimal configuration (the paper's central effect: where the best layout
    changes as the batch grows)."""
    cands, throughputs = search_space(s, gbs_min=min(s.gbs_min, s.cluster.node.accelerators_per_node))
    out = []
    for gbs in sorted({c.gbs for c in cands}):
        idx = [i for i, c in enumerate(cands) if c.gbs == gbs]
        best = max(idx, key=lambda i: throughputs[i])
        out.append({"gbs": gbs, "config": cands[best].as_dict(), "samples_per_s": float(throughputs[best])})
    return out
