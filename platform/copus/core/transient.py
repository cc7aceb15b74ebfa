"""The switch's transient, measured on its own from a calibration's continuation curves.

A continuation starts at GBS B from the reference run's weights *and optimiser state*, with the
learning rate the rule gives B: for B != B0 it is a switch. For some steps afterwards Adam's
second moments still reflect B0's gradient noise (their memory is 1/(1 - beta2) steps, 20 at
beta2 = 0.95) and the learning rate has just jumped; a continuation of 10-30 steps (GBS 64-256
here) lies largely inside that transient, so E(B) measures "the next decrement right after a
switch to B", not B's steady rate.

Each continuation's validation curve is read at two targets: half the decrement (E_first) and
the whole (E); E_late = E - E_first is the second half, further from the switch. Per GBS, the
share of the samples the first half took, E_first / E, is compared with B0's, where nothing
switched (the loss curve's own shape sets B0's share: a concave curve's first half is quicker).
`share_gap` = share(B) - share(B0), with a Welch interval over the seeds (a share is bounded, so a
noisy half does not give the heavy tails a ratio of halves would): above 0 when the switch slows
B's first half. `transient_samples` = mean of E_first(B) - E_late(B) · share0 / (1 - share0), the
samples the first half took beyond B0's proportion: what one switch to B costs. And B_crit is
fitted on each half on its own (`copus.core.calibration.fit_branches`): a late-half B_crit above
the first half's, by more than the growth of B_crit over half a decrement, is the transient seen
in the critical batch.

The halves also differ in loss (the late half is half a decrement further on, where B_crit is
larger): `growth_expected` is what that alone gives, log B_crit's slope in the loss between the
calibration's branch points (joint fit) over half a decrement.

Pure: numpy and scipy, no torch, no ray.
"""

from __future__ import annotations

import math

import numpy as np

from copus.core.calibration import (
    INTERVAL,
    Sweep,
    crossing_unresolved,
    fit_branches,
    is_grid_point,
    smoothed_crossing,
)


def halves(point: dict, decrement: float) -> tuple[float, float]:
    """(samples to the first half of the decrement, samples of the second half) of one
    continuation, read off its validation curve like the whole decrement
    (`smoothed_crossing`); NaN for both where the continuation kept no curve, was not measured,
    or its half crossing lies within its first evaluation."""
    samples, losses = point.get("curve_samples") or [], point.get("curve_val_loss") or []
    whole = point.get("samples")
    if len(samples) < 2 or whole is None or not math.isfinite(whole):
        return float("nan"), float("nan")
    first = smoothed_crossing(samples, losses, losses[0] - decrement / 2, decrement / 3)
    if not math.isfinite(first) or crossing_unresolved(samples, first) or not 0 < first < whole:
        return float("nan"), float("nan")
    return first, whole - first


def _by_seed(points: list[dict], branch: int, decrement: float) -> dict[int, dict[int, tuple[float, float]]]:
    """{gbs: {seed: (E_first, E_late)}} of a branch point's grid continuations."""
    out: dict[int, dict[int, tuple[float, float]]] = {}
    for p in points:
        if p["branch"] == branch and is_grid_point(p):
            out.setdefault(p["gbs"], {})[p["seed"]] = halves(p, decrement)
    return out


