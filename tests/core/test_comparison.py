"""Comparison statistics: time to target per policy and COPUS's speedup over the fastest
baseline, with repeats (paired by seed) and policies that miss the target."""

from __future__ import annotations

import numpy as np
import pytest

from copus.core.comparison import summarize


def run(policy, repeat, ttt, loss=2.0, samples=100, reconfigs=0):
    return {
        "policy": policy,
        "repeat": repeat,
        "time_to_target_s": ttt,
        "reached_target": ttt is not None,
        "final_val_loss": loss,
        "samples": samples,
        "reconfigurations": reconfigs,
    }


def test_speedup_over_the_fastest_baseline_with_repeats():
    runs = [
        run("copus", 0, 90.0, reconfigs=2),
        run("static", 0, 100.0),
        run("cbs-optimistic", 0, 120.0),
        run("copus", 1, 110.0, reconfigs=1),
        run("static", 1, 121.0),
        run("cbs-optimistic", 1, 105.0),
    ]
    out = summarize(runs, ["copus", "static", "cbs-optimistic"])
    assert out["static"]["time_to_target_s"] == pytest.approx(110.5)
    assert out["copus"]["time_to_target_s"] == pytest.approx(100.0) and out["copus"]["reconfigurations"] == 1.5
    assert out["copus"]["fastest_baseline"] == "static"
    assert out["copus"]["speedup_vs_fastest_baseline"] == pytest.approx(110.5 / 100 - 1)
    # Paired per repeat: min over baselines of that repeat / copus.
    assert out["copus"]["speedup_per_repeat"] == pytest.approx([100 / 90 - 1, 105 / 110 - 1])
    assert out["copus"]["speedup_std"] > 0
    # Paired against the fastest baseline by mean (static), with a 95% t-interval.
    paired = [100 / 90 - 1, 121 / 110 - 1]
    assert out["copus"]["paired_speedup_per_repeat"] == pytest.approx(paired)
    low, high = out["copus"]["paired_speedup_ci95"]
    assert out["copus"]["paired_speedup_mean"] == pytest.approx(sum(paired) / 2)
    assert low < out["copus"]["paired_speedup_mean"] < high
    assert high - low == pytest.approx(2 * 12.706 * abs(paired[0] - paired[1]) / 2**0.5 / 2**0.5, rel=1e-3)


def test_missing_the_target_is_reported_not_averaged_away():
    runs = [run("copus", 0, 90.0), run("static", 0, None, loss=2.5), run("cbs-pessimistic", 0, 95.0)]
    out = summarize(runs, ["copus", "static", "cbs-pessimistic"])
    assert out["static"]["reached_target"] is False and out["static"]["time_to_target_s"] is None
    assert out["copus"]["fastest_baseline"] == "cbs-pessimistic"
    slow = summarize([run("copus", 0, None), run("static", 0, 10.0)], ["copus", "static"])
    assert slow["copus"]["speedup_vs_fastest_baseline"] is None


def test_the_copus_gbs_ablation_is_measured_against_the_baselines_and_copus_against_it():
    runs = [
        run("copus", 0, 80.0),
        run("copus-gbs", 0, 90.0),
        run("static", 0, 100.0),
        run("copus", 1, 88.0),
        run("copus-gbs", 1, 99.0),
        run("static", 1, 110.0),
    ]
    out = summarize(runs, ["copus", "copus-gbs", "static"])
    assert out["copus"]["fastest_baseline"] == "static"  # the ablation is never the baseline
    assert out["copus-gbs"]["fastest_baseline"] == "static"
    assert out["copus-gbs"]["paired_speedup_per_repeat"] == pytest.approx([100 / 90 - 1, 110 / 99 - 1])
    assert out["copus"]["vs_copus_gbs"]["paired_speedup_per_repeat"] == pytest.approx([90 / 80 - 1, 99 / 88 - 1])
    assert out["copus"]["vs_copus_gbs"]["paired_speedup_ci95"] is not None
    assert "vs_copus_gbs" not in summarize(runs[:1] + runs[2:3], ["copus", "static"])["copus"]


