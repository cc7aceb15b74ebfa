"""The simulator's comparison protocol: a ramp as Megatron runs it, static tuned over every GBS,
the ramp tuned over its final GBS and length, and COPUS against the best of them and against
copus-gbs over seeds of the estimation noise (`copus.core.sim_protocol`)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from copus.config import ConfigError
from copus.core.datasheets import NODES
from copus.core.layout import CandidateConfig, layout_problems
from copus.core.ramp import BatchRamp
from copus.core.search import gbs_grid
from copus.core.sim_protocol import run_protocol, tune_ramp, tune_static
from copus.core.simulator import Cluster, Setting, search_space, simulate
from copus.sim.config import load_sim_config, setting_from
from workloads.flavours import FLAVOURS

SHAPE_3B = FLAVOURS["llama-3.2-3b"].shape()


@pytest.fixture(scope="module")
def small():
    """Llama-3.2-3B on one 8-GPU node, GBS 32-256, a short target: runs of a few thousand steps."""
    s = Setting(
        Cluster(NODES["h100-sxm-8"], 1),
        SHAPE_3B,
        4096,
        CandidateConfig(8, 1, 1, 1, 128),
        gbs_min=32,
        gbs_max=256,
        mbs=(1, 2),
        target_loss=3.2,
        dp_shard=("full",),
        recompute=("full",),
        max_hours=2000,
    )
    return s, search_space(s)


def test_a_ramp_follows_its_schedule_in_one_layout_and_mbs(small):
    s, space = small
    ramp = BatchRamp.linear(32, 32, 30_000, 128)
    r = simulate(replace(s, ramp=ramp), "ramp", space)
    assert r.time_to_target_s is not None and r.final.gbs == 128
    assert [c["to"]["gbs"] for c in r.reconfigurations] == [64, 96, 128]
    assert all(c["change"] == "gbs" and c["downtime_s"] == 0.0 for c in r.reconfigurations)
    # Each change at the first step boundary at or past its scheduled samples.
    for change, (at, _) in zip(r.reconfigurations, ramp.points[1:]):
        assert at <= change["samples"] < at + change["from"]["gbs"]
    shapes = {CandidateConfig.from_dict(c["to"]).shape_label() for c in r.reconfigurations}
    assert shapes == {r.start.shape_label()}  # layout and MBS never change
    assert all(
        not layout_problems(r.start.dp, r.start.tp, r.start.pp, SHAPE_3B, None, g, r.start.mbs) for g in (32, 64)
    )
    with pytest.raises(ValueError, match="'ramp' needs a ramp schedule"):
        simulate(s, "ramp", space)


def test_tuned_static_is_the_fastest_static_of_the_grid(small):
    s, space = small
    tuned = tune_static(s, space)
    direct = {g: simulate(replace(s, start=replace(s.start, gbs=g)), "static", space) for g in gbs_grid(32, 256)}
    fastest = min(direct, key=lambda g: direct[g].time_to_target_s)
    assert tuned.choice["gbs"] == fastest and tuned.best.time_to_target_s == direct[fastest].time_to_target_s
    for point in tuned.tried:  # every GBS tried: its own time, or cut short once slower than the best
        if point["time_to_target_s"] is not None:
            assert point["time_to_target_s"] == direct[point["gbs"]].time_to_target_s
        else:
            assert point["stopped"] == "slower than the best" and point["gbs"] != fastest
    assert sorted(p["gbs"] for p in tuned.tried) == gbs_grid(32, 256)


def test_tuned_ramp_is_the_fastest_ramp_tried(small):
    s, space = small
    tuned = tune_ramp(s, space, lengths=(0.1, 1.0))
    times = [p["time_to_target_s"] for p in tuned.tried if p["time_to_target_s"] is not None]
    assert tuned.best.time_to_target_s == min(times)
    c = tuned.choice
    assert c["start_gbs"] < c["final_gbs"] and c["increment"] == c["config"]["dp"] * c["config"]["mbs"]


def test_the_protocol_sets_copus_against_the_best_baseline_and_copus_gbs(small):
    s, space = small
    out = run_protocol(s, space, ["static", "cbs-pessimistic"], seeds=2, lengths=(0.3,))
    assert out["seeds"] == [0, 1]
    stats = out["policies"]
    users = ["user-static@0.5x", "user-ramp@0.5x", "user-static@2x", "user-ramp@2x"]
    baselines = ["static", "cbs-pessimistic", "tuned-static", "tuned-ramp", *users]
    assert set(stats) == {*baselines, "copus", "copus-gbs"}
    assert all(stats[p]["runs"] == 2 for p in stats)
    means = {p: stats[p]["time_to_target_s"] for p in baselines}
    assert out["best_baseline"] == min(means, key=means.get)
    assert means["tuned-static"] <= means["static"]  # static at batch.gbs is one of the grid's
    per_seed = out["copus_vs_best_baseline"]["per_seed"]
    runs = stats["copus"]["time_to_target_runs_s"]
    assert per_seed == pytest.approx([means[out["best_baseline"]] / t - 1 for t in runs])
    assert len(out["copus_vs_copus_gbs"]["per_seed"]) == 2
    ahead = out["copus_vs_each_baseline"]
    assert out["copus_ahead_of_every_baseline"] == all(v > 0 for v in ahead.values())
    assert out["tuned-static"]["choice"]["gbs"] in gbs_grid(32, 256)


def test_copus_simulate_prints_the_protocol_and_takes_a_ramp(tmp_path, capsys):
    from copus.cli import main

    sim = tmp_path / "sim.yaml"
    sim.write_text(
        "model: llama-3.2-3b\nbatch: {gbs: 128}\n"
        "search: {gbs_min: 32, gbs_max: 256, mbs: [1, 2], dp_shard: [full], recompute: [full]}\n"
        "training: {target_loss: 3.2}\npolicies: [static, ramp]\n"
        "ramp: {start_gbs: 32, increment: 32, samples: 30000, final_gbs: 128}\n"
        "protocol: {seeds: 2, ramp_lengths: [0.3]}\n"
    )
    assert main(["simulate", str(sim), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["policies"]["ramp"]["final"]["gbs"] == 128 and out["policies"]["ramp"]["reconfigurations"] == 3
    assert {"copus", "copus-gbs", "ramp", "tuned-static", "tuned-ramp"} <= set(out["protocol"]["policies"])
    assert main(["simulate", str(sim)]) == 0
    text = capsys.readouterr().out
    for line in (
        "tuned static:",
        "copus layout changes per run (dp x tp x pp):",
        "copus vs best baseline (",
        "vs copus-gbs",
    ):
        assert line in text
    with pytest.raises(ConfigError, match="policies: 'ramp' needs the ramp section"):
        load_sim_config(sim, ["ramp=null"])
    with pytest.raises(ConfigError, match="ramp: no linear ramp from GBS 32 to 16"):
        load_sim_config(sim, ["ramp.final_gbs=16"])
    assert setting_from(load_sim_config(sim)).ramp == BatchRamp.linear(32, 32, 30000, 128)
