"""The tuned baselines of a suite: candidates as runs, and the choice on the tuning seeds (lowest
mean log time to target; a candidate that missed the target on any seed is out). Pure."""

from __future__ import annotations

import math

import pytest

from copus.core.layout import CandidateConfig
from copus.core.tuning import (
    TuningCandidate,
    candidate_result,
    choose_tuned,
    ramp_candidate,
    start_for_gbs,
    static_candidate,
)


def rows(name: str, times: list[float | None]) -> list[dict]:
    return [
        {"candidate": name, "seed": 100 + k, "reached_target": t is not None, "time_to_target_s": t, "samples": 640}
        for k, t in enumerate(times)
    ]


def test_the_lowest_mean_log_time_wins_and_a_miss_on_any_seed_is_out():
    static = [static_candidate(g, CandidateConfig(2, 1, 1, 2, g)) for g in (8, 16, 32)]
    ramps = [ramp_candidate(8, 8, s, 32, 4, (2, 1, 1)) for s in (640, 1280)]
    runs = (
        rows("static-gbs8", [100.0, 100.0])
        + rows("static-gbs16", [60.0, 160.0])  # arithmetic mean 110, geometric mean 98: wins on logs
        + rows("static-gbs32", [50.0, None])  # fastest where it arrived, but it missed a seed
        + rows("ramp-640", [None, None])
        + rows("ramp-1280", [90.0, None])
    )
    results = [candidate_result(c, runs) for c in static + ramps]
    by = {r["name"]: r for r in results}
    assert by["static-gbs16"]["mean_log_time_to_target"] == pytest.approx((math.log(60) + math.log(160)) / 2)
    assert by["static-gbs32"]["mean_log_time_to_target"] is None and not by["static-gbs32"]["reached_target"]
    assert [s["seed"] for s in by["static-gbs8"]["per_seed"]] == [100, 101]
    assert choose_tuned(results) == {"tuned-static": "static-gbs16", "tuned-ramp": None}
    ties = [candidate_result(c, rows(c.name, [70.0])) for c in static]
    assert choose_tuned(ties)["tuned-static"] == "static-gbs8"  # a tie goes to the first listed


def test_candidates_are_runs_of_static_in_the_fastest_layout_and_of_a_megatron_ramp():
    given = CandidateConfig(4, 1, 1, 4, 16)
    space = [CandidateConfig(4, 1, 1, 1, 4), CandidateConfig(2, 1, 2, 1, 4)]
    assert start_for_gbs(4, given, space) == space[0]  # the experiment's MBS 4 does not fit GBS 4
    assert start_for_gbs(16, given, [CandidateConfig(2, 1, 2, 4, 16), given]) == given
    assert start_for_gbs(6, given, []) is None
    static = static_candidate(4, space[0])
    assert static.entry == "tuned-static" and static.settings == {"gbs": 4}
    assert {"policy.name=static", "policy.layout=best", "batch.ramp=null", "batch.gbs=4", "batch.mbs=1"} <= set(
        static.overrides
    )
    ramp = ramp_candidate(16, 16, 2560, 64, 4, (2, 1, 2))
    assert isinstance(ramp, TuningCandidate) and ramp.name == "ramp-2560" and ramp.entry == "tuned-ramp"
    assert "batch.ramp={start_gbs: 16, increment: 16, samples: 2560}" in ramp.overrides
    assert {"policy.name=ramp", "batch.gbs=64", "parallel.dp=2", "parallel.pp=2"} <= set(ramp.overrides)
