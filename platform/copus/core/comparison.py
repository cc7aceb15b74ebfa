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

Paired log-ratios. Every policy gets `per_seed` (time and samples to target per evaluation seed)
and its mean log time to target; copus and copus-gbs get `paired_log_ratio` against each
baseline (log(t_baseline / t_ours) per repeat, mean, 95% Student-t interval, implied speedup
exp − 1) and `vs_best_baseline`, that against `best_baseline` (the baseline of lowest mean log
time to target among those that reached it in every repeat). Tuned baselines (`tuned-static`,
`tuned-ramp`, `copus.core.tuning`) are baselines like any other. How misses enter:
`paired_log_ratio`.

Counterfactual audit. A copus-family run and the static run of its repeat share seed, data order
and starting GBS (batch.gbs; with static_layout: best the layout too), so until copus first
changes its GBS they are the same run up to layout numerics, and after it static is what copus would have
done at the old GBS: the counterfactual of that change (`copus.core.counterfactual`).
`counterfactual_audit` holds the change's predicted statistical-efficiency gain against the one
realized at matched loss, beside the one-run estimate of the run's own audit.
"""

from __future__ import annotations

import math
import random
import statistics
from typing import Callable

import numpy as np
from scipy import stats as scipy_stats

from copus.core.audit import step_curve
from copus.core.counterfactual import CounterfactualGain, counterfactual_gain
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


def _range(values: list) -> list | None:
    """[least, most] of a count over the runs, None without runs."""
    return [min(values), max(values)] if values else None


def summarize(runs: list[dict], policies: list[str], adaptive: tuple[str, ...] = ADAPTIVE) -> dict:
    """runs: one dict per run with policy, repeat, time_to_target_s (None if not reached),
    reached_target, final_val_loss, samples, reconfigurations (a count). `adaptive`: the entries
    of COPUS (its policies, and a suite's variants of them); every other entry is a baseline."""
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
            "reconfigurations_range": _range([r["reconfigurations"] for r in mine]),
            "reversed_switches": sum(int(r.get("reversed_switches") or 0) for r in mine),
            "per_seed": seed_rows(mine),
            **mean_log_time(mine),
        }
    baselines = [p for p in policies if p not in adaptive]
    best = best_baseline(out, baselines)
    for policy in (p for p in adaptive if p in out):
        out[policy].update(_speedup(runs, out, baselines, policy))
        out[policy]["paired_log_ratio"] = {b: paired_log_ratio(runs, b, policy) for b in baselines}
        out[policy]["vs_best_baseline"] = out[policy]["paired_log_ratio"][best] if best else None
    if "copus" in out and "copus-gbs" in out:
        out["copus"]["vs_copus_gbs"] = paired_against(runs, "copus-gbs")
    for variant in (p for p in adaptive if p in out and p not in ADAPTIVE and "copus" in out):
        out[variant]["vs_copus"] = paired_log_ratio(runs, "copus", variant)
        if best is not None:
            out[variant]["share_of_copus_gain"] = gain_share(runs, variant, "copus", best)
    return out


