"""Inputs a careless or hostile user gives (issue 27): each works, or is refused before anything
starts with one line naming the field or file, exit 2; nothing is written outside the paths
given. One case per cause found; `test_hostile_property.py` generates many more."""

from __future__ import annotations

import json
import os
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from copus.storage import bounded_uri
from tests.conftest import REPO
from tests.hostile_assets import (
    CHECKPOINT_NAMES,
    fake_checkpoint,
    invoke,
    pointer_files,
    real_run,
    tree_digest,
    write_experiment,
    write_hf_dir,
)

SIM = str(REPO / "experiments" / "sim" / "paper_llama-3.2-3b_1x8-h100.yaml")
LONG = "a" * 300
HF = ["--set", "workload.model=null", "--set"]  # + workload.init_from=DIR


@pytest.fixture
def scratch(tmp_path, base_mapping, monkeypatch):
    """A folder with an experiment and every hostile asset; the current directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COPUS_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    write_experiment(tmp_path / "exp.yaml", base_mapping)
    os.symlink("loop", tmp_path / "loop")
    os.symlink(str(tmp_path / "nowhere" / "deeper"), tmp_path / "dangling")
    (tmp_path / "afile").write_text("x")
    (tmp_path / "bad.jsonl").write_bytes(b'{"text": "ok"}\n{"text": "\xff\xfe"}\n')
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "empty.jsonl").write_bytes(b"")
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), tmp_path / "empty.parquet")
    write_hf_dir(tmp_path / "hf")
    write_hf_dir(tmp_path / "hf_small", vocab=128)
    write_hf_dir(tmp_path / "hf_arch", config={"architectures": "LlamaForCausalLM"})
    write_hf_dir(tmp_path / "hf_eps", config={"rms_norm_eps": -1e-5})
    write_hf_dir(tmp_path / "hf_escape", escape=True)
    for name, theta in (("nan", float("nan")), ("zero", 0), ("neg", -5)):
        write_hf_dir(tmp_path / f"hf_{name}", config={"rope_parameters": {"rope_type": "default", "rope_theta": theta}})
    return tmp_path


def data(kind: str, path: str) -> list[str]:
    return ["--set", f"workload.dataset={{kind: {kind}, path: {path}}}"]


# (id, argv after the command, the start of the one line on stderr)
REFUSED = [
    (
        "set-unclosed",
        ["validate", "exp.yaml", "--set", "batch.gbs=[1,2"],
        "--set batch.gbs=[1,2: line 1 not valid YAML",
    ),
    ("set-tag", ["validate", "exp.yaml", "--set", "name=!!python/object:os.system x"], "--set name=!!python"),
    ("set-control", ["validate", "exp.yaml", "--set", "name=a\x07b"], "--set name=a\\x07b: not valid YAML"),
    ("set-no-key", ["validate", "exp.yaml", "--set", "=3"], "--set =3: expected key.sub=value"),
    ("loop-init", ["validate", "exp.yaml", *HF, "workload.init_from=loop"], "workload.init_from: loop: a symbolic"),
    ("loop-out", ["validate", "exp.yaml", "--set", "output_dir=loop"], "output_dir: loop: a symbolic link loop"),
    ("loop-data", ["validate", "exp.yaml", *data("txt", "loop")], "workload.dataset.path: loop: a symbolic link"),
    ("long-out", ["validate", "exp.yaml", "--set", f"output_dir={LONG}"], "output_dir: aaaa"),
    ("long-experiment", ["validate", f"{LONG}.yaml"], "aaaa"),
    ("long-export", ["export", "run", LONG], "aaaa"),
    ("long-report-out", ["report", "summary", "--out", f"{LONG}.html"], "aaaa"),
    ("prepare-not-utf8", ["prepare", "exp.yaml", *data("jsonl", "bad.jsonl")], "{t}/bad.jsonl:2: not UTF-8 text"),
    ("prepare-empty-txt", ["prepare", "exp.yaml", *data("txt", "empty.txt")], "{t}/empty.txt: no text"),
    ("prepare-empty-jsonl", ["prepare", "exp.yaml", *data("jsonl", "empty.jsonl")], "{t}/empty.jsonl: no text"),
    ("prepare-empty-parquet", ["prepare", "exp.yaml", "--quiet", *data("parquet", "empty.parquet")], "empty.parquet"),
    ("export-under-file", ["export", "run", "afile/out"], "{t}/afile/out: cannot be created: {t}/afile is a file"),
    ("export-dangling", ["export", "run", "dangling"], "dangling: dangling is a symbolic link to"),
    ("export-s3-bare", ["export", "s3://", "out"], "'s3://': names no bucket or path"),
    ("export-no-shape", ["export", "run", "out"], "{t}/run/ray/train/checkpoint_2026-01-01_00-00-00.000001: the"),
    ("report-typo", ["report", "runs/typo"], "runs/typo: no such output directory or calibration file"),
    ("report-out-dir", ["report", "summary", "--out", "."], "{t}: a directory; --out names the HTML file"),
    ("report-no-database", ["report", "summary"], "summary: no MLflow database at sqlite:///{t}/none.db"),
    ("sim-mbs-zero", ["simulate", SIM, "--set", "search.mbs=[0]"], f"{SIM}: search.mbs.0: Input should be greater"),
    ("sim-unreachable", ["simulate", SIM, "--set", "training.target_loss=0.1"], f"{SIM}: training.target_loss: 0.1 is"),
    (
        "sim-too-many-steps",
        ["simulate", SIM, "--set", "seq_len=1", "--set", "search.gbs_max=256", "--set", "training.target_loss=2.8"],
        f"{SIM}: training.target_loss: 2.8 needs at least",
    ),
    ("lr-inf", ["validate", "exp.yaml", "--set", "optimizer.lr=.inf"], "optimizer.lr: Input should be a finite number"),
    ("lr-1e400", ["validate", "exp.yaml", "--set", "optimizer.lr=1e400"], "optimizer.lr: Input should be a finite"),
    ("decay-inf", ["validate", "exp.yaml", "--set", "optimizer.weight_decay=.inf"], "optimizer.weight_decay: Input"),
    ("target-inf", ["validate", "exp.yaml", "--set", "stop.target_val_loss=.inf"], "stop.target_val_loss: Input"),
    ("betas", ["validate", "exp.yaml", "--set", "optimizer.betas=[2,3]"], "optimizer.betas.0: Input should be less"),
    ("seed-negative", ["validate", "exp.yaml", "--set", "workload.seed=-1"], "workload.seed: Input should be greater"),
    ("seed-huge", ["validate", "exp.yaml", "--set", f"workload.seed={2**64}"], "workload.seed: Input should be less"),
    ("calibration-gbs", ["validate", "exp.yaml", "--set", "calibration.gbs=[0,-4]"], "calibration.gbs.0: Input"),
    ("rope-nan", ["validate", "exp.yaml", *HF, "workload.init_from=hf_nan"], "workload.init_from: {t}/hf_nan/config"),
    ("rope-zero", ["validate", "exp.yaml", *HF, "workload.init_from=hf_zero"], "workload.init_from: {t}/hf_zero/"),
    ("rope-negative", ["validate", "exp.yaml", *HF, "workload.init_from=hf_neg"], "workload.init_from: {t}/hf_neg/"),
    ("eps-negative", ["validate", "exp.yaml", *HF, "workload.init_from=hf_eps"], "workload.init_from: {t}/hf_eps/"),
    ("vocab-small", ["validate", "exp.yaml", *HF, "workload.init_from=hf_small"], "workload.init_from: a vocabulary"),
    ("output-empty", ["validate", "exp.yaml", "--set", "output_dir="], "output_dir: empty"),
    ("init-uri", ["validate", "exp.yaml", *HF, "workload.init_from=s3://b/m"], "workload.init_from: s3://b/m: a URI"),
    ("weight-map-escape", ["validate", "exp.yaml", *HF, "workload.init_from=hf_escape"], "workload.init_from: {t}/hf_"),
]


@pytest.mark.parametrize("case,argv,message", REFUSED, ids=[c[0] for c in REFUSED])
def test_hostile_input_is_refused_in_one_line(scratch, case, argv, message):
    fake_checkpoint(scratch / "run" / "ray" / "train" / CHECKPOINT_NAMES[0], 4)
    pointer_files(scratch / "summary", f"sqlite:///{scratch / 'none.db'}")
    before = sorted(p.name for p in scratch.iterdir())
    result = invoke(argv)
    assert result.code == 2, (result.error, result.err)
    assert result.err.startswith("copus: " + message.replace("{t}", str(scratch))), result.err
    assert result.one_line_refusal(), result.err
    assert sorted(p.name for p in scratch.iterdir()) == before  # nothing new beside the inputs
    assert not (scratch / "nowhere").exists()


def test_what_should_work_works(scratch):
    assert json.loads(invoke(["validate", "exp.yaml", "--json", "--set", "batch.gbs=032"]).out)["batch"]["gbs"] == 32
    assert invoke(["validate", "exp.yaml", *HF, "workload.init_from=hf_arch"]).code == 0  # a one-name string
    suite = scratch / "suite.yaml"
    suite.write_text("experiment: exp.yaml\npolicies: [copus, static]\n")
    result = invoke(["validate", str(suite)])
    assert result.code == 0 and "valid comparison suite. copus, static" in result.out, result.err


@pytest.fixture(scope="module")
def trained(tmp_path_factory, token_cache):
    return real_run(tmp_path_factory.mktemp("trained"), token_cache)


def test_export_passes_over_a_garbage_manifest_and_says_so(trained, tmp_path):
    run = tmp_path / "run"
    import shutil

    shutil.copytree(trained, run)
    (run / "ray" / "train" / CHECKPOINT_NAMES[1] / "manifest_rank0.json").write_text("garbage{")
    result = invoke(["export", str(run), str(tmp_path / "hf")])
    assert result.code == 0, result.err + result.error
    assert "exported step 2" in result.out
    assert (
        f"newer checkpoint refused: {run}/ray/train/{CHECKPOINT_NAMES[1]} (manifest_rank0.json is damaged" in result.out
    )


def test_an_unreachable_store_fails_in_bounded_time_naming_the_endpoint(tmp_path):
    start = time.monotonic()
    result = invoke(["export", "s3://bucket/run?endpoint_override=127.0.0.1:9&scheme=http", str(tmp_path / "out")])
    assert result.code == 2 and result.one_line_refusal(), result.err + result.error
    assert "the store at 127.0.0.1:9 failed" in result.err
    assert time.monotonic() - start < 60
    # Google Cloud Storage retries for many minutes unless told otherwise.
    assert bounded_uri("gs://b/run", "gs") == "gs://b/run?retry_limit_seconds=10"
    assert bounded_uri("gs://b/run?retry_limit_seconds=3", "gs") == "gs://b/run?retry_limit_seconds=3"


def test_prepare_keys_the_cache_by_vocabulary(scratch, base_mapping):
    """Token ids checked against one model's vocabulary are not "already prepared" for another."""
    import numpy as np

    np.array([1, 300, 2] * 400, dtype=np.uint16).tofile(scratch / "ids.bin")
    bin_data = ["--set", "workload.dataset={kind: bin, path: ids.bin}"]
    first = invoke(["prepare", "exp.yaml", *bin_data, *HF, "workload.init_from=hf"])
    assert first.code == 0, first.err + first.error
    second = invoke(["prepare", "exp.yaml", *bin_data])  # the debug model: 256 tokens
    assert second.code == 2 and "token id 300 is outside the model's vocabulary of 256" in second.err


