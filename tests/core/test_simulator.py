"""The simulator: invariants of simulated runs, and proof that it drives the planner of
`copus.core` (patching the planner changes what the simulation does)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from copus.config import ConfigError
from copus.core import planner as planner_module
from copus.core.hardware import NODES
from copus.core.simulator import Cluster, CriticalBatch, Setting, best_layout_by_gbs, search_space, simulate, step_time
from copus.core.throughput import Config
from copus.sim_config import load_sim_config, setting_from
from workloads.flavours import FLAVOURS

SHAPE_13B = FLAVOURS["llama-2-13b"].shape()
SIM_DIR = Path(__file__).resolve().parents[2] / "experiments" / "sim"


def setting(**changes) -> Setting:
    cluster = Cluster(NODES["h100-sxm-8"], 2)
    base = Setting(cluster, SHAPE_13B, 4096, Config(2, 2, 4, 1, 256), gbs_min=64, gbs_max=2048, mbs=(1, 2),
                   target_loss=3.0, interval_s=600)
    return replace(base, **changes)


def test_static_never_reconfigures_and_copus_adapts():
    s = setting()
    space = search_space(s)
    static, copus = simulate(s, "static", space), simulate(s, "copus", space)
    assert static.reconfigurations == [] and static.final == static.start
    assert copus.reconfigurations and copus.time_to_target_s < static.time_to_target_s


def test_a_flat_noise_scale_leaves_the_cbs_gbs_alone():
    # c x B_noise = 256 samples, the start: the critical batch never moves, nor does CBS.
    s = setting(critical=CriticalBatch(flat_tokens=256 * 4096))
    space = search_space(s)
    for policy in ("cbs-pessimistic", "cbs-optimistic", "cbs"):
        r = simulate(s, policy, space)
        assert r.time_to_target_s is not None
        assert {c["to"]["gbs"] for c in r.reconfigurations} <= {r.start.gbs}, policy
    assert simulate(s, "cbs", space).reconfigurations == []


def test_faster_hardware_shortens_the_time_to_target():
    s = setting()
    node = NODES["h100-sxm-8"]
    faster = replace(node, accelerator=replace(node.accelerator, peak_bf16_flops=2 * node.accelerator.peak_bf16_flops),
                     intra_node_bandwidth=2 * node.intra_node_bandwidth, inter_node_bandwidth=2 * node.inter_node_bandwidth)
    quick = replace(s, cluster=Cluster(faster, 2))
    for policy in ("static", "copus"):
        assert simulate(quick, policy).time_to_target_s < simulate(s, policy).time_to_target_s
    cfg = Config(2, 2, 4, 1, 256)
    assert step_time(quick.cluster, SHAPE_13B, 4096, cfg) < step_time(s.cluster, SHAPE_13B, 4096, cfg)


def test_the_simulator_drives_the_planner_of_copus_core(monkeypatch):
    s = setting()
    assert simulate(s, "copus").reconfigurations  # unpatched: the planner moves the GBS
    calls = []

    def never(self, current, b_noise, interval_s, costs, allowed=None, target=None):
        calls.append(current)
        now = self.score(current, b_noise)
        return planner_module.Decision(now, now, False, "none", 0.0, 0.0, "patched")

    monkeypatch.setattr(planner_module.Planner, "decide", never)
    patched = simulate(s, "copus")
    assert calls and patched.reconfigurations == []


def test_restart_costs_more_than_in_place_and_the_best_layout_is_reported():
    s = setting()
    c = s.costs
    assert c.restart_s(s.cluster, SHAPE_13B) > c.in_place_s(s.cluster, SHAPE_13B) > 0
    rows = best_layout_by_gbs(s)
    assert [r["gbs"] for r in rows] == sorted(r["gbs"] for r in rows) and all(r["samples_per_s"] > 0 for r in rows)
    assert rows[0]["gbs"] <= 8  # the table starts below the search space, where layouts differ most
    # Larger batches fill the pipeline: the best throughput grows with the GBS.
    assert rows[-1]["samples_per_s"] > rows[0]["samples_per_s"]


def test_paper_settings_load_and_bad_ones_are_named(tmp_path):
    for path in sorted(SIM_DIR.glob("paper_*.yaml")):
        assert load_sim_config(path).paper.copus_speedup_vs_fastest_baseline is not None, path
    assert len(list(SIM_DIR.glob("paper_*.yaml"))) == 4
    cfg = load_sim_config(SIM_DIR / "paper_llama-2-13b_2x8-h100.yaml")
    assert setting_from(cfg).cluster.world == 16
    bad = tmp_path / "bad.yaml"
    for text, message in (("model: llama-9\ntraining: {target_loss: 2}\n", "model: unknown flavour 'llama-9'"),
                          ("model: llama-2-7b\ntraining: {target_loss: 2}\nsearch: {gbs_min: 512, gbs_max: 64}\n",
                           "search.gbs_min: 512 is larger than search.gbs_max 64"),
                          ("model: llama-2-7b\ntraining: {target_loss: 2}\nparallel: {dp: 3}\n", "cluster.nodes: 8"),
                          ("model: llama-2-7b\n", "training: Field required"),
                          ("model: llama-2-7b\ntraining: {target_loss: 2}\nclustr: {}\n", "clustr: unknown key")):
        bad.write_text(text)
        with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
            load_sim_config(bad)


def test_copus_simulate_prints_one_json_object(capsys):
    from copus.cli import main

    assert main(["simulate", str(SIM_DIR / "paper_llama-2-7b_4x8-mi210.yaml"), "--json",
                 "--set", "training.target_loss=3.0"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["policies"]) == {"copus", "static", "cbs-pessimistic", "cbs-optimistic"}
    assert all({"time_to_target_s", "reconfigurations"} <= set(p) for p in out["policies"].values())
    assert out["copus_speedup_vs_fastest_baseline"] is not None and out["paper"]["copus_speedup_vs_fastest_baseline"] == 0.05
    layouts = {(r["config"]["dp"], r["config"]["tp"], r["config"]["pp"]) for r in out["best_layout_by_gbs"]}
    assert len(layouts) > 1  # on MI210 the best layout changes with the GBS
    assert main(["simulate", str(SIM_DIR / "paper_llama-2-7b_4x8-mi210.yaml"), "--set", "cluster.node=tpu"]) == 2
    assert "cluster.node: unknown node 'tpu'" in capsys.readouterr().err
