"""What fewer seeds would have given: a calibration's continuations refitted on every subset of
k of its seeds (`bench/calibration_seeds.py`).

A subset keeps each of its seeds' points at every GBS and branch point together, as a k-seed
calibration would have measured them (seed k reads the same data at every GBS). Each subset's
B_crit is set against the fit of all the seeds: the spread of that ratio is what a k-seed
calibration of the workload would read, and the share of subset intervals that hold the
all-seed value is a check of those intervals. The subsets share seeds with the whole, so both
flatter k-seed calibrations somewhat; the less so the smaller k is against the seeds measured.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from copus.core.calibration import BOOTSTRAP, Sweep, fit_branches, grid_points, samples_by_gbs

# B_crit within this factor of the all-seed fit: as close as a planner needs it (at B0 = 16 and
# B_crit near 50, x1.5 moves the efficiency of GBS 64 by about 0.1).
CLOSE_FACTOR = 1.5


def _sweeps(data: dict, seeds: set[int] | None) -> list[Sweep]:
    points = grid_points(data["points"])
    return [
        Sweep(b["val_loss"], data["decrement"], b["samples_seen"], samples_by_gbs(points, i, seeds))
        for i, b in enumerate(data["branch_points"])
    ]


def seed_subsets(data: dict, k: int, limit: int = 200, draws: int = BOOTSTRAP, seed: int = 0) -> list[dict]:
    """Per branch point: the all-seed B_crit and, over the subsets of k seeds (every one, or
    `limit` of them drawn at random), the ratio of theirs to it (10th, 50th, 90th percentile),
    the share within CLOSE_FACTOR of it, the share of their 95% intervals that hold it, and
    their intervals' median width (high / low)."""
    seeds = sorted({p["seed"] for p in grid_points(data["points"])})
    if not 1 <= k <= len(seeds):
        raise ValueError(f"seeds: need 1 to {len(seeds)} (the calibration's), got {k}")
    subsets = list(itertools.combinations(seeds, k))
    rng = np.random.default_rng(seed)
    if len(subsets) > limit:
        subsets = [subsets[i] for i in sorted(rng.choice(len(subsets), limit, replace=False))]
    whole = fit_branches(_sweeps(data, None), data["reference_gbs"], seed, draws)
    fits = [fit_branches(_sweeps(data, set(s)), data["reference_gbs"], seed, draws) for s in subsets]
    return [_branch_row(i, whole[i], [f[i] for f in fits], k) for i in range(len(whole))]


def _branch_row(i: int, whole, subs: list, k: int) -> dict:
    truth = whole.b_crit
    ratio = np.array([f.b_crit / truth for f in subs])
    covers = [f.b_crit_low <= truth <= f.b_crit_high for f in subs]
    width = [f.b_crit_high / f.b_crit_low for f in subs if f.b_crit_low > 0]
    q10, q50, q90 = np.quantile(ratio, [0.1, 0.5, 0.9])
    return {
        "branch": i,
        "val_loss": whole.val_loss,
        "b_crit": truth,
        "b_crit_low": whole.b_crit_low,
        "b_crit_high": whole.b_crit_high,
        "seeds": k,
        "subsets": len(subs),
        "ratio_q10": float(q10),
        "ratio_median": float(q50),
        "ratio_q90": float(q90),
        "within_close_factor": float(np.mean((ratio <= CLOSE_FACTOR) & (ratio >= 1 / CLOSE_FACTOR))),
        "interval_covers": float(np.mean(covers)),
        "interval_width_median": float(np.median(width)) if width else math.inf,
    }
