"""What the simulated planner reads instead of the truth (`copus.core.sim_view`), and the
protocol's baselines tuned as a user could tune them, beside the hindsight bound and the perfect
planner's ceiling (`copus.core.sim_protocol`)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from copus.core.datasheets import NODES
from copus.core.layout import CandidateConfig
from copus.core.search import profile_points
from copus.core.sim_protocol import perfect_setting, run_protocol, scored_as_user, tune_static, user_world
from copus.core.sim_view import PlannerView, ProfileSampling, exact_view, profiled_view
from copus.core.simulator import Cluster, Setting, search_space, simulate
from workloads.flavours import FLAVOURS

SHAPE_13B = FLAVOURS["llama-2-13b"].shape()


@pytest.fixture(scope="module")
def two_nodes():
    """Llama-2-13B on 2x8 H100, GBS 32-256: layouts whose step times the one-link model cannot
    all fit (the truth prices a group within a node over NVLink, across nodes over the network)."""
    s = Setting(
        Cluster(NODES["h100-sxm-8"], 2),
        SHAPE_13B,
        4096,
        CandidateConfig(16, 1, 1, 1, 128, "full", "full"),
        gbs_min=32,
        gbs_max=256,
        mbs=(1, 2),
        target_loss=3.0,
        dp_shard=("full",),
        recompute=("full",),
        max_hours=2000,
    )
    return s, search_space(s)


def test_the_profile_measures_its_points_within_the_budget_and_fits_the_rest(two_nodes):
    s, (cands, truth) = two_nodes
    sampling = ProfileSampling(noise=0.02)
    view = profiled_view(s.shape, cands, truth, sampling, seed=3)
    r = view.report
    order = profile_points(cands, sampling.gbs_per_shape, sampling.max_microbatches)
    true_step = {c: c.gbs / t for c, t in zip(cands, truth)}
    # Points in the profiler's order while the budget lasts; the last one may overrun it.
    spent = np.cumsum([sampling.steps_per_point * true_step[c] for c in order[: r["points"]]])
    assert r["spent_s"] == pytest.approx(spent[-1]) and (r["points"] == len(order) or spent[-2] < sampling.budget_s)
    measured = order[: r["points"]]
    noise = [math.log(view.throughputs[c] / (c.gbs / true_step[c])) for c in measured if c in view.throughputs]
    assert 0.005 < float(np.std(noise)) < 0.05  # each measured point off the truth by the timing noise
    # The model's predictions elsewhere are not the truth: the table is off it, and says by how much.
    off = [abs(view.throughputs[c] * true_step[c] / c.gbs - 1) for c in view.throughputs]
    assert r["table_vs_truth_mape"] == pytest.approx(float(np.mean(off))) and r["table_vs_truth_mape"] > 0.005
    assert r["candidates"] == len(view.throughputs) and r["candidates"] + r["left_out_extrapolating"] == len(cands)
    assert set(view.throughput_log_sd) == set(view.throughputs) and all(v > 0 for v in view.throughput_log_sd.values())
    again = profiled_view(s.shape, cands, truth, sampling, seed=3)
    other = profiled_view(s.shape, cands, truth, sampling, seed=4)
    assert again.throughputs == view.throughputs and other.throughputs != view.throughputs


def test_a_small_budget_measures_fewer_points_and_leaves_unseen_degrees_out(two_nodes):
    s, (cands, truth) = two_nodes
    order = profile_points(cands, 3, 16)
    first_step = order[0].gbs / dict(zip(cands, truth))[order[0]]
    tiny = profiled_view(s.shape, cands, truth, ProfileSampling(budget_s=4 * first_step * 2.5), seed=0)
    assert tiny.report["points"] == 3
    seen = {(c.dp, c.tp, c.pp) for c in order[:3]}
    assert {(c.dp, c.tp, c.pp) for c in tiny.throughputs} <= {
        (dp, tp, pp) for dp in {x[0] for x in seen} for tp in {x[1] for x in seen} for pp in {x[2] for x in seen}
    }
    assert tiny.report["left_out_extrapolating"] > 0
    with pytest.raises(ValueError, match="profile.budget_s: .* the step-time fit needs 2"):
        profiled_view(s.shape, cands, truth, ProfileSampling(budget_s=1e-9), seed=0)
    exact = profiled_view(s.shape, cands, truth, ProfileSampling(exact=True), seed=0)
    assert exact.throughputs == dict(zip(cands, truth.tolist())) and exact.throughput_log_sd is None


def test_every_choice_reads_the_planners_table_and_training_the_truth(two_nodes):
    s, space = two_nodes
    cands, truth = space
    at_start = [c for c in cands if c.gbs == s.start.gbs]
    slowest = min(at_start, key=lambda c: dict(zip(cands, truth))[c])
    # A table that believes the slowest configuration at the starting GBS is ten times faster.
    table = {c: t * (10.0 if c == slowest else 1.0) for c, t in zip(cands, truth.tolist())}
    fooled = simulate(s, "static", space, PlannerView(table, None, {"exact": False}))
    honest = simulate(s, "static", space, exact_view(*space))
    assert fooled.final == slowest and honest.final != slowest  # static keeps where it started
    assert fooled.time_to_target_s > honest.time_to_target_s  # trained at the truth's speed of its choice


def test_a_user_who_guesses_the_critical_batch_right_on_the_truths_table_tunes_as_hindsight(two_nodes):
    s, space = two_nodes
    view = exact_view(*space)
    assert user_world(view)[0] == space[0]
    right = scored_as_user(s, space, [view, view], 1.0, (0.3,))
    hindsight = tune_static(s, space)
    tuned, scored = right["user-static@1x"]
    assert tuned.choice["gbs"] == hindsight.choice["gbs"] and len(scored) == 2
    assert scored[1].time_to_target_s == pytest.approx(hindsight.best.time_to_target_s)
    # Guessing the critical batch half as large, the user picks a GBS no larger, scored on the truth.
    low, _ = scored_as_user(s, space, [view], 0.5, (0.3,))["user-static@0.5x"]
    assert low.choice["gbs"] <= hindsight.choice["gbs"]


def test_the_perfect_planner_reads_the_truth_and_prices_no_switch(two_nodes):
    s, _ = two_nodes
    noisy = replace(s, profile=ProfileSampling(), estimate=replace(s.estimate, mapping_error=2.0))
    p = perfect_setting(noisy)
    assert p.profile.exact and p.estimate.noise == 0 and p.estimate.mapping_error == 1.0
    assert p.estimate.half_life_share == 0 and p.estimate.min_half_life == 0
    assert p.rule.rule == "quantile" and p.rule.quantile_z == 0 and p.rule.transient_steps == 0
    assert p.costs.in_place_fixed_s == 0 and p.curve == s.curve and p.critical == s.critical


def test_the_protocol_reports_every_kind_of_baseline_and_the_ceiling(two_nodes):
    s, space = two_nodes
    profiled = replace(s, profile=ProfileSampling())
    out = run_protocol(profiled, space, ["static"], seeds=2, lengths=(0.3,))
    users = {"user-static@0.5x", "user-static@2x", "user-ramp@0.5x", "user-ramp@2x"}
    assert users <= set(out["policies"]) and set(out["user_tuned"]) <= users
    kinds = out["copus_vs_kind"]
    assert kinds["paper"]["baseline"] == "static" and kinds["hindsight_tuned"]["baseline"] in (
        "tuned-static",
        "tuned-ramp",
    )
    means = {p: v["time_to_target_s"] for p, v in out["policies"].items()}
    # Static tuned in hindsight on the truth, the user's tuned static cannot beat it.
    assert means["tuned-static"] <= min(means["user-static@0.5x"], means["user-static@2x"])
    assert len(kinds["user_tuned"]["copus_vs"]["per_seed"]) == 2
    c = out["ceiling"]
    assert c["time_to_target_s"] is not None and c["reconfigurations"] >= 1
    best = means[out["best_baseline"]]
    assert c["vs_best_baseline"] == pytest.approx(best / c["time_to_target_s"] - 1)
    if c["copus_share_of_gain"] is not None:
        assert c["copus_share_of_gain"] == pytest.approx((best - means["copus"]) / (best - c["time_to_target_s"]))
    assert [v["points"] for v in out["planner_view"]] and all(not v["exact"] for v in out["planner_view"])