def gain_share(runs: list[dict], ours: str, reference: str, baseline: str, draws: int = 4000, seed: int = 0) -> dict:
    """How much of `reference`'s gain over `baseline` `ours` reaches, seed by seed: the ratio of
    the mean paired log-ratios, mean log(t_baseline/t_ours) / mean log(t_baseline/t_reference),
    over the repeats all three reached the target, with a 95% interval from resampling those
    repeats (the three runs of a repeat stay together). None when the reference gained nothing.

    The interval is read from every draw (`share_bounds`), those in which the reference gained
    nothing (`draws_without_reference_gain`, their fraction) included: they have no finite share,
    and when they reach a bound's quantile that bound is null and `ci95_note` says why
    ("unbounded above: copus gained nothing over static in 9% of draws")."""
    times = {(r["policy"], r["repeat"]): r["time_to_target_s"] for r in runs if r["reached_target"]}
    repeats = sorted(k for (p, k) in times if p == baseline and (ours, k) in times and (reference, k) in times)
    base = np.array([math.log(times[(baseline, k)]) for k in repeats])
    gain_ours = base - np.array([math.log(times[(ours, k)]) for k in repeats])
    gain_ref = base - np.array([math.log(times[(reference, k)]) for k in repeats])
    out = {
        "reference": reference,
        "baseline": baseline,
        "n_pairs": len(repeats),
        "share": None,
        "ci95": None,
        "draws": 0,
        "draws_without_reference_gain": None,
        "ci95_note": None,
    }
    if len(repeats) < 2:
        return {**out, "ci95_note": "no interval: fewer than 2 seeds that all three reached the target"}
    if gain_ref.mean() <= 0:
        return {**out, "ci95_note": f"no share: {reference} gained nothing over {baseline} on these seeds"}
    pick = np.random.default_rng(seed).integers(0, len(repeats), size=(draws, len(repeats)))
    ours_means, ref_means = gain_ours[pick].mean(axis=1), gain_ref[pick].mean(axis=1)
    low, high = share_bounds(ours_means, ref_means)
    without_gain = float(np.mean(ref_means <= 0))
    return {
        **out,
        "share": float(gain_ours.mean() / gain_ref.mean()),
        "ci95": [low, high],
        "draws": draws,
        "draws_without_reference_gain": without_gain,
        "ci95_note": unbounded_note(low, high, without_gain, reference, baseline),
    }


def share_bounds(ours_means: np.ndarray, ref_means: np.ndarray) -> tuple[float | None, float | None]:
    """The share's 95% bootstrap interval from each draw's mean gains, every draw kept; a bound
    is None where it does not exist. A draw in which the reference gained nothing (mean <= 0) has
    no finite share. Where `ours` gained in it, "ours reaches at least X of the reference's gain"
    (ours >= X * reference) holds for every X >= 0 and "at most X" for none: it sits above every
    share (+inf). Where neither gained, the inequalities turn over and the draw supports no bound:
    it counts against both (-inf for the lower, +inf for the upper). (The raw ratio would put a
    draw where ours gained and the reference lost below every positive share.)"""
    gained = ref_means > 0
    shares = ours_means / np.where(gained, ref_means, 1.0)
    for_lower = np.where(gained, shares, np.where(ours_means > 0, np.inf, -np.inf))
    for_upper = np.where(gained, shares, np.inf)
    return draw_quantile(for_lower, 0.025), draw_quantile(for_upper, 0.975)


def draw_quantile(draws: np.ndarray, q: float) -> float | None:
    """The q-quantile of the draws (numpy's default, linear between order statistics); None when
    it falls on an infinite draw: that bound does not exist."""
    ordered = np.sort(draws)
    position = (len(ordered) - 1) * q
    below, frac = int(math.floor(position)), position - math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    neighbours = [ordered[below]] + ([ordered[above]] if frac > 0 else [])
    if not all(np.isfinite(neighbours)):
        return None
    return float(ordered[below] + (ordered[above] - ordered[below]) * frac)


def unbounded_note(
    low: float | None, high: float | None, without_gain: float, reference: str, baseline: str
) -> str | None:
    """Why a share's interval lacks a bound (None when it has both)."""
    sides = [side for side, bound in (("below", low), ("above", high)) if bound is None]
    if not sides:
        return None
    return f"unbounded {' and '.join(sides)}: {reference} gained nothing over {baseline} in {without_gain:.0%} of draws"


def share_interval_text(share: dict) -> str:
    """A share's 95% interval in the words the CLI table and bench/pool_suites.py both print, with
    the reason where it has no bound on a side."""
    ci, note = share.get("ci95"), share.get("ci95_note")
    if ci is None:
        return note or "no interval"
    low, high = ci
    if low is not None and high is not None:
        return f"95% interval {low:.0%} to {high:.0%}"
    if low is not None:
        return f"95% interval from {low:.0%}, {note}"
    if high is not None:
        return f"95% interval up to {high:.0%}, {note}"
    return f"no 95% interval, {note}"


