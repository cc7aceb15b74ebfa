"""Cluster-scale simulator: the real planner and policies against a modelled cluster.

Three models stand in for what a real run measures:

- **Step time** of every candidate configuration from the hardware description: the same
  step-time formula (`copus.core.throughput`) the profiler fits on real machines, with its
  coefficients derived from the hardware instead of fitted (`hardware_params`): compute from
  peak bf16 FLOP/s and an MFU curve in the tokens per rank, tensor-parallel all-reduces and
  stage-to-stage sends over NVLink/Infinity Fabric or the network (whichever the group spans),
  the data-parallel ring all-reduce, the optimiser step over HBM. Memory feasibility from
  `copus.core.memory` (bf16 activations, AdamW state sharded over dp as with Megatron's
  distributed optimiser).
- **Training**: loss as a function of tokens, Hoffmann et al. 2022 (Chinchilla):
  L(N, D) = E + A / N^α + B / D^β, and the critical batch size as a function of the loss,
  Kaplan et al. 2020: B_crit(L) = B* / L^(1/α_B) tokens, so it grows as training proceeds; the
  noise scale the controller sees is B_crit / c (c = the critical factor). A step of GBS B
  advances D by B x seq_len x SE(B), SE in the same form and from the same function the
  controller uses: a batch beyond the noise scale buys less progress per sample. D is thus
  "tokens at a small batch"; the curve's constants are overridable for another calibration.
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
from copus.core.efficiency import efficiency
from copus.core.hardware import NodeSpec
from copus.core.layout import ModelShape
from copus.core.memory import bytes_per_rank, fits
from copus.core.planner import SwitchCosts
from copus.core.search import candidates, gbs_grid, valid_layouts
from copus.core.throughput import GRAD_BYTES, Config, StepTimeModel, StepTimeParams

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
        return self.e + self.a / params ** self.alpha + self.b / max(tokens, 1.0) ** self.beta


@dataclass(frozen=True)
class CriticalBatch:
    """B_crit(L) = b_star_tokens / L^(1/alpha_b) tokens (Kaplan et al. 2020, eq. 1.4:
    B* ≈ 2e8 tokens, α_B ≈ 0.21). `flat_tokens` replaces it by a constant."""
    b_star_tokens: float = 2.1e8
    alpha_b: float = 0.21
    flat_tokens: float | None = None

    def tokens(self, loss: float) -> float:
        if self.flat_tokens is not None:
            return self.flat_tokens
        return self.b_star_tokens / loss ** (1.0 / self.alpha_b)


@dataclass
class TrainingModel:
    """The statistical side of a simulated run: effective tokens seen, loss, noise scale.
    Effective tokens count a sample at its statistical efficiency relative to a vanishingly
    small batch, SE(B) = n / (n + B) with n the (scaled) noise scale: the same `efficiency`
    function the controller scores with, at B0 → 0, so the truth does not depend on where a
    policy starts (the controller's own B0 only rescales its scores, not their order)."""
    params: float
    seq_len: int
    form: str = "pollux"
    critical_factor: float = 2.0
    curve: LossCurve = field(default_factory=LossCurve)
    critical: CriticalBatch = field(default_factory=CriticalBatch)
    tokens: float = 0.0   # effective tokens: tokens at B0 that would have brought the same progress

    @property
    def loss(self) -> float:
        return self.curve.loss(self.params, self.tokens)

    @property
    def b_noise(self) -> float:
        """The gradient noise scale in samples, as the controller's estimate would report it."""
        return self.critical.tokens(self.loss) / self.seq_len / self.critical_factor

    def step(self, gbs: int) -> None:
        self.tokens += gbs * self.seq_len * efficiency(self.form, self.b_noise, 0.0, gbs, self.critical_factor)


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


def hardware_params(cluster: Cluster, shape: ModelShape, seq_len: int, cfg: Config) -> StepTimeParams:
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
        a0=a0, a1=a1,
        # Megatron TP: two all-reduces of the activations per layer forward, two backward.
        c0=4 * 2 * (cfg.tp - 1) * tp_lat, c1=4 * act / tp_bw,
        # Activations forward and their gradients backward, per micro-batch.
        p0=2 * pp_lat, p1=2 * act / pp_bw,
        # Ring all-reduce of the rank's gradients (bf16 on the wire, the model counts fp32 bytes).
        d0=2 * (cfg.dp - 1) * dp_lat, d1=(BF16 / GRAD_BYTES) / dp_bw,
        o0=0.005, o1=(ADAM_BYTES_PER_PARAM / GRAD_BYTES) / acc.memory_bandwidth,
    )


def step_time(cluster: Cluster, shape: ModelShape, seq_len: int, cfg: Config) -> float:
    return StepTimeModel(hardware_params(cluster, shape, seq_len, cfg), shape).step_time(cfg)


