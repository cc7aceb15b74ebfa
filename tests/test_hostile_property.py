"""Property (issue 27): whatever a user hands `copus` (a mutated experiment mapping or YAML text,
`--set` values, a damaged run folder, a damaged simulation, a dataset of random bytes), the
command exits 0, or 2 with one line; it never ends in a traceback, stays within TIME_BOUND_S, and
writes nothing outside the example's folder (the shared inputs and their folder stay as they were).

Commands run in this process (`copus.cli.main`), never `run`: no Ray, no training. Examples are
derandomized (the same ones every run, no example database) and counted (EXAMPLES), so the file
runs the same way, in well under a minute, every time.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from copus.config import config_from_mapping
from tests.conftest import REPO, experiment_mapping
from tests.hostile_assets import invoke, real_run, tree_digest, write_experiment, write_hf_dir

TIME_BOUND_S = 30.0
EXAMPLES = {"mapping": 80, "yaml_text": 60, "set": 80, "run_folder": 30, "simulate": 20, "prepare": 40}
RUN_ID = "0123456789abcdef0123456789abcdef"
SIM = """model: llama-3.2-3b
cluster: {node: h100-sxm-8, nodes: 1}
batch: {gbs: 64, mbs: 1}
search: {gbs_min: 64, gbs_max: 256, mbs: [1], layouts: [[8, 1, 1]], dp_shard: [full], recompute: [full]}
policies: [copus, static]
training: {target_loss: 3.0, max_hours: 500}
"""


def hostile(name: str):
    return settings(
        max_examples=EXAMPLES[name],
        derandomize=True,
        database=None,
        deadline=None,  # the time bound is checked per command, with room for a loaded machine
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


@dataclass
class World:
    root: Path  # holds assets/ and examples/ only
    assets: Path  # shared inputs: must never change
    examples: Path
    experiment: dict
    keys: list[str]


@pytest.fixture(scope="module")
def world(tmp_path_factory, token_cache) -> World:
    root = tmp_path_factory.mktemp("hostile")
    assets, examples = root / "assets", root / "examples"
    examples.mkdir()
    run = real_run(assets, token_cache)
    reported_run(run, assets)
    (run / "run_state.json").write_text(json.dumps({"resume_key": "k", "elapsed_s": 1.0}))
    os.symlink("loop", assets / "loop")
    os.symlink(str(root / "nowhere" / "deeper"), assets / "dangling")
    (assets / "afile").write_text("x")
    write_hf_dir(assets / "hf")
    write_hf_dir(assets / "hf_small", vocab=128)
    write_hf_dir(assets / "hf_escape", escape=True)
    (assets / "sim.yaml").write_text(SIM)
    mapping = experiment_mapping(examples, token_cache)
    mapping["output_dir"], mapping["tracking"]["uri"] = "out", "sqlite:///mlflow.db"  # in the example's folder
    return World(root, assets, examples, mapping, sorted(_dotted(config_from_mapping(mapping).model_dump())))


def reported_run(run: Path, assets: Path) -> None:
    """What `copus report` reads of a run: summary.json pointing at an MLflow run (in a database
    among the assets), and the profile table and calibration in its profiles/ folder."""
    from copus.tracking import Tracker

    uri = f"sqlite:///{assets / 'mlflow.db'}"
    tracker = Tracker(uri, "hostile", warn=lambda line: None)
    run_id = tracker.start_run("r", {}, {"policy": "static"})
    for step in (1, 2):
        tracker.log_values(run_id, {"val_loss": 3.0 / step, "gbs": 8, "wall_clock_s": float(step)}, step=step)
    tracker.log_dict(run_id, {"target_val_loss": 2.0, "reached_target": True, "reconfigurations": []}, "summary.json")
    tracker.finish(run_id)
    (run / "summary.json").write_text(json.dumps({"mlflow_tracking_uri": uri, "mlflow_run_id": run_id}))
    (run / "profiles").mkdir()
    shutil.copy(REPO / "docs" / "calibration-quickstart.json", run / "profiles" / "calibration-8626d6a4bb1a.json")
    rows = [
        {"dp": 2, "tp": 1, "pp": 1, "mbs": 4, "gbs": 8, "status": "ok", "step_time_s": 0.2},
        {"dp": 1, "tp": 1, "pp": 2, "mbs": 8, "gbs": 64, "status": "ok", "step_time_s": 0.4},
    ]
    (run / "profiles" / "profile-0123456789ab.json").write_text(json.dumps({"key_id": "0123456789ab", "rows": rows}))


def _dotted(tree: dict, prefix: str = "") -> list[str]:
    keys = []
    for key, value in tree.items():
        keys.append(prefix + key)
        if isinstance(value, dict):
            keys += _dotted(value, f"{prefix}{key}.")
    return keys


# --- what a hostile user types ------------------------------------------------------------------
PATHS = [
    "{a}/loop",
    "{a}/" + "a" * 300,
    "{a}/dangling",
    "{a}/dangling/x",
    "{a}/afile/x",
    "{a}/hf",
    "{a}/hf_small",
    "{a}/hf_escape",
    "{a}/run",
    "{a}/sim.yaml",
    "s3://",
    "s3://b/x?endpoint_override=127.0.0.1:9&scheme=http&region=us-east-1",
    "gs://b/x",
    "ftp://x/y",
    "",
    ".",
    "file://",
    "*",
]
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(PATHS),
)
# Values a careful user gives too, so that some mutated experiments are valid and go further.
PLAUSIBLE = st.one_of(
    st.integers(1, 64), st.sampled_from([0.5, 1e-3, 2.0, "copus", "static", "txt", "stdlib", "bf16", "best", "sqrt"])
)
VALUES = st.one_of(
    PLAUSIBLE,
    SCALARS,
    st.lists(st.one_of(st.integers(-4, 64), st.text(max_size=3)), max_size=4),
    st.dictionaries(st.sampled_from(["kind", "path", "gbs", "x"]), st.one_of(st.integers(-2, 8), st.text(max_size=5))),
)
YAML_CHARS = list(":-[]{}&*!|>#%@`'\"\t\n ,?~.0e") + ["\x00", "\x07", "\ufeff", "\x85", "é", "\udcff"]


def fill(value, world: World):
    """PATHS name the shared assets as {a}."""
    if isinstance(value, str):
        return value.replace("{a}", str(world.assets))
    if isinstance(value, list):
        return [fill(v, world) for v in value]
    if isinstance(value, dict):
        return {k: fill(v, world) for k, v in value.items()}
    return value


def set_dotted(mapping: dict, dotted: str, value) -> None:
    node = mapping
    *parents, leaf = dotted.split(".")
    for key in parents:
        child = node.get(key)
        if not isinstance(child, dict):
            node[key] = child = {}
        node = child
    node[leaf] = value


# --- one command, checked -----------------------------------------------------------------------
@contextlib.contextmanager
def example_folder(world: World):
    """A fresh folder, the current directory and the token cache while the example runs."""
    folder = Path(tempfile.mkdtemp(dir=world.examples))
    saved = os.environ.get("COPUS_CACHE")
    os.environ["COPUS_CACHE"] = str(folder / "cache")
    try:
        with contextlib.chdir(folder):
            yield folder
    finally:
        os.environ.pop("COPUS_CACHE") if saved is None else os.environ.update(COPUS_CACHE=saved)
        shutil.rmtree(folder, ignore_errors=True)


def check(world: World, argv: list[str]) -> None:
    """`copus ARGV` exits 0 or 2 (one line), raises nothing, ends in time, writes only in its folder."""
    before = (tree_digest(world.assets), sorted(os.listdir(world.root)))
    start = time.monotonic()
    result = invoke(argv)
    elapsed = time.monotonic() - start
    assert not result.error, f"copus {argv!r} crashed:\n{result.error}"
    assert result.code in (0, 2), (argv, result.code, result.err)
    assert result.code == 0 or result.one_line_refusal(), (argv, result.err)
    assert elapsed < TIME_BOUND_S, (argv, elapsed)
    assert (tree_digest(world.assets), sorted(os.listdir(world.root))) == before, f"copus {argv!r} wrote outside"


# --- the properties ----------------------------------------------------------------------------
@hostile("mapping")
@given(
    edits=st.lists(
        st.tuples(st.integers(0, 10**6), VALUES, st.sampled_from([False] * 3 + [True])), min_size=1, max_size=3
    )
)
def test_a_mutated_experiment_is_validated_or_refused(world, edits):
    mapping = json.loads(json.dumps(world.experiment))
    for index, value, unknown in edits:
        key = world.keys[index % len(world.keys)] + ("_x" if unknown else "")
        set_dotted(mapping, key, fill(value, world))
    with example_folder(world) as folder:
        check(world, ["validate", str(write_experiment(folder / "exp.yaml", mapping)), "--json"])


@hostile("yaml_text")
@given(
    edits=st.lists(
        st.tuples(
            st.integers(0, 10**6), st.sampled_from(["insert", "delete", "duplicate"]), st.text(YAML_CHARS, max_size=6)
        ),
        min_size=1,
        max_size=4,
    ),
    raw_byte=st.booleans(),
)
def test_damaged_yaml_text_is_validated_or_refused(world, edits, raw_byte):
    text = yaml.safe_dump(world.experiment)
    for position, op, chars in edits:
        at = position % (len(text) + 1)
        if op == "insert":
            text = text[:at] + chars + text[at:]
        elif op == "delete":
            text = text[:at] + text[at + len(chars) + 1 :]
        else:
            line_start = text.rfind("\n", 0, at) + 1
            line_end = text.find("\n", at) + 1 or len(text)
            text = text[:line_end] + text[line_start:line_end] + text[line_end:]
    data = text.encode("utf-8", "surrogateescape") + (b"\xff\xfe" if raw_byte else b"")
    with example_folder(world) as folder:
        (folder / "exp.yaml").write_bytes(data)
        check(world, ["validate", str(folder / "exp.yaml")])


@hostile("set")
@given(
    overrides=st.lists(
        st.tuples(
            st.one_of(st.integers(0, 10**6), st.text(max_size=8)),
            st.one_of(st.text(max_size=16), st.sampled_from(PATHS)),
        ),
        min_size=1,
        max_size=3,
    )
)
def test_set_values_are_applied_or_refused(world, overrides):
    argv = []
    for key, value in overrides:
        name = world.keys[key % len(world.keys)] if isinstance(key, int) else key
        argv += ["--set", f"{name}={fill(value, world)}"]
    with example_folder(world) as folder:
        check(world, ["validate", str(write_experiment(folder / "exp.yaml", world.experiment)), *argv])


JSON_VALUES = st.one_of(
    st.recursive(
        SCALARS.filter(lambda v: not isinstance(v, float)), lambda inner: st.lists(inner, max_size=3), max_leaves=5
    ),
    st.fixed_dictionaries(
        {
            "mlflow_tracking_uri": st.sampled_from(
                ["", "garbage", "sqlite:///none.db", "sqlite://x", "http://127.0.0.1:9"]
            ),
            "mlflow_run_id": st.sampled_from([RUN_ID, "x", ""]),
            "world_size": st.integers(-1, 3),
            "resume_key": st.text(max_size=3),
            "files": st.just({"__0_0.distcp": {"size": 1, "sha256": "0"}}),
        }
    ),
)
DAMAGE = st.tuples(
    st.integers(0, 10**6),
    st.sampled_from(["truncate", "flip", "garbage", "delete", "json", "json-edit", "json-edit", "loop", "directory"]),
    st.integers(0, 10**6),
    JSON_VALUES,
)


def damage(folder: Path, index: int, op: str, position: int, value) -> None:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink())
    if not files:
        return
    target = files[index % len(files)]
    data = target.read_bytes()
    if op == "truncate":
        target.write_bytes(data[: position % (len(data) + 1)])
    elif op == "flip" and data:
        at = position % len(data)
        target.write_bytes(data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :])
    elif op == "garbage":
        target.write_bytes(bytes(range(position % 256)) + b"{\x00\xff")
    elif op == "delete":
        target.unlink()
    elif op == "json":
        target.write_text(json.dumps(value))
    elif op == "json-edit" and target.suffix == ".json":
        target.write_text(json.dumps(json_edit(json.loads(data), position, value)))
    elif op == "loop":
        target.unlink()
        os.symlink(target.name, target)
    elif op == "directory":
        target.unlink()
        target.mkdir()


def json_edit(tree, index: int, value):
    """`tree` with one of its values (picked by `index`, the whole tree among them) replaced."""
    places = [(None, None)]
    stack = [tree]
    while stack:
        node = stack.pop()
        children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, child in children:
            places.append((node, key))
            stack.append(child)
    node, key = places[index % len(places)]
    if node is None:
        return value
    node[key] = value
    return tree


@hostile("run_folder")
@given(damages=st.lists(DAMAGE, min_size=1, max_size=3), command=st.sampled_from(["export", "report", "report-out"]))
def test_a_damaged_run_folder_is_exported_reported_or_refused(world, damages, command):
    with example_folder(world) as folder:
        run = folder / "run"
        shutil.copytree(world.assets / "run", run, symlinks=True)
        for item in damages:
            damage(run, *item)
        argv = {
            "export": ["export", str(run), str(folder / "hf")],
            "report": ["report", str(run)],
            "report-out": ["report", str(run), "--out", str(folder / "r.html")],
        }[command]
        check(world, argv)


SIM_KEYS = [
    "seq_len",
    "batch.gbs",
    "batch.mbs",
    "search.gbs_min",
    "search.gbs_max",
    "search.mbs",
    "policy.interval_s",
    "policy.critical_factor",
    "training.target_loss",
    "training.max_hours",
    "training.loss_curve.e",
    "training.loss_curve.beta",
    "training.critical_batch.flat_tokens",
    "estimate.noise",
    "estimate.seed",
    "training.calibration",
    "costs.storage_gb_per_s",
    "cluster.nodes",
]
SIM_VALUES = st.one_of(
    st.integers(-2, 4096),
    st.floats(-1.0, 1e9),
    st.sampled_from([0, 1e-9, 1e30, float("inf"), float("nan"), "x", None, [0], [], "{a}/loop", "{a}/afile"]),
)


@hostile("simulate")
@given(edits=st.lists(st.tuples(st.sampled_from(SIM_KEYS), SIM_VALUES), min_size=1, max_size=2))
def test_a_damaged_simulation_is_simulated_or_refused(world, edits):
    argv = ["simulate", str(world.assets / "sim.yaml"), "--json"]
    for key, value in edits:
        argv += ["--set", f"{key}={json.dumps(fill(value, world))}"]
    with example_folder(world):
        check(world, argv)


@hostile("prepare")
@given(
    kind=st.sampled_from(["txt", "jsonl", "parquet", "bin"]),
    train=st.binary(max_size=300),
    val=st.one_of(st.none(), st.binary(max_size=40)),
    jsonl_lines=st.lists(st.one_of(st.text(max_size=10), JSON_VALUES.map(json.dumps)), max_size=5),
)
def test_a_dataset_of_random_bytes_is_prepared_or_refused(world, kind, train, val, jsonl_lines):
    with example_folder(world) as folder:
        if kind == "jsonl" and jsonl_lines:
            train = "\n".join(jsonl_lines).encode("utf-8", "surrogateescape") + train[:8]
        (folder / f"train.{kind}").write_bytes(train)
        dataset = {"kind": kind, "path": str(folder / f"train.{kind}"), "cache_dir": str(folder / "cache")}
        if val is not None:
            (folder / f"val.{kind}").write_bytes(val)
            dataset["val_path"] = str(folder / f"val.{kind}")
        mapping = {**world.experiment, "workload": {**world.experiment["workload"], "dataset": dataset}}
        check(world, ["prepare", str(write_experiment(folder / "exp.yaml", mapping)), "--workers", "1", "--quiet"])
