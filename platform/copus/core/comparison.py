"""Time-to-target comparison of policies: per-policy statistics over repeats and COPUS's
speedup over the fastest baseline. Pure: no torch, no ray.

speedup_vs_fastest_baseline = (fastest baseline's mean time to target) / (copus's mean) − 1,
over the baselines (every policy but copus) that reached the target in every repeat; None
when copus missed the target in any repeat or no baseline made it. With repeats, the paired
per-repeat speedups (repeat r of every policy shares its seed) give the spread:
`speedup_per_repeat` against the fastest baseline of each repeat, and
`paired_speedup_per_repeat` against the fastest baseline by mean (t_baseline,r / t_copus,r − 1),
whose mean `paired_speedup_mean` comes with a 95% Student-t interval `paired_speedup_ci95`
(null with fewer than 2 repeats).

The ablation `copus-gbs` (GBS by goodput, layout and MBS fixed) is not a baseline: it gets the
same fields against the same baselines, and copus gets `vs_copus_gbs` (its paired speedup
over the ablation: the gain of co-adapting the layout and MBS).
"""

from __future__ import annotations

import math
import random
import statistics

from scipy import stats as scipy_stats

from copus.core.policy_names import ADAPTIVE


def run_order(policies: list[str], repeat: int, seed: int, shuffled: bool) -> list[str]:
    """The order the policies run in within one repeat: as listed, or a permutation drawn from
    (seed, repeat), so that no policy always runs first (identical runs differed by -3% to +11%
    between positions on these machines) and the order can be reproduced from what was recorded."""
    if not shuffled:
        return list(policies)
    rng = random.Random(f"copus-run-order:{seed}:{repeat}")
    return rng.sample(list(policies), len(policies))


def _stats(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def summarize(runs: list[dict], policies: list[str]) -> dict:
    """runs: one dict per run with policy, repeat, time_to_target_s (None if not reached),
    reached_target, final_val_loss, samples, reconfigurations (a count)."""
    out: dict = {}
    for policy in policies:
        mine = [r for r in runs if r["policy"] == policy]
        reached = [r for r in mine if r["reached_target"]]
        all_reached = bool(mine) and len(reached) == len(mine)
        ttt_mean, ttt_std = _stats([r["time_to_target_s"] for r in reached]) if all_reached else (None, None)
        loss_mean, loss_std = _stats([r["final_val_loss"] for r in mine])
        out[policy] = {
            "runs": len(mine),
            "reached": len(reached),
            "reached_target": all_reached,
            "time_to_target_s": ttt_mean,
            "time_to_target_std_s": ttt_std,
            "time_to_target_runs_s": [r["time_to_target_s"] for r in mine],
            "final_val_loss": loss_mean,
            "final_val_loss_std": loss_std,
            "samples": _stats([r["samples"] for r in mine])[0],
            "reconfigurations": _stats([r["reconfigurations"] for r in mine])[0],
        }
    baselines = [p for p in policies if p not in ADAPTIVE]
    for policy in (p for p in ADAPTIVE if p in out):
        out[policy].update(_speedup(runs, out, baselines, policy))
    if "copus" in out and "copus-gbs" in out:
        out["copus"]["vs_copus_gbs"] = paired_against(runs, "copus-gbs")
    return out


def _speedup(runs: list[dict], stats: dict, baselines: list[str], ours: str = "copus") -> dict:
    done = [p for p in baselines if stats[p]["reached_target"]]
    if not stats[ours]["reached_target"] or not done:
        return {"speedup_vs_fastest_baseline": None, "fastest_baseline": None, "speedup_std": None}
    fastest = min(done, key=lambda p: stats[p]["time_to_target_s"])
    paired = []
    for repeat in sorted({r["repeat"] for r in runs}):
        mine = [r["time_to_target_s"] for r in runs if r["policy"] == ours and r["repeat"] == repeat]
        theirs = [r["time_to_target_s"] for r in runs if r["policy"] in done and r["repeat"] == repeat]
        if mine and theirs:
            paired.append(min(theirs) / mine[0] - 1)
    return {
        "speedup_vs_fastest_baseline": stats[fastest]["time_to_target_s"] / stats[ours]["time_to_target_s"] - 1,
        "fastest_baseline": fastest,
        "speedup_std": _stats(paired)[1],
        "speedup_per_repeat": paired,
        **paired_against(runs, fastest, ours),
    }


def mean_ci95(values: list[float]) -> tuple[float | None, list[float] | None]:
    """Mean and 95% Student-t interval of the mean (None with fewer than 2 values)."""
    if not values:
        return None, None
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    half = scipy_stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, [float(mean - half), float(mean + half)]


def paired_against(runs: list[dict], baseline: str, ours: str = "copus") -> dict:
    """`ours` against one baseline, repeat by repeat (same seed): t_baseline / t_ours − 1."""
    by = {(r["policy"], r["repeat"]): r["time_to_target_s"] for r in runs}
    paired = [
        by[(baseline, k)] / by[(ours, k)] - 1
        for k in sorted({r["repeat"] for r in runs})
        if by.get((ours, k)) and by.get((baseline, k))
    ]
    mean, ci = mean_ci95(paired)
    return {"paired_speedup_per_repeat": paired, "paired_speedup_mean": mean, "paired_speedup_ci95": ci}