def test_the_run_order_is_a_recorded_shuffle_that_no_policy_always_leads():
    from copus.core.comparison import run_order

    policies = ["copus", "copus-gbs", "static", "cbs-pessimistic"]
    orders = [run_order(policies, r, seed=0, shuffled=True) for r in range(16)]
    assert all(sorted(o) == sorted(policies) for o in orders)
    assert orders == [run_order(policies, r, seed=0, shuffled=True) for r in range(16)]  # reproducible
    assert len({o[0] for o in orders}) == len(policies)  # every policy leads some repeat
    assert orders != [run_order(policies, r, seed=1, shuffled=True) for r in range(16)]
    assert run_order(policies, 3, seed=0, shuffled=False) == policies


def seeded(policy, repeat, ttt, seed=None, wall=None, samples=100):
    """A run row as `copus compare` writes it: with its seed and its wall-clock time."""
    row = run(policy, repeat, ttt, samples=samples)
    return {**row, "seed": 1000 + repeat if seed is None else seed, "wall_clock_s": wall or (ttt or 300.0)}


def test_paired_log_ratios_per_baseline_and_against_the_best_baseline():
    import math

    copus = [80.0, 90.0, 100.0]
    static = [100.0, 99.0, 130.0]
    tuned = [88.0, 95.0, 104.0]  # the best baseline: lowest mean log time
    runs = [seeded("copus", r, t) for r, t in enumerate(copus)]
    runs += [seeded("static", r, t) for r, t in enumerate(static)]
    runs += [seeded("tuned-static", r, t, samples=200 + r) for r, t in enumerate(tuned)]
    out = summarize(runs, ["copus", "static", "tuned-static"])

    assert [row["seed"] for row in out["tuned-static"]["per_seed"]] == [1000, 1001, 1002]
    assert [row["samples_to_target"] for row in out["tuned-static"]["per_seed"]] == [200, 201, 202]
    assert out["static"]["mean_log_time_to_target"] == pytest.approx(sum(map(math.log, static)) / 3)
    assert out["static"]["geomean_time_to_target_s"] == pytest.approx((100 * 99 * 130) ** (1 / 3))
    best = out["copus"]["vs_best_baseline"]
    assert best["baseline"] == "tuned-static" and best["n_pairs"] == 3 and best["complete"]
    logs = [math.log(t / c) for t, c in zip(tuned, copus)]
    assert [p["log_ratio"] for p in best["pairs"]] == pytest.approx(logs)
    mean = sum(logs) / 3
    sd = (sum((x - mean) ** 2 for x in logs) / 2) ** 0.5
    half = 4.302653 * sd / 3**0.5  # Student t, 2 degrees of freedom, 97.5%
    assert best["log_ratio_mean"] == pytest.approx(mean)
    assert best["log_ratio_ci95"] == pytest.approx([mean - half, mean + half], rel=1e-5)
    assert best["speedup"] == pytest.approx(math.exp(mean) - 1)
    assert best["speedup_ci95"] == pytest.approx([math.exp(mean - half) - 1, math.exp(mean + half) - 1], rel=1e-5)
    against_static = out["copus"]["paired_log_ratio"]["static"]
    assert against_static["log_ratio_mean"] == pytest.approx(sum(math.log(s / c) for s, c in zip(static, copus)) / 3)
    assert "copus" not in out["copus"]["paired_log_ratio"]  # only baselines