def seed_rows(runs: list[dict]) -> list[dict]:
    """One policy's runs, repeat by repeat: the evaluation seed, and time and samples to target
    (None where the target was missed)."""
    return [
        {
            "repeat": r["repeat"],
            "seed": r.get("seed"),
            "reached_target": r["reached_target"],
            "time_to_target_s": r["time_to_target_s"],
            "time_to_target_without_eval_s": r.get("time_to_target_without_eval_s"),
            "samples_to_target": r["samples"] if r["reached_target"] else None,
        }
        for r in sorted(runs, key=lambda r: r["repeat"])
    ]


def mean_log_time(runs: list[dict]) -> dict:
    """The mean of log(time to target in s) over one policy's runs, and its exponential (the
    geometric mean), when every run reached the target; None otherwise."""
    if not runs or not all(r["reached_target"] for r in runs):
        return {"mean_log_time_to_target": None, "geomean_time_to_target_s": None}
    mean = statistics.fmean(math.log(r["time_to_target_s"]) for r in runs)
    return {"mean_log_time_to_target": mean, "geomean_time_to_target_s": math.exp(mean)}


def best_baseline(stats: dict, baselines: list[str]) -> str | None:
    """The baseline of lowest mean log time to target, among those that reached the target in
    every repeat (`summarize`'s per-policy `stats`); None when none did."""
    done = [b for b in baselines if stats[b]["mean_log_time_to_target"] is not None]
    return min(done, key=lambda b: stats[b]["mean_log_time_to_target"]) if done else None


# Repeats of the k-th pooled suite are renumbered k * REPEAT_STRIDE + repeat, so no two share one.
REPEAT_STRIDE = 10_000


def pooled_runs(suites: list[tuple[str, dict]], policies: set[str]) -> list[dict]:
    """The runs of `policies` from several suites' comparison.json (each a (name, document) pair),
    their repeats made distinct across suites: each suite stays paired within itself (the runs of a
    seed ran back to back), so pooling adds seeds without pairing runs from different days.
    ValueError naming the suite when one has no run of a policy."""
    runs = []
    for k, (name, data) in enumerate(suites):
        missing = policies - {r["policy"] for r in data["runs"]}
        if missing:
            raise ValueError(f"{name}: no runs of {sorted(missing)}")
        for r in data["runs"]:
            if r["policy"] in policies:
                runs.append({**r, "repeat": k * REPEAT_STRIDE + r["repeat"], "suite": data.get("suite", name)})
    return runs


def paired_log_ratio(runs: list[dict], baseline: str, ours: str = "copus") -> dict:
    """`ours` against one baseline, repeat by repeat (same seed): log(t_baseline / t_ours), its
    mean with a 95% Student-t interval, and the speedup they imply (exp − 1).

    Misses: a baseline run that missed the target enters at its wall-clock time when it stopped,
    a lower bound on its time to target (`censored_seeds`): the pair's log-ratio is then a lower
    bound too, which can only understate `ours`. A pair where `ours` missed has no such bound: it
    is left out and counted (`pairs_excluded`, `excluded_seeds`), and `complete` is false."""
    by = {(r["policy"], r["repeat"]): r for r in runs}
    pairs, censored, excluded = [], [], []
    for repeat in sorted({r["repeat"] for r in runs}):
        mine, theirs = by.get((ours, repeat)), by.get((baseline, repeat))
        if mine is None or theirs is None:
            continue  # a repeat still running
        log_ratio = _pair_log_ratio(mine, theirs)
        if log_ratio is None:
            excluded.append(mine.get("seed"))
            continue
        if not theirs["reached_target"]:
            censored.append(mine.get("seed"))
        pairs.append({"repeat": repeat, "seed": mine.get("seed"), "log_ratio": log_ratio, **_sides(mine, theirs)})
    mean, ci = mean_ci95([p["log_ratio"] for p in pairs])
    return {
        "baseline": baseline,
        "n_pairs": len(pairs),
        "pairs": pairs,
        "log_ratio_mean": mean,
        "log_ratio_ci95": ci,
        "speedup": math.expm1(mean) if mean is not None else None,
        "speedup_ci95": [math.expm1(x) for x in ci] if ci else None,
        "censored_seeds": censored,
        "pairs_excluded": len(excluded),
        "excluded_seeds": excluded,
        "complete": not excluded,
        **goodput_sides(pairs),
    }


