"""Malformed experiment files through `copus run`: each gets one line naming the field or file,
exit code 2, and nothing starts (no output directory, no Ray, no MLflow database); YAML is
loaded safely (a tag that would construct an object is refused, and nothing it names runs)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from copus.cli import main


def _set(mapping: dict, dotted: str, value) -> dict:
    out = copy.deepcopy(mapping)
    node = out
    *parents, leaf = dotted.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    if value is _DELETE:
        node.pop(leaf, None)
    else:
        node[leaf] = value
    return out


_DELETE = object()

# (id, YAML text or {dotted key: value} changes to the valid base experiment, start of the message)
CASES = [
    ("syntax", "batch: {gbs: 8\n", "{file}: line 2 not valid YAML"),
    ("tab-indent", "batch:\n\tgbs: 8\n", "{file}: line 2 not valid YAML"),
    ("bad-indent", "batch:\n  gbs: 8\n mbs: 2\n", "{file}: line 3 not valid YAML"),
    ("duplicate-key", "batch:\n  gbs: 8\n  gbs: 16\n", "{file}: line 3 not valid YAML (duplicate key 'gbs')"),
    (
        "python-object-tag",
        "x: !!python/object/apply:os.system ['touch {marker}']\n",
        "{file}: line 1 not valid YAML (could not determine a constructor for the tag",
    ),
    ("python-name-tag", "x: !!python/name:os.system\n", "{file}: line 1 not valid YAML"),
    ("top-level-list", "- batch\n- stop\n", "(top level): expected a mapping of sections"),
    ("top-level-scalar", "just words\n", "(top level): expected a mapping of sections"),
    ("binary-file", b"\xff\xfe\x00batch", "{file}: cannot read the experiment file"),
    ("unknown-section", {"surprise": 1}, "surprise: unknown key"),
    ("unknown-key", {"batch.gbss": 8}, "batch.gbss: unknown key"),
    ("gbs-type", {"batch.gbs": "many"}, "batch.gbs: Input should be a valid integer"),
    ("gbs-list", {"batch.gbs": [8, 16]}, "batch.gbs: Input should be a valid integer"),
    ("mbs-zero", {"batch.mbs": 0}, "batch.mbs: Input should be greater than or equal to 1"),
    ("lr-negative", {"optimizer.lr": -0.1}, "optimizer.lr: Input should be greater than 0"),
    ("lr-string", {"optimizer.lr": "fast"}, "optimizer.lr: Input should be a valid number"),
    ("section-scalar", {"batch": 8}, "batch: Input should be a valid dictionary"),
    ("ramp-without-schedule", {"policy.name": "ramp"}, "batch.ramp: required with policy.name: ramp"),
    (
        "ramp-schedule-without-policy",
        {"batch.gbs": 16, "batch.ramp": {"start_gbs": 4, "increment": 4, "samples": 64}},
        "batch.ramp: applies to policy.name: ramp only (policy.name is 'static')",
    ),
    (
        "ramp-increment",
        {"policy.name": "ramp", "batch.gbs": 16, "batch.ramp": {"start_gbs": 4, "increment": 8, "samples": 64}},
        "batch.ramp.increment: 8 does not divide batch.gbs - start_gbs = 16 - 4 = 12",
    ),
    (
        "ramp-table-unsorted",
        {"policy.name": "ramp", "batch.gbs": 16, "batch.ramp": {"table": [[0, 4], [64, 8], [32, 16]]}},
        "batch.ramp.table.2: samples must increase from entry to entry (32 after 64)",
    ),
    (
        "tp-divides-heads",
        {"parallel.tp": 3, "cluster.num_workers": 6},
        "parallel.tp: 3 does not divide the model's 4 attention heads",
    ),
    (
        "pp-exceeds-layers",
        {"parallel.dp": 1, "parallel.pp": 4, "cluster.num_workers": 4, "batch.gbs": 8},
        "parallel.pp: 4 stages exceed the model's 2 layers",
    ),
    ("workers-mismatch", {"cluster.num_workers": 3}, "cluster.num_workers: 3 does not match the layout"),
    ("gbs-indivisible", {"batch.gbs": 30}, "batch.gbs: 30 is not divisible by parallel.dp x batch.mbs = 2 x 2"),
    (
        "too-few-microbatches",
        {"parallel.dp": 1, "parallel.pp": 2, "batch.gbs": 2},
        "batch.gbs: 2 gives 1 micro-batches per replica",
    ),
    (
        "gbs-bounds-reversed",
        {"search.gbs_min": 64, "search.gbs_max": 16},
        "search.gbs_min: 64 exceeds search.gbs_max 16",
    ),
    ("search-mbs", {"search.mbs": [1, 4]}, "search.mbs: must include batch.mbs 2"),
    ("policy", {"policy.name": "adaptive"}, "policy.name: Input should be 'copus'"),
    ("efficiency", {"policy.efficiency": "magic"}, "policy.efficiency: Input should be 'pollux' or 'lr-aware'"),
    ("reconfigure", {"reconfigure": "sometimes"}, "reconfigure: Input should be 'auto', 'in_place' or 'restart'"),
    ("no-stop-rule", {"stop": {}}, "stop: set at least one of"),
    ("target-negative", {"stop.target_val_loss": -1}, "stop.target_val_loss: Input should be greater than 0"),
    ("unknown-model", {"workload.model": "gpt5"}, "workload.model: unknown flavour 'gpt5'"),
    (
        "gpu-only-model",
        {"workload.model": "llama-2-7b"},
        "workload.model: 'llama-2-7b' (6.7B parameters) is a shape description",
    ),
    ("seq-too-long", {"workload.seq_len": 4096}, "workload.seq_len: 4096 exceeds the flavour's max_seq_len 512"),
    ("fp16-on-cpu", {"cluster.mixed_precision": "fp16"}, "cluster.mixed_precision: fp16 needs cluster.use_gpu: true"),
    (
        "dataset-path-missing",
        {"workload.dataset": {"kind": "txt"}},
        "workload.dataset.path: required when workload.dataset.kind is 'txt'",
    ),
    (
        "dataset-not-found",
        {"workload.dataset": {"kind": "txt", "path": "{tmp}/nowhere.txt"}},
        "workload.dataset.path: file not found: {tmp}/nowhere.txt",
    ),
    (
        "dataset-folder-without-files",
        {"workload.dataset": {"kind": "parquet", "path": "{tmp}"}},
        "workload.dataset.path: file not found: {tmp}",
    ),
    (
        "dataset-empty",
        {"workload.dataset": {"kind": "txt", "path": "{tmp}/empty.txt", "cache_dir": "{tmp}/cache"}},
        "{tmp}/empty.txt: no text: the train split has 0 tokens",
    ),
    (
        "dataset-too-small",
        {"workload.dataset": {"kind": "txt", "path": "{tmp}/small.txt", "cache_dir": "{tmp}/cache"}},
        "workload.dataset.path: the train split",
    ),
    (
        "jsonl-not-json",
        {"workload.dataset": {"kind": "jsonl", "path": "{tmp}/bad.jsonl", "cache_dir": "{tmp}/cache"}},
        "{tmp}/bad.jsonl:2: not valid JSON",
    ),
    (
        "bin-odd-size",
        {"workload.dataset": {"kind": "bin", "path": "{tmp}/odd.bin", "cache_dir": "{tmp}/cache"}},
        "{tmp}/odd.bin: size 3 is not a multiple of 2 bytes",
    ),
]


def _fill(value, tmp: Path, marker: Path):
    if isinstance(value, str):
        return value.replace("{tmp}", str(tmp)).replace("{marker}", str(marker))
    if isinstance(value, dict):
        return {k: _fill(v, tmp, marker) for k, v in value.items()}
    return value


@pytest.mark.parametrize("case,content,message", CASES, ids=[c[0] for c in CASES])
def test_a_malformed_experiment_is_named_and_nothing_starts(
    base_mapping, tmp_path, capsys, monkeypatch, case, content, message
):
    data = tmp_path / "data"
    data.mkdir()
    (data / "empty.txt").write_text("")
    (data / "small.txt").write_text("tiny")
    (data / "bad.jsonl").write_text('{"text": "ok"}\n{oops\n')
    (data / "odd.bin").write_bytes(b"\x01\x02\x03")
    marker = tmp_path / "constructed"
    experiment = tmp_path / "experiment.yaml"
    if isinstance(content, dict):
        mapping = base_mapping
        for key, value in content.items():
            mapping = _set(mapping, key, _fill(value, data, marker))
        experiment.write_text(yaml.safe_dump(mapping))
    elif isinstance(content, bytes):
        experiment.write_bytes(content)
    else:
        experiment.write_text(_fill(content, data, marker))

    expected = "copus: " + _fill(message, data, marker).replace("{file}", str(experiment))
    assert_refused_before_start(experiment, expected, base_mapping, tmp_path, capsys, monkeypatch)
    assert not marker.exists()


def assert_refused_before_start(
    experiment: Path, expected: str, base_mapping: dict, tmp_path: Path, capsys, monkeypatch
) -> str:
    """`copus run experiment` exits 2 with one line starting with `expected`, and starts nothing."""
    import copus.cluster.driver as driver

    ray_starts: list = []  # Ray may be up already (other tests): what matters is that this run never asks for it
    monkeypatch.setattr(driver, "join_cluster", lambda cfg, echo: ray_starts.append(cfg))
    assert main(["run", str(experiment)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(expected), err
    assert err.count("\n") == 1, err  # one line
    out = Path(base_mapping["output_dir"])
    assert not out.exists() and not (tmp_path / "mlflow.db").exists() and ray_starts == []
    return err


def test_more_than_thirty_cases():
    assert len(CASES) >= 30


def test_missing_and_folder_experiment_paths(tmp_path, capsys):
    assert main(["run", str(tmp_path / "none.yaml")]) == 2
    assert capsys.readouterr().err == f"copus: {tmp_path / 'none.yaml'}: experiment file not found\n"
    assert main(["validate", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"copus: {tmp_path}: experiment file not found\n"


_PROTOCOL = {"tuning_seeds": [100], "evaluation_seeds": [1, 2], "tune": {"static_gbs": [8]}}
# (id, suite keys over a valid tuned suite (None: key removed), start of the message after the file)
SUITE_CASES = [
    ("seeds-overlap", {"evaluation_seeds": [100, 2]}, "evaluation_seeds: 100 is also a tuning seed"),
    ("tune-without-tuning-seeds", {"tuning_seeds": None}, "tuning_seeds: tune and tuning_seeds go together"),
    ("tuning-seeds-without-tune", {"tune": None}, "tune: tune and tuning_seeds go together"),
    ("tune-without-evaluation-seeds", {"evaluation_seeds": None}, "evaluation_seeds: required with tune"),
    ("repeats-against-seeds", {"repeats": 3}, "repeats: 3 with 2 evaluation_seeds"),
    ("seeds-vary", {"seeds": "vary"}, "seeds: 'vary' with evaluation_seeds"),
    ("seed-twice", {"evaluation_seeds": [1, 1]}, "evaluation_seeds: 1 listed twice"),
    ("seed-negative", {"tuning_seeds": [-1]}, "tuning_seeds.0: Input should be greater than or equal to 0"),
    ("tune-empty", {"tune": {}}, "tune: give static_gbs, ramp or both"),
    ("tune-unknown-key", {"tune": {"static_gbs": [8], "ramps": 1}}, "tune.ramps: unknown key"),
    ("static-gbs-off-grid", {"tune": {"static_gbs": [5]}}, "tune.static_gbs.0: GBS 5 is not a GBS of the search space"),
    (
        "ramp-bad-increment",
        {"tune": {"ramp": {"start_gbs": 4, "increment": 5, "gbs": 16, "samples": [32]}}},
        "tune.ramp (ramp-32): batch.ramp.increment: 5 does not divide",
    ),
    ("ramp-without-lengths", {"tune": {"ramp": {"start_gbs": 4, "increment": 4}}}, "tune.ramp.samples: Field required"),
]


@pytest.mark.parametrize("case,changes,message", SUITE_CASES, ids=[c[0] for c in SUITE_CASES])
def test_a_bad_suite_protocol_is_named_and_nothing_starts(base_mapping, tmp_path, capsys, case, changes, message):
    out = tmp_path / "cmp"
    suite = {
        "experiment": base_mapping,
        "policies": ["copus", "static"],
        "output_dir": str(out),
        **_PROTOCOL,
        **changes,
    }
    suite = {k: v for k, v in suite.items() if v is not None}
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(suite))
    assert main(["compare", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"copus: {path}: {message}"), err
    assert err.count("\n") == 1, err  # one line
    assert not out.exists() and not (tmp_path / "mlflow.db").exists()