def test_the_paired_log_ratio_splits_into_a_statistical_and_a_throughput_side():
    import math

    # COPUS needs 1.3x the samples and gets through them 1.6x as fast (x1.5..1.7 over the seeds).
    static = [(100.0, 6000), (110.0, 6200), (95.0, 5800), (105.0, 6100)]
    speedup = [1.5, 1.6, 1.7, 1.6]
    copus = [(t * 1.3 / f, n * 1.3) for (t, n), f in zip(static, speedup)]
    runs = [seeded("copus", r, t, samples=n) for r, (t, n) in enumerate(copus)]
    runs += [seeded("static", r, t, samples=n) for r, (t, n) in enumerate(static)]
    block = summarize(runs, ["copus", "static"])["copus"]["vs_best_baseline"]

    for pair in block["pairs"]:  # the two sides add up to the pair's log-ratio
        assert pair["samples_log_ratio"] + pair["speed_log_ratio"] == pytest.approx(pair["log_ratio"])
        assert pair["samples_log_ratio"] == pytest.approx(-math.log(1.3))
    assert block["n_sides"] == 4
    assert block["samples_ratio"] == pytest.approx(1 / 1.3)
    assert block["samples_log_ratio_ci95"] == pytest.approx([-math.log(1.3)] * 2)  # no spread: no width
    assert block["speed_ratio"] == pytest.approx(math.exp(sum(map(math.log, speedup)) / 4))
    low, high = block["speed_ratio_ci95"]
    assert 1.45 < low < block["speed_ratio"] < high < 1.75
    assert block["samples_log_ratio_mean"] + block["speed_log_ratio_mean"] == pytest.approx(block["log_ratio_mean"])
    from copus.core.comparison import sides_text

    # The words the CLI's line (copus.cluster.compare.side_lines) and the report's cell both print.
    assert sides_text(block).startswith("statistical side x0.77 (0.77 .. 0.77), throughput side x1.60 (")

    # A censored pair (static missed: its time is a bound, its samples bound nothing) has no sides.
    runs[-1] = seeded("static", 3, None, wall=300.0, samples=9000)
    block = summarize(runs, ["copus", "static"])["copus"]["paired_log_ratio"]["static"]
    assert block["n_pairs"] == 4 and block["n_sides"] == 3
    assert block["pairs"][-1]["samples_log_ratio"] is None and block["pairs"][-1]["speed_log_ratio"] is None
    assert sides_text({"samples_ratio": 0.8, "speed_ratio": 1.5}) is None  # no interval, no claim


def test_a_missed_baseline_is_censored_at_its_wall_clock_and_a_missed_copus_pair_left_out():
    import math

    from copus.core.comparison import best_baseline

    runs = [
        seeded("copus", 0, 80.0),
        seeded("copus", 1, None, wall=300.0),  # copus missed: no bound on this pair
        seeded("copus", 2, 90.0),
        seeded("static", 0, 100.0),
        seeded("static", 1, 110.0),
        seeded("static", 2, None, wall=300.0),  # static missed: at least 300 s
        seeded("cbs-pessimistic", 0, 150.0),
        seeded("cbs-pessimistic", 1, 150.0),
        seeded("cbs-pessimistic", 2, 150.0),
    ]
    out = summarize(runs, ["copus", "static", "cbs-pessimistic"])
    vs_static = out["copus"]["paired_log_ratio"]["static"]
    assert [p["seed"] for p in vs_static["pairs"]] == [1000, 1002]
    assert [p["log_ratio"] for p in vs_static["pairs"]] == pytest.approx([math.log(100 / 80), math.log(300 / 90)])
    assert vs_static["censored_seeds"] == [1002]
    assert vs_static["pairs_excluded"] == 1 and vs_static["excluded_seeds"] == [1001] and not vs_static["complete"]
    # The best baseline reached the target on every seed: static missed one, so it is not.
    assert out["static"]["mean_log_time_to_target"] is None
    assert best_baseline(out, ["static", "cbs-pessimistic"]) == "cbs-pessimistic"
    assert out["copus"]["vs_best_baseline"]["baseline"] == "cbs-pessimistic"
    assert out["copus"]["per_seed"][1]["time_to_target_s"] is None
    assert out["copus"]["per_seed"][1]["samples_to_target"] is None
    # No baseline reached the target everywhere: no best baseline.
    lonely = summarize([seeded("copus", 0, 80.0), seeded("static", 0, None)], ["copus", "static"])
    assert lonely["copus"]["vs_best_baseline"] is None
    single = summarize([seeded("copus", 0, 80.0), seeded("static", 0, 88.0)], ["copus", "static"])
    assert single["copus"]["vs_best_baseline"]["log_ratio_ci95"] is None  # one pair: no interval


