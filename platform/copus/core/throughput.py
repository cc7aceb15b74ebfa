"""Step time of a 3D-parallel configuration: a small parametric model fitted to profile points.

Pure math (numpy and scipy only). For a configuration (dp, tp, pp, mbs, gbs) with
m = gbs / (dp × mbs) micro-batches per replica, on the busiest pipeline stage:

    t_compute = (a0 + a1 · mbs / tp) · f_pp · (1 + r)  per micro-batch; a0 is the fixed cost of a
                                                     micro-batch (kernel launches, Python), which
                                                     tensor parallelism does not divide; f_pp the
                                                     busiest stage's share of the model's FLOPs;
                                                     r = r_full or r_sel the share recomputation
                                                     adds (a forward pass again: about 1/3 for full)
    t_tp      = [tp > 1] · L_stage · (c0 + c1 · mbs · 2(tp − 1)/tp)
                                                     activation all-reduces of every layer
    t_p2p     = [pp > 1] · (p0 + p1 · mbs)           sending activations/gradients between stages
    T_pipe    = (m + z · (pp − 1)) · (t_compute + t_tp + t_p2p)
                                                     z = 1 is the full (p − 1)/(m + p − 1) bubble;
                                                     fitted, since idle ranks on an oversubscribed
                                                     CPU hand their cores to busy ones
    T_dp      = [dp > 1] · k · (d0 + d1 · 2(dp − 1)/dp · G_rank)
                                                     ring all-reduce of the rank's gradient bytes;
                                                     k all-reduce equivalents per step: 1 for
                                                     dp_shard none (all-reduce) and optimizer (one
                                                     reduce-scatter and one all-gather), more for
                                                     full (`dp_collectives`)
    T_fixed   = o0 + o1 · G_rank / s                 optimiser step, clipping, bookkeeping; s = dp
                                                     when the optimiser state is sharded, else 1
    T         = (T_pipe^γ + T_dp^γ)^(1/γ) + T_fixed  γ = 1: no overlap, γ → ∞: the shorter hidden
                                                     entirely; fitted whenever the points reduce
                                                     over dp > 1 (the engine reduces gradient
                                                     buckets during backward)

All coefficients are non-negative and fitted with bounded least squares on relative errors
(the figure of merit is a percentage error), robust to a few noisy points. `cross_validate`
reports the error on points the fit did not see.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import numpy as np
from scipy.optimize import least_squares

from copus.core.layout import CandidateConfig, ModelShape, stage_layer_ranges

GRAD_BYTES = 4  # fp32 gradients


@dataclass(frozen=True)
class Measurement:
    config: CandidateConfig
    step_time_s: float


@dataclass(frozen=True)
class StepTimeParams:
    a0: float = 0.0  # s per micro-batch, fixed
    a1: float = 0.0  # s per sample of a micro-batch (whole model, one rank)
    c0: float = 0.0  # s per layer per micro-batch of tp collectives, fixed
    c1: float = 0.0  # s per layer per sample of tp collectives (times 2(tp-1)/tp)
    p0: float = 0.0  # s per micro-batch of stage-to-stage transfer, fixed
    p1: float = 0.0  # s per sample of stage-to-stage transfer
    d0: float = 0.0  # s per dp all-reduce, fixed
    d1: float = 0.0  # s per byte of ring all-reduce volume
    o0: float = 0.0  # s per step, fixed
    o1: float = 0.0  # s per gradient byte of the rank (optimiser step)
    r_full: float = 1.0 / 3.0  # compute added by full recomputation (a forward pass again)
    r_sel: float = 0.05  # compute added by selective recomputation (attention core, MLP activation)
    z: float = 1.0  # share of the pipeline bubble that is really lost
    gamma: float = 1.0  # overlap of pipeline compute and dp all-reduce (1: none)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "StepTimeParams":
        return cls(**{f.name: float(data[f.name]) for f in fields(cls) if f.name in data})


_NAMES = [f.name for f in fields(StepTimeParams)]
_UPPER = {"z": 1.0, "gamma": 10.0, "r_full": 1.0, "r_sel": 1.0}
_LOWER = {"gamma": 1.0}


def stage_compute_fraction(shape: ModelShape, pp: int) -> float:
    """The busiest stage's share of the model's matmul work (layers; the LM head on the last)."""
    head = shape.vocab_size * shape.dim
    total = shape.n_layers * shape.layer_params() + head
    ranges = stage_layer_ranges(shape.n_layers, pp)
    return max(len(r) * shape.layer_params() + (head if s == pp - 1 else 0) for s, r in enumerate(ranges)) / total


def rank_grad_bytes(shape: ModelShape, tp: int, pp: int) -> float:
    """Gradient bytes on the busiest rank (the whole stage divided over tp)."""
    return shape.max_stage_params(pp) * GRAD_BYTES / tp


@dataclass(frozen=True)
class Terms:
    """The pieces of one predicted step, in seconds."""

    compute: float
    tp_comm: float
    p2p: float
    pipeline: float
    bubble: float
    dp_allreduce: float
    fixed: float
    step: float

    def as_dict(self) -> dict:
        return asdict(self)


def dp_collectives(dp_shard: str, microbatches: int) -> float:
    """All-reduce equivalents the dp group runs per step. An all-reduce is a reduce-scatter and an
    all-gather. `full` sharding gathers a unit's parameters again for every micro-batch's forward
    and backward and reduce-scatters the gradients once: (2m + 1) halves of an all-reduce."""
    if dp_shard == "full":
        return (2 * microbatches + 1) / 2
    return 1.0


def _features(shape: ModelShape, cfgs: list[CandidateConfig]) -> dict[str, np.ndarray]:
    """Per-configuration quantities the coefficients multiply (vectorised for fitting)."""

    def col(fn):
        return np.array([fn(c) for c in cfgs], dtype=float)

    # The model-shape quantities depend on (tp, pp) only: computed once per pair (a 32-GPU space
    # has thousands of candidates over a few dozen pairs).
    per_split = {
        (tp, pp): (
            max(len(r) for r in stage_layer_ranges(shape.n_layers, pp)),
            stage_compute_fraction(shape, pp),
            rank_grad_bytes(shape, tp, pp),
        )
        for tp, pp in {(c.tp, c.pp) for c in cfgs}
    }
    return {
        "m": col(lambda c: c.microbatches),
        "pp": col(lambda c: c.pp),
        "tp": col(lambda c: c.tp),
        "dp": col(lambda c: c.dp),
        "mbs": col(lambda c: c.mbs),
        "layers": col(lambda c: per_split[c.tp, c.pp][0]),
        "f_pp": col(lambda c: per_split[c.tp, c.pp][1]),
        "grad": col(lambda c: per_split[c.tp, c.pp][2]),
        "k_dp": col(lambda c: dp_collectives(c.dp_shard, c.microbatches)),
        "opt_shard": col(lambda c: c.dp if c.dp_shard != "none" else 1),
        "rc_full": col(lambda c: c.recompute == "full"),
        "rc_sel": col(lambda c: c.recompute == "selective"),
    }


def _terms(p: dict[str, np.ndarray | float], x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    tp_on, pp_on, dp_on = (x["tp"] > 1), (x["pp"] > 1), (x["dp"] > 1)
    recompute = 1.0 + p["r_full"] * x["rc_full"] + p["r_sel"] * x["rc_sel"]
    compute = (p["a0"] + p["a1"] * x["mbs"] / x["tp"]) * x["f_pp"] * recompute
    tp_comm = tp_on * x["layers"] * (p["c0"] + p["c1"] * x["mbs"] * 2 * (x["tp"] - 1) / x["tp"])
    p2p = pp_on * (p["p0"] + p["p1"] * x["mbs"])
    per_mb = compute + tp_comm + p2p
    pipeline = x["m"] * per_mb
    bubble = p["z"] * (x["pp"] - 1) * per_mb
    dp_ar = dp_on * x["k_dp"] * (p["d0"] + p["d1"] * 2 * (x["dp"] - 1) / x["dp"] * x["grad"])
    fixed = p["o0"] + p["o1"] * x["grad"] / x["opt_shard"]
    g = p["gamma"]
    busy = pipeline + bubble
    overlapped = busy + dp_ar if g == 1.0 else (busy**g + dp_ar**g) ** (1.0 / g)
    return {
        "compute": compute,
        "tp_comm": tp_comm,
        "p2p": p2p,
        "pipeline": pipeline,
        "bubble": bubble,
        "dp_allreduce": dp_ar,
        "fixed": fixed,
        "step": overlapped + fixed,
    }


@dataclass(frozen=True)
class StepTimeModel:
    params: StepTimeParams
    shape: ModelShape
    # Which values of each parallel degree the fit saw; predictions elsewhere extrapolate.
    seen: dict[str, tuple[int, ...]] | None = None

    def terms(self, cfg: CandidateConfig) -> Terms:
        t = _terms(self.params.as_dict(), _features(self.shape, [cfg]))
        return Terms(**{k: float(v[0]) for k, v in t.items()})

    def step_times(self, cfgs: list[CandidateConfig]) -> np.ndarray:
        return _terms(self.params.as_dict(), _features(self.shape, cfgs))["step"]

    def step_time(self, cfg: CandidateConfig) -> float:
        return float(self.step_times([cfg])[0])

    def throughput(self, cfg: CandidateConfig) -> float:
        """Predicted samples per second."""
        return cfg.gbs / self.step_time(cfg)

    def extrapolates(self, cfg: CandidateConfig) -> bool:
        """True when the configuration uses a parallel degree no profile point had."""
        if self.seen is None:
            return False
        return any(getattr(cfg, d) not in self.seen[d] for d in ("dp", "tp", "pp"))

    def as_dict(self) -> dict:
        return {"params": self.params.as_dict(), "seen": {k: list(v) for k, v in (self.seen or {}).items()}}


def _free_coefficients(x: dict[str, np.ndarray], overlap: bool | None) -> list[str]:
    """The coefficients the points can tell: the overlap exponent when asked (by default when some
    point reduces over dp > 1 ranks: the engine overlaps that reduction with backward), a
    recomputation's cost only when some point recomputes; the others keep their defaults."""
    fixed = set()
    if not (overlap if overlap is not None else bool((x["dp"] > 1).any())):
        fixed.add("gamma")
    if not x["rc_full"].any():
        fixed.add("r_full")
    if not x["rc_sel"].any():
        fixed.add("r_sel")
    return [n for n in _NAMES if n not in fixed]


