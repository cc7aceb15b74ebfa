"""Time-to-target comparison of policies: per-policy statistics over repeats and COPUS's
speedup over the fastest baseline. Pure: no torch, no ray.

speedup_vs_fastest_baseline = (fastest baseline's mean time to target) / (copus's mean) − 1,
over the baselines (every policy but copus) that reached the target in every repeat; None
when copus missed the target in any repeat or no baseline made it. With repeats, the paired
per-repeat speedups (repeat r of every policy shares its seed) give the spread.
"""

from __future__ import annotations

import statistics


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
            "runs": len(mine), "reached": len(reached), "reached_target": all_reached,
            "time_to_target_s": ttt_mean, "time_to_target_std_s": ttt_std,
            "time_to_target_runs_s": [r["time_to_target_s"] for r in mine],
            "final_val_loss": loss_mean, "final_val_loss_std": loss_std,
            "samples": _stats([r["samples"] for r in mine])[0],
            "reconfigurations": _stats([r["reconfigurations"] for r in mine])[0],
        }
    if "copus" in out:
        out["copus"].update(_speedup(runs, out, [p for p in policies if p != "copus"]))
    return out


def _speedup(runs: list[dict], stats: dict, baselines: list[str]) -> dict:
    done = [p for p in baselines if stats[p]["reached_target"]]
    if not stats["copus"]["reached_target"] or not done:
        return {"speedup_vs_fastest_baseline": None, "fastest_baseline": None, "speedup_std": None}
    fastest = min(done, key=lambda p: stats[p]["time_to_target_s"])
    paired = []
    for repeat in sorted({r["repeat"] for r in runs}):
        ours = [r["time_to_target_s"] for r in runs if r["policy"] == "copus" and r["repeat"] == repeat]
        theirs = [r["time_to_target_s"] for r in runs if r["policy"] in done and r["repeat"] == repeat]
        if ours and theirs:
            paired.append(min(theirs) / ours[0] - 1)
    return {"speedup_vs_fastest_baseline": stats[fastest]["time_to_target_s"] / stats["copus"]["time_to_target_s"] - 1,
            "fastest_baseline": fastest, "speedup_std": _stats(paired)[1], "speedup_per_repeat": paired}