def test_a_variant_of_copus_is_adaptive_set_against_copus_and_reports_its_share_of_the_gain():
    import math

    copus = [80.0, 90.0, 100.0, 85.0]
    variant = [88.0, 92.0, 104.0, 90.0]
    static = [100.0, 110.0, 125.0, 100.0]
    runs = [seeded("copus", r, t) for r, t in enumerate(copus)]
    runs += [seeded("copus-uncalibrated", r, t) for r, t in enumerate(variant)]
    runs += [seeded("static", r, t) for r, t in enumerate(static)]
    adaptive = ("copus", "copus-gbs", "copus-uncalibrated")
    out = summarize(runs, ["copus", "static", "copus-uncalibrated"], adaptive)

    assert "copus-uncalibrated" not in out["copus"]["paired_log_ratio"]  # a variant is no baseline
    assert out["copus-uncalibrated"]["vs_best_baseline"]["baseline"] == "static"
    vs = out["copus-uncalibrated"]["vs_copus"]
    assert vs["log_ratio_mean"] == pytest.approx(sum(math.log(c / v) for c, v in zip(copus, variant)) / 4)
    share = out["copus-uncalibrated"]["share_of_copus_gain"]
    ours = sum(math.log(s / v) for s, v in zip(static, variant))
    ref = sum(math.log(s / c) for s, c in zip(static, copus))
    assert share["share"] == pytest.approx(ours / ref) and share["n_pairs"] == 4
    low, high = share["ci95"]
    assert low < share["share"] < high and high - low < 1.0


def test_no_share_of_a_gain_copus_did_not_make():
    runs = [seeded("copus", r, 100.0) for r in range(3)]
    runs += [seeded("copus-uncalibrated", r, 90.0) for r in range(3)]
    runs += [seeded("static", r, 95.0) for r in range(3)]
    out = summarize(runs, ["copus", "static", "copus-uncalibrated"], ("copus", "copus-uncalibrated"))
    assert out["copus-uncalibrated"]["share_of_copus_gain"]["share"] is None


def _three_entries(ours_gains: list[float], ref_gains: list[float]) -> list[dict]:
    """static at 100 s on every seed; copus and copus-uncalibrated faster by these log-ratios."""
    import math

    runs = [run("static", r, 100.0) for r in range(len(ref_gains))]
    runs += [run("copus", r, 100.0 * math.exp(-g)) for r, g in enumerate(ref_gains)]
    runs += [run("copus-uncalibrated", r, 100.0 * math.exp(-g)) for r, g in enumerate(ours_gains)]
    return runs


def _bootstrap_means(gains: list[float], draws: int = 4000) -> np.ndarray:
    """gain_share's draws of the mean gain (seed 0, the repeats drawn with replacement)."""
    pick = np.random.default_rng(0).integers(0, len(gains), size=(draws, len(gains)))
    return np.array(gains)[pick].mean(axis=1)


def test_a_share_whose_reference_gain_crosses_zero_keeps_every_draw_and_says_which_bound_is_missing():
    """copus lost on seed 2, so in about a quarter of the draws it gained nothing over static; the
    variant gained on every seed. Those draws are not dropped: the variant beat a reference that
    gained nothing, so they lie above every share. The lower bound is read from all 4,000 draws;
    the upper one does not exist, and the interval says so in its own words."""
    from copus.core.comparison import gain_share, share_interval_text

    ref_gains, ours_gains = [0.3, 0.2, -0.4, 0.25], [0.2, 0.2, 0.1, 0.2]
    share = gain_share(_three_entries(ours_gains, ref_gains), "copus-uncalibrated", "copus", "static")
    ours, ref = _bootstrap_means(ours_gains), _bootstrap_means(ref_gains)
    without = float(np.mean(ref <= 0))
    assert 0.1 < without < 0.5 and share["draws"] == 4000
    assert share["draws_without_reference_gain"] == pytest.approx(without)
    assert share["share"] == pytest.approx(np.mean(ours_gains) / np.mean(ref_gains))
    low, high = share["ci95"]
    every_draw = np.where(ref > 0, ours / np.where(ref > 0, ref, 1.0), np.inf)
    assert high is None and low == pytest.approx(np.quantile(every_draw, 0.025))
    dropped = np.where(ref > 0, ours / np.where(ref > 0, ref, 1.0), np.nan)
    assert np.isfinite(np.nanquantile(dropped, 0.975))  # leaving those draws out made up an upper bound
    note = f"unbounded above: copus gained nothing over static in {without:.0%} of draws"
    assert share["ci95_note"] == note
    assert share_interval_text(share) == f"95% interval from {low:.0%}, {note}"