def fit_step_time_model(points: list[Measurement], shape: ModelShape, overlap: bool | None = None) -> StepTimeModel:
    """Bounded least squares on relative errors (soft-L1: a noisy point pulls less)."""
    if not points:
        raise ValueError("no profile points to fit")
    cfgs = [p.config for p in points]
    y = np.array([p.step_time_s for p in points], dtype=float)
    x = _features(shape, cfgs)
    free = _free_coefficients(x, overlap)
    defaults = StepTimeParams().as_dict()
    lo = np.array([_LOWER.get(n, 0.0) for n in free])
    hi = np.array([_UPPER.get(n, np.inf) for n in free])
    # Start from "all time is compute": a per-sample cost that explains the median point.
    per_sample = float(np.median(y / (x["m"] * x["mbs"] * x["f_pp"] / x["tp"] + 1e-12)))
    start = {n: defaults[n] if n.startswith("r_") else 0.0 for n in free}
    start.update({"a1": per_sample, "a0": 0.1 * per_sample, "z": 1.0, "o0": 0.01 * float(np.min(y))})
    if "gamma" in free:
        start["gamma"] = 1.5
    # Scales so the solver sees coefficients of order one.
    scale = np.array([_scale(n, per_sample, float(np.median(x["grad"])), float(np.median(y))) for n in free])

    def residuals(theta: np.ndarray) -> np.ndarray:
        p = {**defaults, **dict(zip(free, theta * scale))}
        return _terms(p, x)["step"] / y - 1.0

    x0 = np.clip(np.array([start[n] for n in free]) / scale, lo / scale, hi / scale)
    best = None
    for attempt in range(3):  # a few starts: the bubble/overlap terms make the problem non-convex
        guess = x0 if attempt == 0 else np.clip(x0 * (1 + 0.5 * attempt), lo / scale, hi / scale)
        sol = least_squares(
            residuals, guess, bounds=(lo / scale, hi / scale), loss="soft_l1", f_scale=0.05, max_nfev=2000
        )
        if best is None or sol.cost < best.cost:
            best = sol
    values = {**defaults, **dict(zip(free, best.x * scale))}
    seen = {d: tuple(sorted({getattr(c, d) for c in cfgs})) for d in ("dp", "tp", "pp")}
    return StepTimeModel(StepTimeParams(**values), shape, seen)


