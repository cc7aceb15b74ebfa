"""The typed experiment config: good input loads, bad input is refused with one clear line."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from copus.config import ConfigError, config_from_mapping, load_config
from tests.conftest import REPO


def _with(mapping: dict, path: str, value) -> dict:
    node = mapping
    *parents, last = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return mapping


def test_quickstart_and_templates_validate():
    cfg = load_config(REPO / "experiments" / "quickstart.yaml")
    assert cfg.parallel.dp * cfg.parallel.tp * cfg.parallel.pp == cfg.cluster.num_workers
    assert cfg.stop.target_val_loss is not None


def test_defaults_and_derived_values(base_mapping):
    cfg = config_from_mapping(base_mapping)
    assert cfg.world_size == 2
    assert cfg.microbatches_per_replica == 2  # 8 / (2 x 2)
    assert cfg.optimizer.lr_scaling == "sqrt"
    assert cfg.resolved_tracking_uri().startswith("sqlite:///")


BAD = [
    ("batch.gbs", 30, "batch.gbs: 30 is not divisible by parallel.dp x batch.mbs = 2 x 2"),
    ("batch.mbs", 0, "batch.mbs: Input should be greater than or equal to 1"),
    ("batch.gbs", "many", "batch.gbs: Input should be a valid integer"),
    ("optimizer.lr", -1.0, "optimizer.lr: Input should be greater than 0"),
    ("optimizer.name", "sgd", "optimizer.name: Input should be 'adamw'"),
    ("batch.foo", 3, "batch.foo: unknown key"),
    ("surprise", 1, "surprise: unknown key"),
    (
        "cluster.num_workers",
        3,
        "cluster.num_workers: 3 does not match the layout parallel.dp x tp x pp = 2 x 1 x 1 = 2",
    ),
    ("parallel.pp_schedule", "zb", "parallel.pp_schedule: Input should be '1f1b' or 'gpipe'"),
    ("workload.model", "gpt5", "workload.model: unknown flavour 'gpt5'"),
    (
        "workload.model",
        "llama-2-7b",
        "workload.model: 'llama-2-7b' (6.7B parameters) is a shape description for GPU clusters",
    ),
    ("workload.seq_len", 4096, "workload.seq_len: 4096 exceeds the flavour's max_seq_len 512"),
    ("workload.dataset.kind", "txt", "workload.dataset.path: required when workload.dataset.kind is 'txt'"),
    (
        "policy.name",
        "adaptive",
        "policy.name: Input should be 'copus', 'static', 'cbs', 'cbs-pessimistic', 'cbs-optimistic', 'copus-gbs' "
        "or 'ramp'",
    ),
    ("search.gbs_max", 4, "search.gbs_min: 8 exceeds search.gbs_max 4"),
    ("search.mbs", [1, 4], "search.mbs: must include batch.mbs 2 (got [1, 4])"),
    ("search.layouts", [[1, 1, 2]], "search.layouts: must include the starting layout parallel = [2, 1, 1]"),
    ("search.layouts", [[2, 1, 1], [3, 1, 1]], "search.layouts.1: [3, 1, 1]: 2 does not match the layout"),
    ("profile.budget_s", 0, "profile.budget_s: Input should be greater than 0"),
    ("stop", {}, "stop: set at least one of target_val_loss, max_steps, max_samples, max_wall_clock_s"),
    ("schedule.decay", "cosine", "schedule.decay_samples: required when schedule.decay is 'cosine'"),
    ("cluster.mixed_precision", "fp16", "cluster.mixed_precision: fp16 needs cluster.use_gpu: true"),
    ("reconfigure", "sometimes", "reconfigure: Input should be 'auto', 'in_place' or 'restart'"),
    ("policy.in_place_cost_s", -1, "policy.in_place_cost_s: Input should be greater than or equal to 0"),
    ("cluster.emulate", {"nodes": 2}, "cluster.emulate.link_mbit: Field required"),
    (
        "cluster.emulate",
        {"nodes": 3, "link_mbit": 100},
        "cluster.emulate.nodes: 3 does not divide cluster.num_workers 2",
    ),
    (
        "cluster.emulate",
        {"nodes": 2, "link_mbit": 100, "subnet": "10.77.0.0/29"},
        "cluster.emulate.subnet: 10.77.0.0/29 has no room for the head and 2 nodes",
    ),
    (
        "cluster.emulate",
        {"link_mbit": 100, "subnet": "10.77.0.1/24"},
        "cluster.emulate.subnet: 10.77.0.1/24 has host bits set",
    ),
    (
        "cluster.emulate",
        {"link_mbit": 100, "compute_reference_every": "run"},
        "cluster.emulate.compute_reference_every: `run` rescales the links to compute_reference_s: set it too",
    ),
    (
        "policy.run_speed_band",
        [1.1, 1.3],
        "policy.run_speed_band: expected [low, high] with 0 < low <= 1 <= high, got [1.1, 1.3]",
    ),
    ("policy.run_speed_band", [0.8], "policy.run_speed_band"),
    ("policy.run_speed_reading", "mode", "policy.run_speed_reading: Input should be 'median' or 'mean'"),
]


@pytest.mark.parametrize("path,value,message", BAD, ids=[f"{p}={v!r}" for p, v, _ in BAD])
def test_bad_values_name_the_field(base_mapping, path, value, message):
    with pytest.raises(ConfigError) as err:
        config_from_mapping(_with(base_mapping, path, value))
    text = str(err.value)
    assert text.startswith(message), text
    assert "\n" not in text


LAYOUTS = [
    (["parallel.tp=3", "cluster.num_workers=6"], "parallel.tp: 3 does not divide the model's 4 attention heads"),
    (
        ["parallel.dp=1", "parallel.tp=4", "cluster.num_workers=4"],
        "parallel.tp: 4 does not divide the model's 2 KV heads",
    ),
    (["parallel.pp=3", "cluster.num_workers=6", "batch.gbs=24"], "parallel.pp: 3 stages exceed the model's 2 layers"),
    (
        ["parallel.pp=2", "cluster.num_workers=4", "batch.gbs=4"],
        "batch.gbs: 4 gives 1 micro-batches per replica (gbs / (dp x mbs)), fewer than the 2 pipeline stages",
    ),
    (
        ["parallel.pp=2", "cluster.num_workers=4", "eval.val_samples=3"],
        "eval.val_samples: 3 gives each of the 2 replicas fewer validation samples than the 2 pipeline stages",
    ),
]


@pytest.mark.parametrize("overrides,message", LAYOUTS, ids=[" ".join(o) for o, _ in LAYOUTS])
def test_impossible_layouts_are_refused_before_anything_starts(base_mapping, overrides, message):
    with pytest.raises(ConfigError) as err:
        config_from_mapping(base_mapping, overrides)
    assert str(err.value) == message


def test_3d_layout_is_accepted(base_mapping):
    cfg = config_from_mapping(
        base_mapping, ["parallel.tp=2", "parallel.pp=2", "cluster.num_workers=8", "parallel.pp_schedule=gpipe"]
    )
    assert (cfg.parallel.dp, cfg.parallel.tp, cfg.parallel.pp, cfg.world_size) == (2, 2, 2, 8)


def test_missing_dataset_file_is_named(base_mapping, tmp_path):
    _with(base_mapping, "workload.dataset", {"kind": "txt", "path": str(tmp_path / "nope.txt")})
    with pytest.raises(ConfigError, match=r"^workload\.dataset\.path: file not found: .*nope\.txt$"):
        config_from_mapping(base_mapping)


def test_overrides_are_typed_and_nested(base_mapping):
    cfg = config_from_mapping(
        base_mapping, ["batch.gbs=16", "cluster.use_gpu=false", "stop.target_val_loss=2.5", "tracking.run_name=abc"]
    )
    assert cfg.batch.gbs == 16 and cfg.cluster.use_gpu is False and cfg.stop.target_val_loss == 2.5
    assert cfg.tracking.run_name == "abc"
    with pytest.raises(ConfigError, match=r"^--set batch\.gbs: expected key\.sub=value$"):
        config_from_mapping(base_mapping, ["batch.gbs"])
    with pytest.raises(ConfigError, match=r"^batch\.gbs\.x: cannot set below 'gbs'"):
        config_from_mapping(base_mapping, ["batch.gbs.x=1"])


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("batch:\n  gbs: [1, 2\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: line \d+ not valid YAML"):
        load_config(bad)


def _cli(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "copus.cli", *args], cwd=cwd, capture_output=True, text=True)


def test_cli_refuses_bad_input_with_exit_2_and_starts_nothing(base_mapping, tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump(base_mapping))
    for command in ("validate", "run"):
        proc = _cli(command, str(exp), "--set", "batch.gbs=7", cwd=tmp_path)
        assert proc.returncode == 2
        assert proc.stderr.strip() == "copus: batch.gbs: 7 is not divisible by parallel.dp x batch.mbs = 2 x 2"
    assert not (tmp_path / "out").exists()
    assert not (tmp_path / "mlflow.db").exists()
    proc = _cli("validate", str(tmp_path / "missing.yaml"), cwd=tmp_path)
    assert proc.returncode == 2 and "missing.yaml: experiment file not found" in proc.stderr


def test_cli_validate_prints_the_resolved_config(base_mapping, tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump(base_mapping))
    proc = _cli("validate", str(exp), "--json", "--set", "batch.gbs=16", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout)["batch"]["gbs"] == 16


def test_run_refuses_a_validation_split_smaller_than_eval_val_samples(base_mapping, tmp_path):
    text = tmp_path / "small.txt"
    text.write_text("x" * 5000)
    base_mapping["workload"]["dataset"] = {
        "kind": "txt",
        "path": str(text),
        "cache_dir": str(tmp_path / "c"),
        "val_fraction": 0.02,
    }
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump(base_mapping))
    proc = _cli("run", str(exp), cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("copus: eval.val_samples: the validation split (")
    assert "has 3 samples of seq_len 32, fewer than 8" in proc.stderr
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "out").exists()


def test_gns_command_refuses_a_single_batch_size(base_mapping, tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump(base_mapping))
    proc = _cli(
        "gns",
        str(exp),
        "--set",
        "parallel.dp=1",
        "--set",
        "cluster.num_workers=1",
        "--set",
        "batch.mbs=8",
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("copus: batch.gbs: 8 with parallel.dp 1 and batch.mbs 8 gives one batch size")


# policy.name: ramp on the base experiment (dp 2 x mbs 2: every GBS a multiple of 4), to batch.gbs 16.
RAMP = ["policy.name=ramp", "batch.gbs=16"]
LINEAR = "batch.ramp={start_gbs: 4, increment: 4, samples: 96}"

BAD_RAMPS = [
    (["policy.name=ramp"], "batch.ramp: required with policy.name: ramp ({start_gbs, increment, samples} or {table})"),
    ([LINEAR, "batch.gbs=16"], "batch.ramp: applies to policy.name: ramp only (policy.name is 'static')"),
    (["batch.ramp={start_gbs: 16, increment: 4, samples: 96}"], "batch.ramp.start_gbs: 16 must be below batch.gbs 16"),
    (
        ["batch.ramp={start_gbs: 4, increment: 8, samples: 96}"],
        "batch.ramp.increment: 8 does not divide batch.gbs - start_gbs = 16 - 4 = 12",
    ),
    (
        ["batch.ramp={start_gbs: 6, increment: 2, samples: 96}"],
        "batch.ramp.start_gbs: GBS 6 is not divisible by parallel.dp x batch.mbs = 2 x 2",
    ),
    (
        ["batch.ramp={start_gbs: 4, increment: 2, samples: 96}"],
        "batch.ramp.increment: 2 is not a multiple of parallel.dp x batch.mbs = 2 x 2",
    ),
    (
        [LINEAR, "parallel.pp=2", "cluster.num_workers=4"],
        "batch.ramp.start_gbs: GBS 4 gives 1 micro-batches per replica (gbs / (dp x mbs)), fewer than the 2 pipeline",
    ),
    (["batch.ramp={start_gbs: 4, increment: 4}"], "batch.ramp.samples: required (or give batch.ramp.table"),
    (
        ["batch.ramp={start_gbs: 4, table: [[0, 16]]}"],
        "batch.ramp.start_gbs: give start_gbs, increment and samples, or a table, not both",
    ),
    (["batch.ramp={start: 4}"], "batch.ramp.start: unknown key"),
    (["batch.ramp={increment: 0}"], "batch.ramp.increment: Input should be greater than or equal to 1"),
    (["batch.ramp.table=[]"], "batch.ramp.table: List should have at least 1 item"),
    (["batch.ramp.table=[[-1, 16]]"], "batch.ramp.table.0.0: Input should be greater than or equal to 0"),
    (["batch.ramp.table=[[8, 4], [64, 16]]"], "batch.ramp.table.0: the first entry must be at 0 samples (got 8)"),
    (
        ["batch.ramp.table=[[0, 4], [64, 8], [32, 16]]"],
        "batch.ramp.table.2: samples must increase from entry to entry (32 after 64)",
    ),
    (["batch.ramp.table=[[0, 4], [64, 8]]"], "batch.ramp.table.1: the last GBS 8 must be batch.gbs 16"),
    (
        ["batch.ramp.table=[[0, 4], [32, 6], [64, 16]]"],
        "batch.ramp.table.1: GBS 6 is not divisible by parallel.dp x batch.mbs = 2 x 2",
    ),
    ([LINEAR, "policy.layout=best"], "policy.layout: 'best' applies to the static policy"),
]


@pytest.mark.parametrize("overrides,message", BAD_RAMPS, ids=[" ".join(o) for o, _ in BAD_RAMPS])
def test_bad_ramps_name_the_field(base_mapping, overrides, message):
    policy = [] if any(o.startswith("batch.gbs") for o in overrides) else RAMP
    with pytest.raises(ConfigError) as err:
        config_from_mapping(base_mapping, policy + overrides)
    text = str(err.value)
    assert text.startswith(message), text
    assert "\n" not in text


def test_a_ramp_starts_at_its_first_gbs_needs_no_controller_and_travels_in_the_run_plan(base_mapping):
    from copus.cluster.driver import prepare_data
    from copus.core.ramp import BatchRamp
    from copus.train.worker_plan import plan_from_config

    cfg = config_from_mapping(base_mapping, RAMP + [LINEAR, "gns.enabled=false"])  # no noise scale needed
    assert cfg.batch_ramp() == BatchRamp.linear(4, 4, 96, 16)
    assert cfg.start_config().gbs == 4 and cfg.batch.gbs == 16 and not cfg.adaptive
    _, plan = prepare_data(cfg, lambda line: None)  # `copus run`'s workers follow the ramp
    assert plan.gbs == 4 and plan.ramp.points == ((0, 4), (32, 8), (64, 12), (96, 16))
    # A calibration or profile of the experiment trains at the batch sizes it chooses.
    assert plan_from_config(cfg, "train.bin", "val.bin", "uint16").ramp is None
    table = config_from_mapping(base_mapping, RAMP + ["batch.ramp.table=[[0, 8], [100, 16]]"])
    assert table.batch_ramp().points == ((0, 8), (100, 16)) and table.start_config().gbs == 8
    # Other policies are as they were: no ramp in their plan, static needs no controller, cbs does.
    static = config_from_mapping(base_mapping)
    assert static.batch_ramp() is None and static.start_config().gbs == 8 and not static.adaptive
    assert prepare_data(static, lambda line: None)[1].ramp is None
    assert config_from_mapping(base_mapping, ["policy.name=cbs"]).adaptive
    assert config_from_mapping(base_mapping, ["policy.layout=best"]).adaptive


def test_a_suite_may_list_ramp_beside_policies_that_drop_the_schedule(base_mapping, tmp_path):
    """A suite's experiment carries batch.ramp for its ramp run; the other policies' runs drop it
    (batch.ramp=null), as `copus compare` must set them up."""
    from copus.config import load_suite

    experiment = _with(_with(base_mapping, "policy.name", "ramp"), "batch.gbs", 16)
    _with(experiment, "batch.ramp", {"start_gbs": 4, "increment": 4, "samples": 96})
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({"experiment": experiment, "policies": ["ramp", "static"]}))
    loaded, raw = load_suite(suite)
    assert loaded.policies == ["ramp", "static"]
    assert config_from_mapping(raw, ["policy.name=ramp"]).batch_ramp() is not None
    static = config_from_mapping(raw, ["policy.name=static", "batch.ramp=null"])
    assert static.batch.ramp is None and static.start_config().gbs == 16


def test_a_suite_tunes_on_its_tuning_seeds_and_evaluates_on_others(base_mapping, tmp_path):
    """Suite protocol fields: tuning and evaluation seeds (repeat r runs evaluation_seeds[r]) and
    the `tune` section, whose candidates are valid runs of the experiment."""
    from copus.config import load_suite, tuning_candidates

    suite = {
        "experiment": base_mapping,
        "policies": ["copus", "static"],
        "tuning_seeds": [100, 101],
        "evaluation_seeds": [7, 3, 9],
        "tune": {"static_gbs": [4, 6, 8], "ramp": {"start_gbs": 4, "increment": 4, "gbs": 16, "samples": [32, 64]}},
    }
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite))
    loaded, raw = load_suite(tmp_path / "suite.yaml")
    assert loaded.evaluation_repeats == 3 and [loaded.run_seed(0, r, 1) for r in range(3)] == [7, 3, 9]
    candidates = tuning_candidates(loaded, config_from_mapping(raw))
    assert [c.name for c in candidates] == ["static-gbs4", "static-gbs6", "static-gbs8", "ramp-32", "ramp-64"]
    # GBS 6 does not divide over dp 2 x MBS 2: it validates in another layout of the search space
    # (the profile's fastest for it is what runs).
    six = config_from_mapping(raw, list(candidates[1].overrides))
    assert six.batch.gbs == 6 and six.policy.layout == "best" and (six.parallel.dp, six.parallel.pp) == (1, 2)
    ramp = config_from_mapping(raw, list(candidates[4].overrides))
    assert ramp.policy.name == "ramp" and ramp.batch_ramp().end_samples == 64 and ramp.batch.gbs == 16
    # Old suites are as they were: no tuning, seeds from workload.seed and `repeats`.
    plain = load_suite(_suite_file(tmp_path, {"experiment": base_mapping, "repeats": 2}))[0]
    assert plain.evaluation_repeats == 2 and plain.run_seed(5, 1, 3) == 6 and plain.tune is None
    vary = load_suite(_suite_file(tmp_path, {"experiment": base_mapping, "repeats": 2, "seeds": "vary"}))[0]
    assert vary.run_seed(5, 1, 3) == 5 + 1 * 4 + 3


def _suite_file(tmp_path, suite: dict):
    (tmp_path / "plain.yaml").write_text(yaml.safe_dump(suite))
    return tmp_path / "plain.yaml"
