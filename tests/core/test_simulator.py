"""The simulator: invariants of simulated runs, proof that it drives the planner of
`copus.core` (patching the planner changes what the simulation does), and that its training
truth stands apart from what the planner believes (a wrong mapping costs time; a calibration
file sets the truth). Where a test is about the mapping or the truth, the planner reads the
present truth exactly (`ORACLE`): by default its estimate lags and errs as a real one
(tests/core/test_sim_model.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from copus.config import ConfigError
from copus.core import planner as planner_module
from copus.core.datasheets import NODES
from copus.core.layout import CandidateConfig
from copus.core.simulator import (
    CalibratedCriticalBatch,
    Cluster,
    CriticalBatch,
    NoiseEstimate,
    Setting,
    best_layout_by_gbs,
    search_space,
    simulate,
    step_terms,
    step_time,
)
from copus.sim.config import load_sim_config, setting_from
from workloads.flavours import FLAVOURS

SHAPE_13B = FLAVOURS["llama-2-13b"].shape()
SIM_DIR = Path(__file__).resolve().parents[2] / "experiments" / "sim"
ORACLE = NoiseEstimate(noise=0.0, half_life_share=0.0, min_half_life=0.0)


def setting(**changes) -> Setting:
    cluster = Cluster(NODES["h100-sxm-8"], 2)
    base = Setting(
        cluster,
        SHAPE_13B,
        4096,
        CandidateConfig(2, 2, 4, 1, 256),
        gbs_min=64,
        gbs_max=2048,
        mbs=(1, 2),
        target_loss=3.0,
        interval_s=600,
    )
    return replace(base, **changes)


def test_static_never_reconfigures_and_copus_adapts():
    s = setting()
    space = search_space(s)
    static, copus = simulate(s, "static", space), simulate(s, "copus", space)
    assert static.reconfigurations == [] and len({point["layout"] for point in static.timeline}) == 1
    assert copus.reconfigurations and copus.time_to_target_s < static.time_to_target_s


def test_a_flat_noise_scale_leaves_the_cbs_gbs_alone():
    # c x B_noise = 256 samples, the start: the critical batch never moves, nor does CBS (read
    # exactly: a noisy estimate would move it).
    s = setting(critical=CriticalBatch(flat_tokens=256 * 4096), estimate=ORACLE)
    space = search_space(s)
    for policy in ("cbs-pessimistic", "cbs-optimistic", "cbs"):
        r = simulate(s, policy, space)
        assert r.time_to_target_s is not None
        assert {c["to"]["gbs"] for c in r.reconfigurations} <= {r.start.gbs}, policy
    assert simulate(s, "cbs", space).reconfigurations == []


def test_faster_hardware_shortens_the_time_to_target():
    s = setting()
    node = NODES["h100-sxm-8"]
    faster = replace(
        node,
        accelerator=replace(node.accelerator, peak_bf16_flops=2 * node.accelerator.peak_bf16_flops),
        intra_node_bandwidth=2 * node.intra_node_bandwidth,
        inter_node_bandwidth=2 * node.inter_node_bandwidth,
    )
    quick = replace(s, cluster=Cluster(faster, 2))
    for policy in ("static", "copus"):
        assert simulate(quick, policy).time_to_target_s < simulate(s, policy).time_to_target_s
    cfg = CandidateConfig(2, 2, 4, 1, 256)
    assert step_time(quick.cluster, SHAPE_13B, 4096, cfg) < step_time(s.cluster, SHAPE_13B, 4096, cfg)


def test_the_simulator_drives_the_planner_of_copus_core(monkeypatch):
    s = setting()
    assert simulate(s, "copus").reconfigurations  # unpatched: the planner moves the GBS
    calls = []

    def never(self, current, b_noise, interval_s, costs, allowed=None, target=None, **kwargs):
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
    for text, message in (
        ("model: llama-9\ntraining: {target_loss: 2}\n", "model: unknown flavour 'llama-9'"),
        (
            "model: llama-2-7b\ntraining: {target_loss: 2}\nsearch: {gbs_min: 512, gbs_max: 64}\n",
            "search.gbs_min: 512 is larger than search.gbs_max 64",
        ),
        ("model: llama-2-7b\ntraining: {target_loss: 2}\nparallel: {dp: 3}\n", "cluster.nodes: 8"),
        ("model: llama-2-7b\n", "training: Field required"),
        ("model: llama-2-7b\ntraining: {target_loss: 2}\nclustr: {}\n", "clustr: unknown key"),
        (
            "model: llama-2-7b\ntraining: {target_loss: 2}\npolicies: [static, ramp]\n",
            "policies: 'ramp' needs the ramp section",
        ),
    ):
        bad.write_text(text)
        with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
            load_sim_config(bad)


def test_copus_simulate_prints_one_json_object(capsys):
    from copus.cli import main

    # The protocol (tuned baselines, five seeds) is tests/core/test_sim_protocol.py's; the space
    # held to one sharding and recomputation mode keeps this one quick.
    quick = ["training.target_loss=3.0", "protocol=null", "search.dp_shard=[optimizer]", "search.recompute=[none]"]
    argv = ["simulate", str(SIM_DIR / "paper_llama-2-7b_4x8-mi210.yaml"), "--json"]
    assert main([*argv, *(x for item in quick for x in ("--set", item))]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["policies"]) == {"copus", "static", "cbs-pessimistic", "cbs-optimistic"}
    keys = {"time_to_target_s", "reconfigurations", "layout_changes", "replica_changes"}
    assert all(keys <= set(p) for p in out["policies"].values())
    assert out["protocol"] is None
    assert (
        out["copus_speedup_vs_fastest_baseline"] is not None
        and out["paper"]["copus_speedup_vs_fastest_baseline"] == 0.05
    )
    assert out["mapping_error"] == 1.0 and out["estimate"]["noise"] == 0.35
    assert out["estimate"]["half_life_share"] == 0.05 and out["estimate"]["min_half_life"] == 8
    assert out["truth"]["critical_batch"].startswith("published fit") and out["truth"]["calibration"] is None
    # the planner's efficiency from a simulated calibration, reported against the truth
    calibration = out["planner"]["calibration"]
    assert calibration["source"] == "simulated calibration" and calibration["cost_h"] > 0
    assert {"c", "c_true", "b_crit", "b_crit_true"} <= set(calibration["branches"][0])
    layouts = {(r["config"]["dp"], r["config"]["tp"], r["config"]["pp"]) for r in out["best_layout_by_gbs"]}
    assert len(layouts) > 1  # on MI210 the best layout changes with the GBS
    assert main(["simulate", str(SIM_DIR / "paper_llama-2-7b_4x8-mi210.yaml"), "--set", "cluster.node=tpu"]) == 2
    assert "cluster.node: unknown node 'tpu'" in capsys.readouterr().err


def test_the_truth_ignores_what_the_planner_believes():
    s = setting()
    space = search_space(s)
    believer = replace(s, form="lr-aware", critical_factor=5.0)
    assert simulate(believer, "static", space).time_to_target_s == simulate(s, "static", space).time_to_target_s
    # The planner is told m x B_crit / c: its own c x b_noise is m times the true critical batch.
    wrong = replace(believer, estimate=replace(ORACLE, mapping_error=4.0))
    seen = simulate(wrong, "copus", space).timeline[1:]
    assert seen and all(5.0 * p["b_noise"] == pytest.approx(4.0 * p["b_crit"]) for p in seen)


def test_a_noisy_estimate_is_deterministic_for_its_seed():
    # No lag, so the ratio to the present truth is the noise alone.
    s = replace(setting(), estimate=replace(ORACLE, noise=0.5, seed=3))
    space = search_space(s)
    runs = [simulate(s, "cbs", space) for _ in range(2)] + [
        simulate(replace(s, estimate=replace(ORACLE, noise=0.5, seed=4)), "cbs", space)
    ]
    ratios = [[p["b_noise"] * 2.0 / p["b_crit"] for p in r.timeline[1:]] for r in runs]
    assert ratios[0] == ratios[1] and ratios[0] != ratios[2]
    assert min(ratios[0]) < 0.8 and max(ratios[0]) > 1.25  # sigma 0.5: the estimate scatters both ways
    gaussian = NoiseEstimate(noise=2.0, distribution="gaussian")
    rng = gaussian.rng()
    assert min(gaussian.factor(rng) for _ in range(200)) == 0.01  # clipped: an estimate stays positive


def test_a_wrong_mapping_costs_time_to_target():
    # The MI210 paper setting, cheaper (an earlier target), with room below GBS 64 where the early
    # critical batch lies. Every SE form applies c, so with mapping error 1 the planner's SE is
    # the truth's (hysteresis aside); read exactly, without lag or noise, and without the LR
    # transient: the effect under test is the mapping's. The space held to one sharding and no
    # recomputation (Megatron's distributed optimiser), not the space's either.
    overrides = ["training.target_loss=3.0", "search.gbs_min=16", "training.transient_steps=0"]
    overrides += ["search.dp_shard=[optimizer]", "search.recompute=[none]"]
    # The configured c, as a run without a calibration: a calibration measures the mapping error
    # away (c = B_crit / the noise scale a run reads), which is what it is for.
    overrides += ["calibration.use=false"]
    s = setting_from(load_sim_config(SIM_DIR / "paper_llama-2-7b_4x8-mi210.yaml", overrides))
    space = search_space(s)
    ttt = {
        m: simulate(replace(s, estimate=replace(ORACLE, mapping_error=m)), "copus", space).time_to_target_s
        for m in (0.25, 1.0, 10.0)
    }
    assert all(v is not None for v in ttt.values()), ttt
    # Too small: stays at small batches the late critical batch outgrows; too large: grows early.
    # Neither beats the right mapping, and growing early costs measurably. (With sharding and
    # recomputation in the memory model small batches run nearly as fast as the right ones here,
    # so the too-small mapping costs little: docs/simulator_sensitivity.md.)
    assert ttt[0.25] >= ttt[1.0] and ttt[10.0] > 1.02 * ttt[1.0], ttt


def _calibration(path: Path, points: list[dict]) -> Path:
    path.write_text(json.dumps({"id": "test", "reference_gbs": 64, "branch_points": points}))
    return path


def test_the_truth_comes_from_a_calibration_file(tmp_path, monkeypatch):
    # Two branch points: B_crit 20 sequences at loss 4 (mid-decrement 3.9), 100 at loss 3; held beyond.
    cal = CalibratedCriticalBatch.from_branch_points(
        [{"val_loss": 3.0, "b_crit": 100.0}, {"val_loss": 4.0, "b_crit": 20.0, "decrement": 0.2}], 4096
    )
    assert cal.tokens(3.45) == pytest.approx(60.0 * 4096)
    assert cal.tokens(2.0) == 100.0 * 4096 and cal.tokens(9.0) == 20.0 * 4096
    sim = tmp_path / "sim.yaml"
    sim.write_text(
        "model: llama-2-13b\ncluster: {nodes: 2}\nbatch: {gbs: 1024}\nsearch: {gbs_min: 64, gbs_max: 1024}\n"
        "policies: [static]\ntraining: {target_loss: 3.0, max_hours: 20000, calibration: tiny.json}\n"
    )
    tiny = [{"val_loss": 3.0, "b_crit": 4.0, "b_crit_low": 3.0}, {"val_loss": 5.0, "b_crit": 4.0}]
    _calibration(tmp_path / "tiny.json", tiny + [{"val_loss": 4.0, "b_crit": None}])  # a null b_crit is skipped
    _calibration(tmp_path / "huge.json", [{"val_loss": 3.0, "b_crit": 1e6}])
    with pytest.raises(ConfigError, match="training.calibration: file not found"):
        load_sim_config(sim)  # relative to the current directory (as every path), not to the simulation file
    monkeypatch.chdir(tmp_path)
    slow_cfg = load_sim_config(sim)
    assert slow_cfg.training.calibration == str(tmp_path / "tiny.json")
    slow, fast = (
        setting_from(load_sim_config(sim, [f"training.calibration={name}"])) for name in ("tiny.json", "huge.json")
    )
    assert slow.critical.tokens(3.5) == 4.0 * 4096 and "tiny.json" in slow.critical.source
    # With a critical batch of 4 sequences a step of 1024 is worth about 4 samples: ~250x slower.
    t_slow, t_fast = (simulate(x, "static").time_to_target_s for x in (slow, fast))
    assert t_fast is not None and t_slow is not None and t_slow > 100 * t_fast


def test_bad_estimate_and_calibration_fields_are_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the calibration files below are named relative to it
    sim = tmp_path / "sim.yaml"
    sim.write_text("model: llama-2-7b\ntraining: {target_loss: 2}\n")
    _calibration(tmp_path / "neg.json", [{"val_loss": 3.0, "b_crit": -1}])
    _calibration(tmp_path / "none.json", [{"val_loss": 3.0, "b_crit": None}])
    (tmp_path / "list.json").write_text("[1, 2]")
    for override, message in (
        ("estimate.mapping_error=0", "estimate.mapping_error: Input should be greater than 0"),
        ("estimate.noise=-0.1", "estimate.noise: Input should be greater than or equal to 0"),
        ("estimate.distribution=cauchy", "estimate.distribution: Input should be 'lognormal' or 'gaussian'"),
        ("estimate.seed=x", "estimate.seed: Input should be a valid integer"),
        ("estimate.noize=1", "estimate.noize: unknown key"),
        ("estimate.half_life_share=2", "estimate.half_life_share: Input should be less than or equal to 1"),
        ("estimate.min_half_life=-1", "estimate.min_half_life: Input should be greater than or equal to 0"),
        ("training.transient_steps=-1", "training.transient_steps: Input should be greater than or equal to 0"),
        ("training.transient_efficiency=0", "training.transient_efficiency: Input should be greater than 0"),
        ("training.loss_curve.initial=0", "training.loss_curve.initial: Input should be greater than 0"),
        ("protocol.seeds=0", "protocol.seeds: Input should be greater than or equal to 1"),
        ("training.calibration=missing.json", "training.calibration: file not found: .*missing.json$"),
        (
            "training.calibration=neg.json",
            r"training.calibration: .*neg.json: branch_points\[0\].b_crit: expected a positive",
        ),
        (
            "training.calibration=none.json",
            "training.calibration: .*none.json: branch_points: no branch point has a finite b_crit",
        ),
        (
            "training.calibration=list.json",
            "training.calibration: .*list.json: branch_points: expected a non-empty list",
        ),
    ):
        with pytest.raises(ConfigError, match=f"^{sim}: {message}") as err:
            load_sim_config(sim, [override])
        assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="training.calibration: give either a calibration or training.critical_batch"):
        load_sim_config(sim, ["training.calibration=neg.json", "training.critical_batch.alpha_b=0.3"])


@pytest.mark.parametrize("framework", ["plain", "megatron"])
def test_the_mfu_curve_is_the_nodes_unless_the_setting_gives_one(framework):
    # Each micro-batch's compute is FLOPs / (peak x MFU(w)), w = mbs x seq_len / tp tokens: what
    # the curve set in the YAML says, and the datasheet's where it sets nothing.
    path = SIM_DIR / "paper_llama-2-13b_2x8-h100.yaml"
    fw = [f"cluster.framework={framework}"]
    plain = setting_from(load_sim_config(path, fw))
    set_ = setting_from(load_sim_config(path, [*fw, "cluster.mfu_max=0.4", "cluster.mfu_half_tokens=512"]))
    assert plain.cluster.node == NODES["h100-sxm-8"]
    acc = set_.cluster.node.accelerator
    assert (acc.mfu_max, acc.mfu_half_tokens) == (0.4, 512.0) and acc.peak_bf16_flops == 989.4e12
    cfg = CandidateConfig(4, 2, 2, 2, 64)
    w = cfg.mbs * plain.seq_len / cfg.tp
    ratio = NODES["h100-sxm-8"].accelerator.mfu(w) / acc.mfu(w)
    compute = [step_terms(s.cluster, s.shape, s.seq_len, cfg).compute for s in (plain, set_)]
    assert compute[1] / compute[0] == pytest.approx(ratio, rel=1e-12)
    with pytest.raises(ConfigError, match="cluster.mfu_max"):
        load_sim_config(path, ["cluster.mfu_max=1.5"])


@pytest.mark.parametrize("framework", ["plain", "megatron"])
def test_the_mfu_curve_reads_the_micro_batchs_tokens_when_asked(framework):
    # mfu_tokens=micro_batch: a tp rank's matmuls keep all mbs x seq_len tokens as rows (Megatron),
    # so the curve reads w = mbs x seq_len where the default reads the rank's share, w / tp; the
    # rank's FLOPs are the same, so compute moves by exactly the two widths' MFU ratio, and not
    # at all without tensor parallelism.
    path = SIM_DIR / "paper_llama-2-13b_2x8-h100.yaml"
    fw = [f"cluster.framework={framework}"]
    rank = setting_from(load_sim_config(path, fw))
    rows = setting_from(load_sim_config(path, [*fw, "cluster.mfu_tokens=micro_batch"]))
    acc = rows.cluster.node.accelerator
    assert acc.mfu_tokens == "micro_batch" and rank.cluster.node.accelerator.mfu_tokens == "rank"
    for cfg in (CandidateConfig(2, 8, 1, 1, 64), CandidateConfig(4, 2, 2, 2, 64), CandidateConfig(16, 1, 1, 2, 64)):
        tokens = cfg.mbs * rank.seq_len
        ratio = acc.mfu(tokens / cfg.tp) / acc.mfu(tokens)
        compute = [step_terms(s.cluster, s.shape, s.seq_len, cfg).compute for s in (rank, rows)]
        assert compute[1] / compute[0] == pytest.approx(ratio, rel=1e-12)
        assert (ratio < 1.0) == (cfg.tp > 1)
    with pytest.raises(ConfigError, match="cluster.mfu_tokens"):
        load_sim_config(path, ["cluster.mfu_tokens=columns"])
