"""Cluster-scale simulator: the real planner and policies against a modelled cluster.

Three models stand in for what a real run measures:

- **Step time** of every candidate configuration from the hardware description: the same
  step-time formula (`copus.core.throughput`) the profiler fits on real machines, with its
  coefficients derived from the hardware instead of fitted (`hardware_params`): compute from
  peak bf16 FLOP/s and an MFU curve in the tokens per rank, tensor-parallel all-reduces and
  stage-to-stage sends over NVLink/Infinity Fabric or the network (whichever the group spans),
  the data-parallel ring all-reduce, the optimiser step over HBM. Memory feasibility from
  `copus.core.memory` (bf16 activations; the candidate's own data-parallel sharding and
  recomputation, which the search space varies like the layout).
- **Training truth**, kept apart from what the planner believes (its form and critical
  factor are never used here). Loss as a function of effective tokens, Hoffmann et al. 2022
  (Chinchilla): L(N, D) = E + A / N^α + B / D^β; the true critical batch as a function of the
  loss, either Kaplan et al. 2020, B_crit(L) = B* / L^(1/α_B) tokens (`CriticalBatch`), or
  measured by `copus calibrate` (`CalibratedCriticalBatch`: branch points' B_crit
  interpolated linearly in the loss). Progress follows McCandlish et al. 2018:
  E(B) = E_min (1 + B / B_crit), so a step of B samples is worth B · B_crit / (B_crit + B)
  samples at a vanishingly small batch; D counts those ("tokens at a small batch").
- **The planner's view** (`NoiseEstimate`): the noise scale a controller would report, off
  from the truth by a mapping error m and a multiplicative estimation noise ε (seeded):
  b_noise = m · ε · B_crit / c, so the planner's own c × b_noise is m · ε · B_crit. With
  m = 1 and ε = 1 the planner's critical batch is the true one; its SE form is its own.
- **Reconfiguration cost** (`ReconfigurationCosts`): a fixed start-up plus the training state
  moved over the network (in place) or written to and read from storage (restart).

Time advances step by step; every `interval_s` of simulated time the policy decides through
`copus.core.policies.decide` and `copus.core.planner.Planner`, the objects a real run's
controller uses (hysteresis, switching cost and all). Pure: no torch, no ray.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from copus.core import planner as planner_module
from copus.core import policies
from copus.core.datasheets import NodeSpec
from copus.core.layout import CandidateConfig, ModelShape
from copus.core.memory import config_bytes, fits
from copus.core.planner import SwitchCosts
from copus.core.search import candidates, gbs_grid, valid_layouts
from copus.core.throughput import GRAD_BYTES, StepTimeModel, StepTimeParams

BF16 = 2
# Bytes of training state per parameter with bf16 mixed precision: bf16 weights and gradients,
# fp32 master weights and AdamW's two moments.
STATE_BYTES_PER_PARAM = 2 + 2 + 4 + 4 + 4
# AdamW reads parameter, gradient and both moments and writes three of them, in fp32.
ADAM_BYTES_PER_PARAM = 7 * 4


@dataclass(frozen=True)
class LossCurve:
    """L(N, D) = e + a / N^alpha + b / D^beta, N parameters, D tokens (Hoffmann et al. 2022,
    the fitted values of their approach 3)."""

    e: float = 1.69
    a: float = 406.4
    alpha: float = 0.34
    b: float = 410.7
    beta: float = 0.28

    def loss(self, params: float, tokens: float) -> float:
        return self.floor(params) + self.b / power(max(tokens, 1.0), self.beta)

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

    def tokens(self, loss: float) -> float:
        return float(np.interp(loss, self.losses, self.b_crit_tokens))


@dataclass(frozen=True)
class NoiseEstimate:
    """The noise scale the planner is given, from the true critical batch B_crit (samples):

        b_noise = m · ε · B_crit / c

    m the mapping error (how far the planner's c × B_noise is off the true critical batch),
    c the planner's critical factor, ε the estimate's relative noise: lognormal, ε = exp(σ z),
    or gaussian, ε = max(1 + σ z, 0.01), z ~ N(0, 1) from a generator seeded with `seed`."""

    mapping_error: float = 1.0
    noise: float = 0.0
    distribution: str = "lognormal"
    seed: int = 0

    def rng(self) -> np.random.Generator:
        return np.random.default_rng(self.seed)

    def factor(self, rng: np.random.Generator) -> float:
        if self.noise <= 0:
            return 1.0
        z = float(rng.standard_normal())
        if self.distribution == "lognormal":
            return math.exp(self.noise * z)
        if self.distribution == "gaussian":
            return max(1.0 + self.noise * z, 0.01)
        raise ValueError(
            f"estimate.distribution: unknown distribution {self.distribution!r} (known: lognormal, gaussian)"
        )

    def b_noise(self, b_crit: float, critical_factor: float, rng: np.random.Generator) -> float:
        return b_crit * self.mapping_error * self.factor(rng) / critical_factor


@dataclass
class TrainingModel:
    """The statistical truth of a simulated run: effective tokens seen, loss, critical batch.
    A step of B samples is worth B · B_crit / (B_crit + B) samples at a vanishingly small
    batch (McCandlish et al. 2018, E(B) = E_min (1 + B / B_crit), B_crit at the current loss):
    nothing of the planner's form or critical factor enters, so the truth does not follow
    what the planner believes, nor depend on where a policy starts."""

    params: float
    seq_len: int
    curve: LossCurve = field(default_factory=LossCurve)
    critical: CriticalBatch | CalibratedCriticalBatch = field(default_factory=CriticalBatch)
    tokens: float = (
        0.0  # effective tokens: tokens at a vanishingly small batch that would have brought the same progress
    )

    @property
    def loss(self) -> float:
        return self.curve.loss(self.params, self.tokens)

    @property
    def b_crit(self) -> float:
        """The true critical batch in samples (sequences) at the current loss."""
        return self.critical.tokens(self.loss) / self.seq_len

    def step(self, gbs: int) -> None:
        b_crit = self.b_crit
        self.tokens += gbs * self.seq_len * b_crit / (b_crit + gbs)


@dataclass(frozen=True)
class Cluster:
    node: NodeSpec
    nodes: int

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
    return 6.0 * shape.param_count() + 12.0 * shape.n_layers * shape.dim * seq_len


def hardware_params(cluster: Cluster, shape: ModelShape, seq_len: int, cfg: CandidateConfig) -> StepTimeParams:
    """Step-time coefficients of `cfg` on `cluster`. Ranks are laid out (pp, dp, tp), tp
    innermost (as `copus.parallel.dims`): a tp group spans tp ranks, a dp group dp × tp, the
    stage-to-stage link crosses nodes once dp × tp fills a node."""
    acc = cluster.node.accelerator
    per_token = training_flops_per_token(shape, seq_len)
    rate = acc.peak_bf16_flops * acc.mfu_max
    # compute = (a0 + a1 mbs / tp): MFU(w) = mfu_max w / (w + h) makes time affine in w.
    a1 = per_token * seq_len / rate
    a0 = per_token * acc.mfu_half_tokens / rate
    act = seq_len * shape.dim * BF16  # one sample's activations at a layer boundary
    tp_bw, tp_lat = cluster.link(cfg.tp)
    dp_bw, dp_lat = cluster.link(cfg.dp * cfg.tp)
    pp_bw, pp_lat = cluster.link(cfg.dp * cfg.tp + 1)
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


def step_time(cluster: Cluster, shape: ModelShape, seq_len: int, cfg: CandidateConfig) -> float:
    return StepTimeModel(hardware_params(cluster, shape, seq_len, cfg), shape).step_time(cfg)


def memory_fits(cluster: Cluster, shape: ModelShape, seq_len: int, cfg: CandidateConfig, margin: float = 0.1) -> bool:
    node = cluster.node
    need = config_bytes(shape, cfg, seq_len, act_bytes=BF16, overhead_bytes=node.runtime_overhead_bytes)
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
    interval_s: float = 600.0
    reconfigure: str = "in_place"
    costs: ReconfigurationCosts = ReconfigurationCosts()
    curve: LossCurve = LossCurve()  # the truth: loss curve and critical batch
    critical: CriticalBatch | CalibratedCriticalBatch = CriticalBatch()
    estimate: NoiseEstimate = NoiseEstimate()  # what the planner is told of the truth
    max_hours: float = 24.0 * 60
    layouts: tuple[tuple[int, int, int], ...] | None = None
    dp_shard: tuple[str, ...] = ("none", "optimizer", "full")  # what the planner may choose besides the layout
    recompute: tuple[str, ...] = ("none", "selective", "full")


# The most steps and planner decisions one simulated run takes: far above the paper's settings
# (about 75,000 steps and 250 decisions), few enough that any setting ends within seconds (a
# step costs microseconds, a decision the planner makes about a millisecond; a static policy's
# "nothing to decide" costs nothing and is not counted). A run stopped there has not reached
# the target; `SimResult.stopped` says why.
MAX_STEPS = 1_000_000
MAX_DECISIONS = 5_000


def search_space(s: Setting, gbs_min: int | None = None) -> tuple[list[CandidateConfig], np.ndarray]:
    """Memory-feasible candidates and their samples/s on the modelled cluster (GBS from
    `gbs_min`, default the setting's)."""
    layouts = list(s.layouts) if s.layouts else valid_layouts(s.cluster.world, s.shape)
    cands = [
        c
        for c in candidates(
            layouts, list(s.mbs), gbs_grid(gbs_min or s.gbs_min, s.gbs_max), s.shape, s.dp_shard, s.recompute
        )
        if memory_fits(s.cluster, s.shape, s.seq_len, c)
    ]
    if not cands:
        raise ValueError("search: no configuration of the search space fits the modelled memory")
    return cands, np.array([c.gbs / step_time(s.cluster, s.shape, s.seq_len, c) for c in cands])


def make_planner(s: Setting, cands: list[CandidateConfig], throughputs: np.ndarray):
    # Looked up on the module at call time, so a test that patches the planner sees its effect.
    return planner_module.Planner.from_table(
        dict(zip(cands, throughputs)), s.start.gbs, s.form, s.critical_factor, s.threshold
    )


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
    timeline: list[dict]  # (time, loss, b_crit, b_noise, gbs, layout) about every decision interval
    stopped: str | None = None  # why a run that did not reach the target ended: max_hours, max_steps, max_decisions

    def as_dict(self) -> dict:
        return {
            "time_to_target_s": self.time_to_target_s,
            "steps": self.steps,
            "samples": self.samples,
            "reconfigurations": len(self.reconfigurations),
            "changes": self.reconfigurations,
            "final_loss": self.final_loss,
            "start": self.start.as_dict(),
            "final": self.final.as_dict(),
            "stopped": self.stopped,
        }


def _timeline_point(t: float, model: TrainingModel, b_noise: float, current: CandidateConfig) -> dict:
    """Where the simulated run stands at a decision: loss, true critical batch, the noise scale the
    policy saw, and the configuration it trains in."""
    return {
        "t": t,
        "loss": model.loss,
        "b_crit": model.b_crit,
        "b_noise": b_noise,
        "gbs": current.gbs,
        "layout": current.label(),
    }


def simulate(s: Setting, policy: str, space: tuple[list[CandidateConfig], np.ndarray] | None = None) -> SimResult:
    """One simulated run of `policy` until the target loss (or `max_hours` of simulated time).
    The truth (`TrainingModel`) advances every step; at every decision the policy sees the
    noise-scale estimate `s.estimate` draws from the true critical batch."""
    cands, throughputs = space or search_space(s)
    plan = make_planner(s, cands, throughputs)
    step_times = {c: c.gbs / t for c, t in zip(cands, throughputs)}
    start = s.start if s.start in step_times else min(cands, key=lambda c: abs(math.log(c.gbs / s.start.gbs)))
    current = policies.initial_config(policy, plan, start, "best")
    model = TrainingModel(s.shape.param_count(), s.seq_len, s.curve, s.critical)
    rng = s.estimate.rng()
    costs = s.costs.switch_costs(s.cluster, s.shape, s.reconfigure)
    t, steps, samples, next_decision, limit = 0.0, 0, 0, s.interval_s, s.max_hours * 3600
    changes: list[dict] = []
    timeline = [_timeline_point(0.0, model, float("nan"), current)]
    decided = 0
    while model.loss > s.target_loss and t < limit and steps < MAX_STEPS and decided < MAX_DECISIONS:
        t += step_times[current]
        model.step(current.gbs)
        steps += 1
        samples += current.gbs
        if t < next_decision:
            continue
        next_decision = t + s.interval_s
        b_noise = s.estimate.b_noise(model.b_crit, s.critical_factor, rng)
        timeline.append(_timeline_point(t, model, b_noise, current))
        d = policies.decide(policy, plan, current, b_noise, s.interval_s, costs)
        decided += d is not None
        if d is not None and d.switch:
            downtime = costs.of(current, d.target)
            changes.append(
                {"t": t, "from": current.as_dict(), "to": d.target.as_dict(), "change": d.kind, "downtime_s": downtime}
                | {"b_noise": b_noise, "b_crit": model.b_crit, "predicted_gain": d.predicted_gain}
            )
            t += downtime
            current = d.target
    reached = model.loss <= s.target_loss
    stopped = None if reached else "max_hours" if t >= limit else "max_steps" if steps >= MAX_STEPS else "max_decisions"
    return SimResult(
        policy, t if reached else None, steps, samples, changes, model.loss, start, current, timeline, stopped
    )


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
