"""Sharding and recomputation in the search space: candidates carry them (no duplicate for a
single replica), the profile measures each model build once per round, and the planner counts
a change of either as a change of replica."""

from __future__ import annotations

from copus.core.layout import DP_SHARD_MODES, RECOMPUTE_MODES, CandidateConfig
from copus.core.planner import change_kind, same_shape
from copus.core.search import candidates, profile_points, valid_layouts
from workloads.flavours import FLAVOURS

SHAPE = FLAVOURS["small"].shape()


def test_candidates_carry_every_knob_and_never_shard_a_single_replica():
    cands = candidates(valid_layouts(4, SHAPE), [2, 4], [16, 32], SHAPE, DP_SHARD_MODES, RECOMPUTE_MODES)
    assert len(cands) == len(set(cands))
    assert {c.dp_shard for c in cands if c.dp == 1} == {"none"}
    assert {c.dp_shard for c in cands if c.dp > 1} == set(DP_SHARD_MODES)
    assert {c.recompute for c in cands} == set(RECOMPUTE_MODES)
    plain = candidates(valid_layouts(4, SHAPE), [2, 4], [16, 32], SHAPE)
    assert {(c.dp_shard, c.recompute) for c in plain} == {("none", "none")}
    # A grid of sharded modes only still gives the dp = 1 layouts, unsharded.
    assert any(c.dp == 1 for c in candidates(valid_layouts(4, SHAPE), [4], [16], SHAPE, ["full"]))


def test_profile_rounds_measure_one_model_build_after_another():
    cands = candidates(valid_layouts(2, SHAPE), [2, 4], [8, 16, 32], SHAPE, DP_SHARD_MODES, ["none", "full"])
    points = profile_points(cands, 2)
    assert sorted(points, key=str) == sorted(set(points), key=str)
    first_round = points[: len({(c.dp, c.tp, c.pp, c.mbs, c.dp_shard, c.recompute) for c in cands})]
    builds = [(c.dp, c.tp, c.pp, c.dp_shard, c.recompute) for c in first_round]
    # Within the round each build's points are consecutive: a worker group builds it once.
    assert len([b for i, b in enumerate(builds) if i == 0 or builds[i - 1] != b]) == len(set(builds))


def test_a_change_of_sharding_or_recomputation_is_a_change_of_replica():
    a = CandidateConfig(2, 1, 1, 4, 32)
    assert change_kind(a, CandidateConfig(2, 1, 1, 4, 32, dp_shard="full")) == "layout"
    assert change_kind(a, CandidateConfig(2, 1, 1, 4, 32, recompute="selective")) == "layout"
    assert change_kind(a, CandidateConfig(2, 1, 1, 4, 64)) == "gbs"
    assert not same_shape(a, CandidateConfig(2, 1, 1, 4, 64, recompute="full"))
    assert (
        CandidateConfig.from_dict(CandidateConfig(2, 1, 1, 4, 32, "optimizer", "full").as_dict()).dp_shard
        == "optimizer"
    )
    assert (
        CandidateConfig(2, 1, 1, 4, 32, "optimizer", "full").label()
        == "dp2-tp1-pp1 mbs4 gbs32 shard=optimizer recompute=full"
    )