def _shares(at: dict[int, tuple[float, float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first-half share of the decrement's samples, E_first, E_late) of the seeds that measured both halves."""
    got = np.array([v for v in at.values() if all(math.isfinite(x) for x in v)], dtype=float).reshape(-1, 2)
    return got[:, 0] / got.sum(axis=1), got[:, 0], got[:, 1]


def _welch(a: np.ndarray, b: np.ndarray) -> tuple[float | None, float | None]:
    """95% Welch interval of mean(a) - mean(b); None where either has fewer than 2 values."""
    if len(a) < 2 or len(b) < 2:
        return None, None
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return float(a.mean() - b.mean()), float(a.mean() - b.mean())
    from scipy import stats  # here: its import is ~0.7 s of every controller and CLI start

    dof = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = stats.t.ppf(0.5 + INTERVAL / 2, dof) * se
    return float(a.mean() - b.mean() - half), float(a.mean() - b.mean() + half)


def _share_row(gbs: int, at_b: dict[int, tuple[float, float]], at_b0: dict[int, tuple[float, float]]) -> dict:
    """One GBS against B0: the share of the decrement's samples its first half took, the gap to
    B0's share (a Welch interval: the seeds' halves are not paired in any useful way), and the
    samples the first half took beyond B0's proportion."""
    share, first, late = _shares(at_b)
    share0, _, _ = _shares(at_b0)
    row = {"gbs": gbs, "seeds": len(share), "seeds_b0": len(share0), "first_half_share": None}
    row |= {"first_half_share_b0": None, "share_gap": None, "share_gap_low": None, "share_gap_high": None}
    row |= {"transient_samples": None, "transient_share": None}
    if len(share):
        row["first_half_share"] = float(share.mean())
    if not len(share) or not len(share0):
        return row
    ratio0 = share0.mean() / (1 - share0.mean())  # first over late half at B0, where nothing switched
    excess = float(np.mean(first - late * ratio0))
    row |= {"first_half_share_b0": float(share0.mean()), "share_gap": float(share.mean() - share0.mean())}
    row |= {"transient_samples": excess, "transient_share": excess / float(np.mean(first + late))}
    row["share_gap_low"], row["share_gap_high"] = _welch(share, share0)
    return row


def _half_fits(
    table: dict[int, dict[int, tuple[float, float]]], start: tuple[float, int], decrement: float, b0: float, which: int
) -> dict:
    """B_crit of one half (0: first, 1: late) of a branch point's continuations, with its 95% interval."""
    val_loss, seen = start
    n = 1 + max((k for seeds in table.values() for k in seeds), default=-1)  # row k is seed k at every GBS
    nan = (float("nan"), float("nan"))
    by_gbs = {g: [seeds.get(k, nan)[which] for k in range(n)] for g, seeds in sorted(table.items())}
    name = ("first", "late")[which]
    try:
        fit = fit_branches([Sweep(val_loss - which * decrement / 2, decrement / 2, seen, by_gbs)], b0)[0]
    except ValueError:  # fewer than 2 batch sizes measured this half
        return {f"b_crit_{name}": None, f"b_crit_{name}_low": None, f"b_crit_{name}_high": None}
    return {f"b_crit_{name}": fit.b_crit, f"b_crit_{name}_low": fit.b_crit_low, f"b_crit_{name}_high": fit.b_crit_high}


def _growth_over_half(branch_points: list[dict], decrement: float) -> list[float | None]:
    """Per branch point: the factor by which B_crit grows over half a decrement of loss, from
    the slope of log B_crit (joint fit) in the loss to the nearest branch points."""
    xs = [(b["val_loss"], b["b_crit"]) for b in branch_points]
    out: list[float | None] = []
    for i, (loss, b_crit) in enumerate(xs):
        slopes = [
            (math.log(b_crit) - math.log(other)) / (other_loss - loss)
            for j, (other_loss, other) in enumerate(xs)
            if abs(j - i) == 1 and other_loss != loss and _positive(b_crit) and _positive(other)
        ]
        out.append(math.exp(float(np.mean(slopes)) * decrement / 2) if slopes else None)
    return out


def _positive(value) -> bool:
    return value is not None and math.isfinite(value) and value > 0


def transient_table(points: list[dict], branch_points: list[dict], b0: int, decrement: float) -> list[dict] | None:
    """What the continuations' curves say of the switch's transient, per branch point (see the
    module's doc): `rows` (per GBS but B0: `first_half_share`, `first_half_share_b0`,
    `share_gap` and its interval, `transient_samples`, `transient_share` of E(B), `seeds`,
    `seeds_b0`), `b_crit_first` and `b_crit_late` with their intervals, and `growth_expected`.
    None when no continuation kept a curve (points taken over from a file)."""
    if not any(p.get("curve_samples") for p in points):
        return None
    growth = _growth_over_half(branch_points, decrement)
    out = []
    for i, branch in enumerate(branch_points):
        table = _by_seed(points, i, decrement)
        rows = [_share_row(g, table[g], table.get(b0, {})) for g in sorted(table) if g != b0]
        start = (branch["val_loss"], branch["samples_seen"])
        entry = {"branch": i, "val_loss": branch["val_loss"], "rows": rows, "growth_expected": growth[i]}
        for which in (0, 1):
            entry |= _half_fits(table, start, decrement, b0, which)
        out.append(entry)
    return out