@pytest.mark.parametrize("content", ["{{{", "", "[]", '{"foo": 1}', '{"resume_key": "k", "elapsed_s": "x"}'])
def test_a_damaged_run_state_is_refused_before_ray(base_mapping, tmp_path, monkeypatch, content):
    import copus.cluster.driver as driver

    monkeypatch.setattr(driver, "join_cluster", lambda cfg, echo: pytest.fail("Ray was asked for"))
    out = tmp_path / "out"
    out.mkdir()
    (out / "run_state.json").write_text(content)
    result = invoke(["run", str(write_experiment(tmp_path / "exp.yaml", base_mapping))])
    assert result.one_line_refusal(), result.err + result.error
    assert result.err.startswith(f"copus: output_dir: {out}/run_state.json is damaged")


def test_fresh_refuses_a_directory_holding_other_files(base_mapping, tmp_path, monkeypatch):
    import copus.cluster.driver as driver

    monkeypatch.setattr(driver, "join_cluster", lambda cfg, echo: pytest.fail("Ray was asked for"))
    out = tmp_path / "out"
    (out / "ray").mkdir(parents=True)
    (out / "summary.json").write_text("{}")
    (out / "thesis.tex").write_text("mine")
    before = tree_digest(out)
    result = invoke(["run", str(write_experiment(tmp_path / "exp.yaml", base_mapping)), "--fresh"])
    assert result.one_line_refusal(), result.err + result.error
    assert "holds files a COPUS run does not write (thesis.tex)" in result.err
    assert tree_digest(out) == before  # nothing deleted