def _sides(mine: dict, theirs: dict) -> dict:
    """A pair's log-ratio split into its two factors, when both runs reached the target:
    log(samples_theirs / samples_mine), the statistical side (how many fewer samples `mine`
    needed), and log(speed_mine / speed_theirs), the throughput side (speed = samples to target
    over time to target, evaluations and reconfigurations included). They add up to the pair's
    log-ratio. Null for a censored pair (a missed run's samples bound nothing)."""
    if not theirs["reached_target"] or not mine.get("samples") or not theirs.get("samples"):
        return {"samples_log_ratio": None, "speed_log_ratio": None}
    samples = math.log(theirs["samples"] / mine["samples"])
    return {"samples_log_ratio": samples, "speed_log_ratio": _pair_log_ratio(mine, theirs) - samples}


def goodput_sides(pairs: list[dict]) -> dict:
    """Goodput = throughput x statistical efficiency, measured: the mean of each side's paired
    log-ratio with its 95% Student-t interval and the ratio it implies, over the pairs that have
    both (`n_sides`). `samples_ratio` < 1 is `ours` needing more samples to the target than the
    baseline; `speed_ratio` > 1 is it getting through them faster."""
    split = [p for p in pairs if p.get("samples_log_ratio") is not None]
    out: dict = {"n_sides": len(split)}
    for side in ("samples", "speed"):
        mean, ci = mean_ci95([p[f"{side}_log_ratio"] for p in split])
        out[f"{side}_log_ratio_mean"], out[f"{side}_log_ratio_ci95"] = mean, ci
        out[f"{side}_ratio"] = math.exp(mean) if mean is not None else None
        out[f"{side}_ratio_ci95"] = [math.exp(x) for x in ci] if ci else None
    return out


def sides_text(block: dict) -> str | None:
    """Goodput's two sides of a paired speedup (`goodput_sides`), in the words the CLI and the
    report both print; None without intervals (one pair is a reading, not a claim)."""
    if not block.get("samples_ratio_ci95") or not block.get("speed_ratio_ci95"):
        return None
    (a, b), (c, d) = block["samples_ratio_ci95"], block["speed_ratio_ci95"]
    return (
        f"statistical side x{block['samples_ratio']:.2f} ({a:.2f} .. {b:.2f}), "
        f"throughput side x{block['speed_ratio']:.2f} ({c:.2f} .. {d:.2f})"
    )


def _pair_log_ratio(mine: dict, theirs: dict) -> float | None:
    """log(t_theirs / t_mine) of one pair of runs (a missed baseline at its wall-clock time, a
    lower bound), or None when `mine` missed the target (no bound either way)."""
    if not mine["reached_target"]:
        return None
    t_theirs = theirs["time_to_target_s"] if theirs["reached_target"] else theirs.get("wall_clock_s")
    return math.log(t_theirs / mine["time_to_target_s"]) if t_theirs else None


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
    """`ours` against one baseline, repeat by repeat (same seed): t_baseline / t_ours − 1, over
    the repeats where both reached the target; a repeat both ran where either missed is left out
    and counted (`paired_speedup_excluded`)."""
    by = {(r["policy"], r["repeat"]): r["time_to_target_s"] for r in runs}
    ran = [k for k in sorted({r["repeat"] for r in runs}) if (ours, k) in by and (baseline, k) in by]
    both = [k for k in ran if by[(ours, k)] and by[(baseline, k)]]
    paired = [by[(baseline, k)] / by[(ours, k)] - 1 for k in both]
    mean, ci = mean_ci95(paired)
    return {
        "paired_speedup_per_repeat": paired,
        "paired_speedup_mean": mean,
        "paired_speedup_ci95": ci,
        "paired_speedup_excluded": len(ran) - len(both),
    }


