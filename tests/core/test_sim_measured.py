"""A simulated setting whose step times are a real profile's (copus.core.simulator.MeasuredSteps,
`cluster.profile` in the simulation YAML): the emulated cluster's measured table, read as the
truth, measured where measured and fitted elsewhere."""

import json
import math
from pathlib import Path

import pytest
import yaml

from copus.config import ConfigError
from copus.core.layout import CandidateConfig
from copus.core.simulator import planner_view, search_space, simulate
from copus.sim.config import load_sim_config, setting_from

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "docs" / "results" / "profile-emulated-layout.json"


def _sim_yaml(tmp_path, **changes) -> Path:
    doc = {
        "model": "tiny", "seq_len": 128,
        "cluster": {"node": "cpu-core-emulated", "nodes": 2, "profile": str(PROFILE)},
        "batch": {"gbs": 16, "mbs": 8}, "parallel": {"dp": 2},
        "search": {"gbs_min": 4, "gbs_max": 256, "mbs": [1, 2, 4, 8, 16, 32], "layouts": [[2, 1, 1], [1, 1, 2]],
                   "dp_shard": ["none"], "recompute": ["none"]},
        "profile": {"exact": True},
        "policy": {"interval_s": 10},
        "costs": {"in_place_fixed_s": 0.5, "restart_fixed_s": 25},
        # A loss curve for this model only to exercise the truth: 1.0 + 50 / D^0.3, 5.5 at zero data.
        "training": {"target_loss": 2.5, "max_hours": 10,
                     "loss_curve": {"e": 1.0, "a": 0.0, "b": 50.0, "beta": 0.3, "initial": 5.5},
                     "critical_batch": {"flat_tokens": 16 * 128}},
        "policies": ["static"],
    }  # fmt: skip
    doc.update(changes)
    path = tmp_path / "emulated.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_the_truth_is_the_measured_table_and_its_fit_elsewhere(tmp_path):
    s = setting_from(load_sim_config(_sim_yaml(tmp_path)))
    cands, throughputs = search_space(s)
    truth = dict(zip(cands, throughputs))
    rows = [r for r in json.loads(PROFILE.read_text())["rows"] if r["status"] == "ok"]
    for r in rows:  # every measured configuration at its measured speed
        cfg = CandidateConfig(r["dp"], r["tp"], r["pp"], r["mbs"], r["gbs"])
        if cfg in truth:
            assert truth[cfg] == pytest.approx(r["gbs"] / r["step_time_s"], rel=1e-12)
    unmeasured = [c for c in cands if not any(CandidateConfig.from_dict(r) == c for r in rows)]
    assert unmeasured and all(truth[c] == pytest.approx(s.measured.model.throughput(c)) for c in unmeasured)

    def best(gbs: int) -> CandidateConfig:
        return max((c for c in cands if c.gbs == gbs), key=lambda c: truth[c])

    # The profile's layout boundary survives into the simulated truth.
    assert (best(4).dp, best(4).pp) == (1, 2) and (best(64).dp, best(64).pp) == (2, 1)


def test_a_static_run_takes_the_measured_step_time(tmp_path):
    s = setting_from(load_sim_config(_sim_yaml(tmp_path)))
    space = search_space(s)
    result = simulate(s, "static", space)
    step_s = dict(zip(*space))
    cfg = result.final
    assert result.time_to_target_s is not None and cfg.gbs == 16
    assert result.time_to_target_s == pytest.approx(result.steps * cfg.gbs / step_s[cfg], rel=1e-9)


def test_a_profile_of_another_workload_or_world_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"cluster.profile: .*profiles model tiny, seq_len 128 on 2 workers"):
        load_sim_config(_sim_yaml(tmp_path, seq_len=64))
    missing = str(tmp_path / "none.json")
    with pytest.raises(ConfigError, match="cluster.profile: .*none.json: file not found"):
        load_sim_config(_sim_yaml(tmp_path, cluster={"node": "cpu-core-emulated", "nodes": 2, "profile": missing}))
    assert math.isfinite(setting_from(load_sim_config(_sim_yaml(tmp_path))).measured.step_time(
        CandidateConfig(2, 1, 1, 8, 512)
    ))  # fmt: skip