def memory_fits(cluster: Cluster, shape: ModelShape, seq_len: int, cfg: Config, margin: float = 0.1) -> bool:
    node = cluster.node
    need = bytes_per_rank(shape, cfg.dp, cfg.tp, cfg.pp, cfg.mbs, cfg.microbatches, seq_len, act_bytes=BF16,
                          shard_optimizer=True, overhead_bytes=node.runtime_overhead_bytes)
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
    start: Config                 # the experiment's configuration (batch.gbs, batch.mbs, its layout)
    gbs_min: int
    gbs_max: int
    mbs: tuple[int, ...]
    target_loss: float
    form: str = "pollux"
    critical_factor: float = 2.0
    threshold: float = 0.10
    interval_s: float = 600.0
    reconfigure: str = "in_place"
    costs: ReconfigurationCosts = ReconfigurationCosts()
    curve: LossCurve = LossCurve()
    critical: CriticalBatch = CriticalBatch()
    max_hours: float = 24.0 * 60
    layouts: tuple[tuple[int, int, int], ...] | None = None


def search_space(s: Setting, gbs_min: int | None = None) -> tuple[list[Config], np.ndarray]:
    """Memory-feasible candidates and their samples/s on the modelled cluster (GBS from
    `gbs_min`, default the setting's)."""
    layouts = list(s.layouts) if s.layouts else valid_layouts(s.cluster.world, s.shape)
    cands = [c for c in candidates(layouts, list(s.mbs), gbs_grid(gbs_min or s.gbs_min, s.gbs_max), s.shape)
             if memory_fits(s.cluster, s.shape, s.seq_len, c)]
    if not cands:
        raise ValueError("no configuration of the search space fits the modelled memory")
    return cands, np.array([c.gbs / step_time(s.cluster, s.shape, s.seq_len, c) for c in cands])


def make_planner(s: Setting, cands: list[Config], throughputs: np.ndarray):
    table = dict(zip(cands, throughputs))
    # Looked up on the module at call time, so a test that patches the planner sees its effect.
    return planner_module.Planner(cands, lambda cfgs: [table[c] for c in cfgs], s.start.gbs, s.form,
                                  s.critical_factor, s.threshold)


@dataclass
class SimResult:
    policy: str
    time_to_target_s: float | None
    steps: int
    samples: int
    reconfigurations: list[dict]
    final_loss: float
    start: Config
    final: Config
    timeline: list[dict]   # (time, loss, b_noise, gbs, layout) about every decision interval

    def as_dict(self) -> dict:
        return {"time_to_target_s": self.time_to_target_s, "steps": self.steps, "samples": self.samples,
                "reconfigurations": len(self.reconfigurations), "changes": self.reconfigurations,
                "final_loss": self.final_loss, "start": self.start.__dict__, "final": self.final.__dict__}


def simulate(s: Setting, policy: str, space: tuple[list[Config], np.ndarray] | None = None) -> SimResult:
    """One simulated run of `policy` until the target loss (or `max_hours` of simulated time)."""
    cands, throughputs = space or search_space(s)
    plan = make_planner(s, cands, throughputs)
    step_times = {c: c.gbs / t for c, t in zip(cands, throughputs)}
    start = s.start if s.start in step_times else min(cands, key=lambda c: abs(math.log(c.gbs / s.start.gbs)))
    current = policies.initial_config(policy, plan, start, "best")
    model = TrainingModel(s.shape.param_count(), s.seq_len, s.form, s.critical_factor, s.curve, s.critical)
    costs = s.costs.switch_costs(s.cluster, s.shape, s.reconfigure)
    t, steps, samples, next_decision, limit = 0.0, 0, 0, s.interval_s, s.max_hours * 3600
    changes: list[dict] = []
    timeline = [{"t": 0.0, "loss": model.loss, "b_noise": model.b_noise, "gbs": current.gbs, "layout": current.label()}]
    while model.loss > s.target_loss and t < limit:
        t += step_times[current]
        model.step(current.gbs)
        steps += 1
        samples += current.gbs
        if t < next_decision:
            continue
        next_decision = t + s.interval_s
        timeline.append({"t": t, "loss": model.loss, "b_noise": model.b_noise, "gbs": current.gbs,
                         "layout": current.label()})
        d = policies.decide(policy, plan, current, model.b_noise, s.critical_factor, s.interval_s, costs)
        if d is not None and d.switch:
            downtime = costs.of(current, d.target)
            changes.append({"t": t, "from": current.__dict__, "to": d.target.__dict__, "change": d.kind,
                            "downtime_s": downtime, "b_noise": model.b_noise, "predicted_gain": d.predicted_gain})
            t += downtime
            current = d.target
    reached = model.loss <= s.target_loss
    return SimResult(policy, t if reached else None, steps, samples, changes, model.loss, start, current, timeline)


def best_layout_by_gbs(s: Setting) -> list[dict]:
    """For each GBS from the smallest any layout admits up to the setting's largest, the
    throughput-optimal configuration (the paper's central effect: where the best layout
    changes as the batch grows)."""
    cands, throughputs = search_space(s, gbs_min=min(s.gbs_min, s.cluster.node.accelerators_per_node))
    out = []
    for gbs in sorted({c.gbs for c in cands}):
        idx = [i for i, c in enumerate(cands) if c.gbs == gbs]
        best = max(idx, key=lambda i: throughputs[i])
        out.append({"gbs": gbs, "config": cands[best].__dict__, "samples_per_s": float(throughputs[best])})
    return out