def paired_speedup_text(entry: dict) -> str | None:
    """`paired_against`'s mean speedup with its 95% interval and the pairs it left out, in the
    words the CLI table and the report both print; None without an interval."""
    ci = entry.get("paired_speedup_ci95")
    if ci is None:
        return None
    text = f"{entry['paired_speedup_mean']:+.1%} (95% CI {ci[0]:+.1%} .. {ci[1]:+.1%})"
    excluded = entry.get("paired_speedup_excluded")
    return f"{text}, {excluded} left out: a run missed the target" if excluded else text


def log_ratio_text(block: dict, ours: str = "copus") -> str:
    """A paired log-ratio block (`paired_log_ratio`) in the words the CLI table and the report
    both print: the speedup, its interval, and how many pairs it rests on, censored or left out."""
    ci = block["speedup_ci95"]
    interval = f", 95% CI {ci[0]:+.1%} .. {ci[1]:+.1%}" if ci else ""
    notes = [f"{block['n_pairs']} pairs"]
    if not ci:  # one seed (make run's demonstration) is a reading, not a measurement
        notes.append("no interval: fewer than 2 pairs")
    if block["censored_seeds"]:
        notes.append(f"{len(block['censored_seeds'])} baseline miss(es) at its stopping time, a lower bound")
    if block["pairs_excluded"]:
        notes.append(f"{block['pairs_excluded']} left out: {ours} missed the target")
    return f"{block['speedup']:+.1%}{interval} (mean log-ratio {block['log_ratio_mean']:+.3f}; {', '.join(notes)})"


def paired_static(runs: list[dict], row: dict) -> dict | None:
    """The static run that is `row`'s counterfactual: same repeat, seed and starting GBS."""
    return next(
        (
            r
            for r in runs
            if r["policy"] == "static"
            and r["repeat"] == row["repeat"]
            and r["seed"] == row["seed"]
            and r["initial_layout"]["gbs"] == row["initial_layout"]["gbs"]
        ),
        None,
    )


def first_gbs_change(reconfigurations: list[dict]) -> tuple[dict | None, float | None]:
    """A run's first change of GBS (a summary.json `reconfigurations` entry), and the samples at
    its next one (where the switched curve stops being that change's), or None."""
    changes = [c for c in reconfigurations if c["from"]["gbs"] != c["to"]["gbs"]]
    if not changes:
        return None, None
    return changes[0], (float(changes[1]["samples"]) if len(changes) > 1 else None)