def test_overheads_add_start_up_evaluations_and_gaps_and_the_target_is_seen_at_an_evaluation(tmp_path):
    plain = setting_from(load_sim_config(_sim_yaml(tmp_path)))
    overheads = {"startup_s": 30.0, "between_steps_s": 0.05, "eval_every_steps": 10,
                 "eval_s": {"dp2-tp1-pp1": 0.6, "dp1-tp1-pp2": 0.9}}  # fmt: skip
    priced = setting_from(load_sim_config(_sim_yaml(tmp_path, overheads=overheads)))
    space = search_space(plain)
    bare, real = simulate(plain, "static", space), simulate(priced, "static", space)
    assert real.final == bare.final and real.final.dp == 2
    # The target is seen at the first evaluation at or after the step the truth reaches it.
    assert real.steps % 10 == 0 and bare.steps <= real.steps < bare.steps + 10
    step_s = real.final.gbs / dict(zip(*space))[real.final]
    expected = 30.0 + real.steps * (step_s + 0.05) + (real.steps // 10) * 0.6
    assert real.time_to_target_s == pytest.approx(expected, rel=1e-9)


def test_an_overhead_layout_label_that_is_not_one_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"overheads.eval_s.dp2: expected a layout label such as dp2-tp1-pp1"):
        load_sim_config(_sim_yaml(tmp_path, overheads={"eval_every_steps": 10, "eval_s": {"dp2": 0.5}}))


def test_a_run_factor_slows_the_truth_by_layout_and_the_planner_still_reads_the_profile(tmp_path):
    plain = setting_from(load_sim_config(_sim_yaml(tmp_path)))
    cluster = {"node": "cpu-core-emulated", "nodes": 2, "profile": str(PROFILE), "run_factor": {"dp1-tp1-pp2": 1.25}}
    slowed = setting_from(load_sim_config(_sim_yaml(tmp_path, cluster=cluster)))
    pp2, dp2 = CandidateConfig(1, 1, 2, 2, 8), CandidateConfig(2, 1, 1, 4, 8)
    assert slowed.measured.step_time(pp2) == pytest.approx(1.25 * plain.measured.step_time(pp2), rel=1e-12)
    assert slowed.measured.step_time(dp2) == plain.measured.step_time(dp2)  # a layout not named: x1
    assert slowed.measured.profile_step_time(pp2) == plain.measured.step_time(pp2)  # what a profile reads


def test_a_run_factor_by_layout_and_mbs_comes_before_its_layouts(tmp_path):
    plain = setting_from(load_sim_config(_sim_yaml(tmp_path)))
    factors = {"dp1-tp1-pp2 mbs2": 2.0, "dp1-tp1-pp2": 1.1}
    cluster = {"node": "cpu-core-emulated", "nodes": 2, "profile": str(PROFILE), "run_factor": factors}
    slowed = setting_from(load_sim_config(_sim_yaml(tmp_path, cluster=cluster)))
    for cfg, factor in ((CandidateConfig(1, 1, 2, 2, 8), 2.0), (CandidateConfig(1, 1, 2, 4, 8), 1.1)):
        assert slowed.measured.step_time(cfg) == pytest.approx(factor * plain.measured.step_time(cfg), rel=1e-12)


def test_a_simulated_profile_reads_the_profiles_speed_not_the_runs(tmp_path):
    """What runs pay beyond a profile's reading is seen by runs only: the planner's simulated
    profile of the cluster is drawn around the profile's own figures."""
    cluster = {"node": "cpu-core-emulated", "nodes": 2, "profile": str(PROFILE), "run_factor": {"dp2-tp1-pp1": 2.0}}
    exact = {"exact": True}
    plain = setting_from(load_sim_config(_sim_yaml(tmp_path, profile=exact)))
    slowed = setting_from(load_sim_config(_sim_yaml(tmp_path, cluster=cluster, profile=exact)))
    space = search_space(slowed)
    assert planner_view(slowed, space).throughputs == planner_view(plain, search_space(plain)).throughputs
    dp2 = CandidateConfig(2, 1, 1, 4, 8)
    assert dict(zip(*space))[dp2] == pytest.approx(planner_view(slowed, space).throughputs[dp2] / 2)


