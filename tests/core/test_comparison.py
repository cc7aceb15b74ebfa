"""Comparison statistics: time to target per policy and COPUS's speedup over the fastest
baseline, with repeats (paired by seed) and policies that miss the target."""

from __future__ import annotations

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