def add_counterfactual_audits(
    runs: list[dict],
    summaries: dict[tuple[str, int], dict],
    policies: list[str],
    read_records: Callable[[str], list[dict]],
    warn: Callable[[str], None],
) -> None:
    """Adds `counterfactual_audit` (`audit_fields`) to each copus-family entry of `runs` that has
    none yet, once its repeat's static run is done (or when the suite runs none). `summaries`:
    each run's summary.json by (policy, repeat); `read_records`: a run's records.jsonl, by its
    output_dir. An audit that fails leaves the comparison as it is, with the reason."""
    for row in runs:
        if row["policy"] not in ADAPTIVE or "counterfactual_audit" in row:
            continue
        static = paired_static(runs, row)
        if static is None and "static" in policies and ("static", row["repeat"]) not in summaries:
            continue  # the repeat's static run is still to come
        summary = summaries[(row["policy"], row["repeat"])]
        change, next_change_at = first_gbs_change(summary["reconfigurations"])
        if change is None:
            row["counterfactual_audit"] = audit_fields(None, note="no change of GBS: nothing to audit")
        elif static is None:
            note = "no static run with the same seed and starting GBS in this repeat"
            row["counterfactual_audit"] = audit_fields(change, note=note)
        else:
            try:
                records = read_records(row["output_dir"]), read_records(static["output_dir"])
                row["counterfactual_audit"] = counterfactual_audit(change, next_change_at, *records)
            except Exception as err:  # a by-product: never lose a comparison to it
                warn(f"warning: could not audit {row['output_dir']} against static ({type(err).__name__}: {err})")
                row["counterfactual_audit"] = audit_fields(change, note=f"audit failed: {type(err).__name__}")


def counterfactual_audit(change: dict, next_change_at: float | None, switched: list[dict], static: list[dict]) -> dict:
    """The audit (`audit_fields`) of a run's first change of GBS (`change`; the next one at
    `next_change_at` samples ends its curve) from its records (`switched`) and the records of
    its paired static run (`static`), the counterfactual."""
    s_sw, l_sw = step_curve(switched)
    s_cf, l_cf = step_curve(static)
    at = float(change["samples"])
    keep = s_sw <= (next_change_at if next_change_at is not None else math.inf)
    est = counterfactual_gain((s_sw[keep], l_sw[keep]), (s_cf, l_cf), at)
    return audit_fields(change, est, _gap_before(s_sw, l_sw, s_cf, l_cf, at))


def audit_fields(
    change: dict | None, est: CounterfactualGain | None = None, gap_before: float | None = None, note: str | None = None
) -> dict:
    """The fields of a counterfactual audit: the change (step, samples, GBS from and to), the
    controller's predicted SE(new)/SE(old), the realized gain against static at matched loss
    (`copus.core.counterfactual.CounterfactualGain`: ρ, its 95% interval, the matched loss, the
    samples each run needed to reach it, the points used), the run's own one-run estimate for
    contrast, `loss_gap_before_switch` (mean |difference| of the two runs' train losses at the same
    samples before the switch: near 0 when they really were one run until then) and a note."""
    change = change or {}
    order = change.get("order") or {}
    predicted = change.get("predicted_efficiency_gain")
    predicted = order.get("predicted_efficiency_gain") if predicted is None else predicted
    return {
        "counterfactual": "static",
        "step": change.get("step"),
        "samples": change.get("samples"),
        "from_gbs": (change.get("from") or {}).get("gbs"),
        "to_gbs": (change.get("to") or {}).get("gbs"),
        "predicted_efficiency_gain": predicted,
        "realized_efficiency_gain": est.rho if est else None,
        "realized_efficiency_interval": list(est.interval) if est and est.interval else None,
        "matched_loss": est.level if est else None,
        "samples_to_matched_loss": (
            {"static": est.samples_counterfactual, "switched": est.samples_switched}
            if est and est.rho is not None
            else None
        ),
        "audit_points": {"static": est.n_before, "switched": est.n_after} if est else None,
        "loss_gap_before_switch": gap_before,
        "one_run_efficiency_gain": change.get("realized_efficiency_gain"),
        "one_run_efficiency_interval": change.get("realized_efficiency_interval"),
        "audit_note": est.note if est else note,
    }


def _gap_before(s_a, l_a, s_b, l_b, switch_at: float) -> float | None:
    """Mean |l_a − l_b| over the samples both curves report up to the switch."""
    before = s_a <= switch_at
    common, ia, ib = np.intersect1d(s_a[before], s_b, return_indices=True)
    l_a = l_a[before]
    return float(np.mean(np.abs(l_a[ia] - l_b[ib]))) if len(common) else None