def _scale(name: str, per_sample: float, grad_bytes: float, step: float) -> float:
    if name in ("z", "gamma", "r_full", "r_sel"):
        return 1.0
    if name in ("d1", "o1"):
        return step / max(grad_bytes, 1.0)
    if name in ("a0", "a1", "c0", "c1", "p0", "p1"):
        return per_sample
    return step


@dataclass(frozen=True)
class ErrorReport:
    """Prediction error on held-out points: absolute percentage errors."""

    mape: float
    max_ape: float
    folds: int
    predicted: tuple[float, ...]  # held-out prediction for every point, in input order
    ape: tuple[float, ...]

    def as_dict(self) -> dict:
        return {"mape": self.mape, "max_ape": self.max_ape, "folds": self.folds}


def cross_validate(
    points: list[Measurement], shape: ModelShape, folds: int = 5, seed: int = 0, overlap: bool | None = None
) -> ErrorReport:
    """k-fold (leave-some-out) error: each point is predicted by a model fitted without it."""
    n = len(points)
    if n < 2:
        raise ValueError("cross-validation needs at least 2 profile points")
    k = min(folds, n)
    order = np.random.default_rng(seed).permutation(n)
    predicted = np.zeros(n)
    for fold in range(k):
        held = order[fold::k]
        train = [points[i] for i in range(n) if i not in set(held.tolist())]
        model = fit_step_time_model(train, shape, overlap)
        predicted[held] = model.step_times([points[i].config for i in held])
    measured = np.array([p.step_time_s for p in points])
    ape = np.abs(predicted - measured) / measured
    return ErrorReport(float(ape.mean()), float(ape.max()), k, tuple(predicted.tolist()), tuple(ape.tolist()))