def test_draws_where_neither_gained_support_no_bound():
    """The variant makes half copus's gain on every seed, so it lost wherever copus did: such a
    draw says nothing of a share (the inequalities turn over), and counts against both bounds."""
    from copus.core.comparison import gain_share, share_interval_text

    ref_gains = [0.3, 0.2, -0.4, 0.25]
    share = gain_share(_three_entries([g / 2 for g in ref_gains], ref_gains), "copus-uncalibrated", "copus", "static")
    assert share["share"] == pytest.approx(0.5) and share["ci95"] == [None, None]
    assert share_interval_text(share).startswith("no 95% interval, unbounded below and above: copus gained nothing")
    # With few such draws (under 2.5%) both bounds stand: every draw where copus gained reads 0.5.
    steady = [0.3, 0.1, -0.2, 0.15, 0.1, 0.2, 0.12, 0.1]  # copus gained nothing in 1.5% of draws
    share = gain_share(_three_entries([g / 2 for g in steady], steady), "copus-uncalibrated", "copus", "static")
    assert 0 < share["draws_without_reference_gain"] < 0.025
    assert share["ci95"] == pytest.approx([0.5, 0.5]) and share["ci95_note"] is None
    assert share_interval_text(share) == "95% interval 50% to 50%"


def test_a_draw_quantile_is_numpys_and_none_on_an_infinite_draw():
    from copus.core.comparison import draw_quantile

    finite = np.random.default_rng(1).normal(size=1001)
    assert draw_quantile(finite, 0.025) == pytest.approx(np.quantile(finite, 0.025))
    assert draw_quantile(finite, 0.975) == pytest.approx(np.quantile(finite, 0.975))
    tail = np.concatenate([finite, np.full(30, np.inf)])  # 2.9% of the draws beyond every value
    assert draw_quantile(tail, 0.025) == pytest.approx(np.quantile(tail, 0.025))
    assert draw_quantile(tail, 0.975) is None


def test_a_paired_speedup_counts_the_pairs_it_leaves_out_and_says_so():
    """copus against copus-gbs (paired_against): a repeat where the ablation missed is no pair;
    it is counted, and the words the CLI table and the report print say so."""
    from copus.core.comparison import log_ratio_text, paired_against, paired_log_ratio, paired_speedup_text

    runs = [run("copus", r, t) for r, t in enumerate([80.0, 90.0, 85.0])]
    runs += [run("copus-gbs", r, t) for r, t in enumerate([88.0, None, 95.0])]
    block = paired_against(runs, "copus-gbs")
    assert block["paired_speedup_excluded"] == 1 and len(block["paired_speedup_per_repeat"]) == 2
    assert paired_speedup_text(block).endswith(", 1 left out: a run missed the target")
    complete = paired_against(runs[:2] + runs[3:4], "copus-gbs")  # repeat 0 only
    assert complete["paired_speedup_excluded"] == 0 and paired_speedup_text(complete) is None  # one pair
    missed = [
        run("copus-uncalibrated", 0, None),
        run("copus-uncalibrated", 1, 70.0),
        run("copus-uncalibrated", 2, 75.0),
    ]
    missed += [run("static", r, 100.0) for r in range(3)]
    text = log_ratio_text(paired_log_ratio(missed, "static", "copus-uncalibrated"), "copus-uncalibrated")
    assert "2 pairs" in text and "1 left out: copus-uncalibrated missed the target" in text
