"""Audit a batch-size change: the statistical gain that actually happened, read off the loss curve.

Model. Let s be the samples seen and s0 the sample count at which the GBS changed from B1 to B2.
When progress per sample depends on the batch only through a statistical efficiency
(McCandlish et al. 2018, Pollux: dL/ds = −f(L)·SE(B)), the loss is one curve g of the
"effective samples" τ:

    L(s) = g(τ(s)),    τ(s) = s                  for s ≤ s0
                       τ(s) = s0 + ρ·(s − s0)    for s > s0,      ρ = SE(B2)/SE(B1).

At any loss level ℓ, dL/ds = g'(τ)·dτ/ds with g'(τ) a function of ℓ alone, so ρ is the progress
per sample after the change divided by the progress per sample before it *at matched loss*,
whatever the shape of g: the realized statistical-efficiency gain, comparable to the
controller's predicted SE(B2)/SE(B1).

Shape of g. With f(L) = k·(L − L∞)^p (progress slows as a power of the loss gap),
dL/dτ = −f(L) integrates to the power law (in the window's scaled units x = (τ − s0)/h)

    g(x) = a + b·(x − x_min + c)^(−α),      α = 1/(p − 1), c > 0

(the exponential, p = 1, is its α → ∞ limit), the usual form of language-model loss against data.
A quadratic or cubic g in τ was tried first and fails: over windows long enough to beat the
noise, a loss curve's changing curvature biased ρ by 20–70% on the synthetic curves of
tests/core/test_audit.py, where the power law is within 10% (also when f(L) mixes powers, which
the family does not contain exactly, and with a transient bump of 0.1 after the change).

Estimate. a, b enter linearly (variable projection: for given ρ, c, α a weighted linear
regression); ρ, c, α by bounded nonlinear least squares from a few starting ρ, log ρ in
[log 1/20, log 20]. Each window is weighted by 1/σ², σ² half the mean squared first difference
of its losses (insensitive to the trend; a larger batch's less noisy losses count more).
The window before the change reaches back to the previous change (or the run's start, or a
maximum); the window after runs to the next change (or the run's end), less a short settling
window right after the switch (optimiser state and learning rate adjust; after a switch to a
larger batch the loss catches up with the new batch's trajectory quickly, Wang et al. 2026).

What ρ includes: everything that changed with the GBS (the learning rate scaled with it too: that
is the gain an LR-aware goodput credits). A learning-rate schedule that decays inside the windows
is read as part of ρ; keep the windows between changes.

Confidence. Profile likelihood: RSS(ρ) minimised over c, α; with n_eff = n·(1 − r₁)/(1 + r₁)
effective points (r₁ the lag-1 autocorrelation of the residuals, which grows when the model
misfits), the 95% interval holds every ρ with n_eff·ln(RSS(ρ)/RSS(ρ̂)) ≤ χ²₁(0.95) = 3.84.

Pure numpy/scipy: no torch, no ray.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from copus.core.layout import CandidateConfig
from copus.core.reconfiguration import EfficiencyAudit, Reconfiguration

LOG_RHO = (math.log(1.0 / 20.0), math.log(20.0))
SHAPE_BOUNDS = ([-8.0, -3.0], [5.0, 3.0])  # log c (window spans), log α
CHI2_95 = 3.841458820694124  # χ²₁ quantile at 0.95


@dataclass(frozen=True)
class GainEstimate:
    """ρ̂ (None when the data cannot say), its 95% interval, the points used, and why or how."""

    rho: float | None
    interval: tuple[float, float] | None
    n_before: int
    n_after: int
    note: str


def _noise_var(loss: np.ndarray) -> float:
    """σ² per point from first differences: E(Δℓ)² = 2σ² + (trend step)², the trend's share
    negligible next to the noise of per-step losses."""
    d = np.diff(loss)
    return max(float(np.mean(d * d)) / 2.0, 1e-12)


class _Fit:
    """Weighted residuals of the joint power-law fit; (a, b) solved in closed form."""

    def __init__(self, s_b, l_b, s_a, l_a, s0: float):
        h = max(s0 - float(s_b.min()), 1.0)
        self.x_b, self.u_a = (s_b - s0) / h, (s_a - s0) / h
        self.x_min = float(self.x_b.min())
        self.y = np.concatenate([l_b, l_a])
        self.w = np.concatenate([np.full(len(l_b), 1.0 / _noise_var(l_b)), np.full(len(l_a), 1.0 / _noise_var(l_a))])

    def residuals(self, log_rho: float, log_c: float, log_alpha: float) -> np.ndarray:
        x = np.concatenate([self.x_b, math.exp(log_rho) * self.u_a]) - self.x_min + math.exp(log_c)
        z = x ** -math.exp(log_alpha)
        w, y = self.w, self.y
        zm, ym = (w @ z) / w.sum(), (w @ y) / w.sum()
        dz = z - zm
        szz = float(w @ (dz * dz))
        b = float(w @ (dz * (y - ym))) / szz if szz > 1e-300 else 0.0
        return np.sqrt(w) * (y - ym - b * dz)

    def rss(self, log_rho: float, shape=(0.0, 0.0)) -> tuple[float, np.ndarray]:
        """Profile: min over (log c, log α) of the RSS at this ρ, from `shape`."""
        from scipy.optimize import least_squares  # here: its import is ~0.5 s of every controller and CLI start

        r = least_squares(lambda p: self.residuals(log_rho, *p), np.clip(shape, *SHAPE_BOUNDS), bounds=SHAPE_BOUNDS)
        return 2.0 * float(r.cost), r.x


def _joint(fit: _Fit) -> np.ndarray:
    """(log ρ̂, log c, log α): the best of bounded least squares from a few starting ρ."""
    from scipy.optimize import least_squares

    lower, upper = [LOG_RHO[0], *SHAPE_BOUNDS[0]], [LOG_RHO[1], *SHAPE_BOUNDS[1]]
    best = None
    for start in (math.log(0.25), 0.0, math.log(4.0)):
        r = least_squares(lambda p: fit.residuals(*p), [start, 0.0, 0.0], bounds=(lower, upper))
        if best is None or r.cost < best.cost:
            best = r
    return best.x


def _interval(fit: _Fit, theta: np.ndarray) -> tuple[float, float]:
    """Profile-likelihood 95% interval of ρ, clipped to [1/20, 20] (see the module docstring)."""
    from scipy.optimize import brentq

    r = fit.residuals(*theta)
    rss0 = max(float(r @ r), 1e-300)
    r1 = float(np.corrcoef(r[:-1], r[1:])[0, 1]) if len(r) > 3 else 0.0
    r1 = min(max(r1, 0.0), 0.95) if math.isfinite(r1) else 0.0
    n_eff = len(r) * (1.0 - r1) / (1.0 + r1)

    def excess(log_rho: float) -> float:
        return n_eff * math.log(max(fit.rss(log_rho, theta[1:])[0], rss0) / rss0) - CHI2_95

    ends = [bound if excess(bound) <= 0 else brentq(excess, *sorted((theta[0], bound)), xtol=1e-3) for bound in LOG_RHO]
    return math.exp(ends[0]), math.exp(ends[1])


def finite_curve(samples, loss) -> tuple[np.ndarray, np.ndarray]:
    """(samples, loss) as float arrays in order of samples, non-finite points dropped."""
    s, l = np.asarray(samples, dtype=float), np.asarray(loss, dtype=float)
    keep = np.isfinite(s) & np.isfinite(l)
    order = np.argsort(s[keep], kind="stable")
    return s[keep][order], l[keep][order]


def realized_gain(
    samples,
    loss,
    switch_at: float,
    *,
    start: float | None = None,
    end: float | None = None,
    settle_steps: int = 5,
    settle_before: int = 0,
    max_before_samples: float | None = None,
    min_before: int = 10,
    min_after: int = 10,
) -> GainEstimate:
    """ρ̂ = (progress per sample after the change)/(before), at matched loss (module docstring).

    `samples`, `loss`: the run's per-step train loss against samples seen (noisy, any order;
    non-finite points dropped). `switch_at`: samples seen when the GBS changed. The window before
    is (max(start, switch_at − max_before_samples), switch_at] (start: the previous change, or
    the run's first point) less its first `settle_before` points (the previous change's settling);
    the window after is (switch_at, end] (end: the next change, or the run's end) less its first
    `settle_steps` points. ρ is None, with the reason, when either window has too few points or
    the fit runs to the search bound [1/20, 20].
    """
    s, l = finite_curve(samples, loss)
    lo = -math.inf if start is None else float(start)
    if max_before_samples is not None:
        lo = max(lo, switch_at - float(max_before_samples))
    before = np.flatnonzero((s > lo) & (s <= switch_at))[settle_before:]
    after = np.flatnonzero((s > switch_at) & (s <= (math.inf if end is None else float(end))))[settle_steps:]
    n_b, n_a = len(before), len(after)
    if n_a < min_after:
        return GainEstimate(
            None,
            None,
            n_b,
            n_a,
            f"too few points after the change ({n_a} < {min_after} after skipping {settle_steps} settling steps)",
        )
    if n_b < min_before:
        return GainEstimate(None, None, n_b, n_a, f"too few points before the change ({n_b} < {min_before})")
    fit = _Fit(s[before], l[before], s[after], l[after], float(switch_at))
    theta = _joint(fit)
    if min(abs(theta[0] - b) for b in LOG_RHO) < 1e-3:
        return GainEstimate(
            None,
            None,
            n_b,
            n_a,
            f"the fit ran to the search bound (ρ = {math.exp(theta[0]):.3g}): "
            "the loss curve does not follow the model here",
        )
    lo_rho, hi_rho = _interval(fit, theta)
    note = f"power-law fit of loss against effective samples, {n_b} points before, {n_a} after"
    return GainEstimate(math.exp(theta[0]), (lo_rho, hi_rho), n_b, n_a, note)


def step_curve(records: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(samples, train loss) of the step records, one per step: a step redone after a worker
    failure or a resume keeps its last record (the attempt the run went on from)."""
    by_step = {}
    for r in records:
        if r.get("kind", "step") == "step" and r.get("train_loss") is not None and r.get("samples") is not None:
            by_step[r["step"]] = (float(r["samples"]), float(r["train_loss"]))
    points = [by_step[k] for k in sorted(by_step)]
    return np.array([p[0] for p in points], dtype=float), np.array([p[1] for p in points], dtype=float)


def _predicted(change: Reconfiguration, records: list[dict]) -> float | None:
    """The controller's SE(new)/SE(old) for this change: its order's, else its reconfigure record's."""
    value = change.order.predicted_efficiency_gain if change.order is not None else None
    if value is None:
        value = next(
            (
                r.get("predicted_efficiency_gain")
                for r in records
                if r.get("kind") == "reconfigure" and r.get("step") == change.step and _same(r.get("to"), change.to)
            ),
            None,
        )
    return float(value) if value is not None and math.isfinite(value) else None


def _same(written: dict | None, config: CandidateConfig) -> bool:
    """A record's configuration (as written, maybe by an older version without every field) is `config`."""
    try:
        return CandidateConfig.from_dict(written) == config
    except (KeyError, TypeError):
        return False


def audit_reconfigurations(
    changes: list[Reconfiguration], records: list[dict], *, run_start_samples: float = 0.0, settle_steps: int = 5
) -> list[Reconfiguration]:
    """Each reconfiguration with its audit (`EfficiencyAudit`): `predicted_efficiency_gain` (the
    controller's SE(to.gbs)/SE(from.gbs), None when the order did not carry it),
    `realized_efficiency_gain` (ρ̂ of `realized_gain` for a change of GBS, its window before
    bounded by the previous change of GBS (less its settling steps) or `run_start_samples` (e.g.
    the end of the LR warm-up), after by the next one or the run's end, less `settle_steps` right
    after the change), `realized_efficiency_interval` ([low, high], 95%), `audit_points`
    ({before, after}) and `audit_note` (how, or why not). `records`: the run's records (kind
    "step" with samples and train_loss; "reconfigure" ones may carry predicted_efficiency_gain).
    The input changes are left unchanged.
    """
    samples, loss = step_curve(records)
    switches = sorted(float(c.samples) for c in changes if c.changes_gbs and c.samples is not None)
    out = []
    for change in changes:
        predicted = _predicted(change, records)
        if not change.changes_gbs or change.samples is None:
            note = "no change of GBS: nothing to audit"
            out.append(change.audited(EfficiencyAudit(predicted_efficiency_gain=predicted, audit_note=note)))
            continue
        at = float(change.samples)
        previous = max([s for s in switches if s < at], default=None)
        start = run_start_samples if previous is None else max(previous, run_start_samples)
        end = min([s for s in switches if s > at], default=None)
        est = realized_gain(
            samples,
            loss,
            at,
            start=start,
            end=end,
            settle_steps=settle_steps,
            settle_before=settle_steps if previous is not None and previous >= start else 0,
        )
        audit = EfficiencyAudit(
            predicted_efficiency_gain=predicted,
            realized_efficiency_gain=est.rho,
            realized_efficiency_interval=list(est.interval) if est.interval else None,
            audit_points={"before": est.n_before, "after": est.n_after},
            audit_note=est.note,
        )
        out.append(change.audited(audit))
    return out