def test_with_a_run_speed_band_a_run_leaves_the_one_configuration_that_runs_slow(tmp_path):
    """The emulated suite's seed 1200 in the simulator: the configuration COPUS starts in pays
    twice its profile's step time (one timing mode of two), the others what the profile says.
    Read as a slow machine (no band) the run stays in it for five decisions; with
    `policy.run_speed_band` it leaves at the first, and reaches the target a quarter sooner."""

    def run(band, first=None):
        cluster = {"node": "cpu-core-emulated", "nodes": 2, "profile": str(PROFILE)}
        if first is not None:
            cluster["run_factor"] = {first: 2.0}
        policy = {"interval_s": 10} | ({"run_speed_band": band} if band else {})
        # a profile with timing noise, as the planner of a real run reads (exact: no model to scale)
        changes = {"cluster": cluster, "policy": policy, "profile": {"exact": False}}
        doc = _sim_yaml(tmp_path, **changes, batch={"gbs": 16, "mbs": 2}, parallel={"pp": 2})
        s = setting_from(load_sim_config(doc))
        return simulate(s, "copus", search_space(s))

    start = run(None).timeline[0]["layout"]  # where COPUS starts: the profile's best at GBS 16
    first = start.removesuffix(" gbs16")
    held, banded = run(None, first), run([0.8, 1.2], first)
    assert held.timeline[0]["layout"] == banded.timeline[0]["layout"] == start
    leaves = [r.reconfigurations[0]["t"] for r in (held, banded)]
    assert leaves[1] < 11.0 < 5 * 10.0 < leaves[0]
    assert banded.time_to_target_s < 0.8 * held.time_to_target_s


@pytest.mark.parametrize(
    "cluster,field",
    [
        ({"run_factor": {"pp2": 1.2}}, "cluster.run_factor.pp2"),
        ({"run_factor": {"dp2-tp1-pp1": 0}}, "cluster.run_factor.dp2-tp1-pp1"),
        ({"profile": None, "run_factor": {"dp2-tp1-pp1": 1.1}}, "cluster.run_factor"),
    ],
)
def test_a_bad_run_factor_is_refused_naming_the_field(tmp_path, cluster, field):
    doc = {"node": "cpu-core-emulated", "nodes": 2, "profile": str(PROFILE), **cluster}
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_sim_config(_sim_yaml(tmp_path, cluster={k: v for k, v in doc.items() if v is not None}))


def test_the_planner_reads_a_real_profile_file_and_trains_at_the_truths_speed(tmp_path):
    """profile.table: the planner's table is another real profile (here one measured on another
    machine); static's layout for GBS 16 is that table's fastest, and its run takes the truth's
    step time for it; the view reports how far the table is from the truth."""
    table_file = REPO / "docs" / "results" / "profile-emulated-layout-xeon-suite.json"
    s = setting_from(load_sim_config(_sim_yaml(tmp_path, profile={"table": str(table_file)})))
    space = search_space(s)
    view = planner_view(s, space)
    believed = max((c for c in view.throughputs if c.gbs == 16), key=view.throughputs.get)
    assert (believed.dp, believed.pp, believed.mbs) == (1, 2, 1)  # the table's fastest at GBS 16
    run = simulate(s, "static", space)
    assert run.final == believed
    truth = dict(zip(*space))
    assert run.time_to_target_s == pytest.approx(run.steps * 16 / truth[believed], rel=1e-9)
    r = view.report
    assert r["source"] == "table" and r["points"] == 36 and r["fit_held_out_mape"] == pytest.approx(0.1151, abs=1e-4)
    assert r["table_vs_truth_median_ratio"] > 1.5  # that machine is faster than the truth's
    assert all(sd > 0 for sd in view.throughput_log_sd.values())


def test_a_planner_table_of_another_workload_is_refused_in_one_line(tmp_path):
    other = json.loads(PROFILE.read_text())
    other["key"]["workload"]["seq_len"] = 32
    (tmp_path / "other.json").write_text(json.dumps(other))
    with pytest.raises(ConfigError, match=r"^profile.table: .*other.json: profiles model tiny, seq_len 32"):
        load_sim_config(_sim_yaml(tmp_path, profile={"table": str(tmp_path / "other.json")}))