# Two measurements of a point further apart than this (slower over faster, less 1) are resolved
# by a third: one of them is wrong, and which cannot be told from two.
MEASUREMENTS_DISAGREE = 0.20


def kept_step_time(medians: list[float]) -> float:
    """A profile point's step time from the medians of its measurements: one as it is; two, the
    slower unless they disagree by more than `MEASUREMENTS_DISAGREE`; three or more, their
    median. A point is measured again because it sits far off the model fitted without it, and
    runs pay more than profiles read, not less: 3-10% more on the emulated cluster however a
    step is timed (bench/profile_timing.py). Both disputes seen there had the run at or above the
    slower reading: 0.16 s then 0.30 s, runs 0.31 s (hence the median of three when two disagree
    by more than 20%); 0.083 s then 0.071 s, runs 0.089-0.098 s (docs/profile.md)."""
    if not medians:
        raise ValueError("a profile point needs a measurement")
    if len(medians) >= 3 or (len(medians) == 2 and measurements_disagree(medians)):
        return float(np.median(medians))
    return float(max(medians))


def measurements_disagree(medians: list[float]) -> bool:
    """Whether exactly two measurements of a point are too far apart to keep either (a third is due)."""
    return len(medians) == 2 and max(medians) / min(medians) - 1.0 > MEASUREMENTS_DISAGREE
