"""A run whose output_dir is an S3 bucket (moto's S3-compatible server on loopback), through the
CLI as a user runs it: every file COPUS keeps for a run (run state, records, summary, fault
marker, Ray Train's checkpoints, controller state, the profile table it reads) is in the bucket
and none on local disk. A worker killed mid-run resumes from the checkpoint in the bucket with
exact sample accounting; a second command resumes the run from the bucket, adaptive now, its
controller keeping its state there; `copus export` reads the model from the bucket. Losses
match a one-process reference through all of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from copus.cluster.launch import prepare_plan
from copus.cluster.profiler import save_stated_table
from copus.config import config_from_mapping
from copus.core.layout import CandidateConfig
from copus.storage import Location
from copus.train.checkpoint import checkpoint_dirs
from copus.train.data import TokenWindows, TrainStream
from copus.train.local import run_local
from dashboards.report import build_report
from tests.s3_server import FAKE_AWS, bucket_uri, s3_server
from tests.train.loop_helpers import shapes_hook

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def s3_endpoint():
    with s3_server() as endpoint:
        yield endpoint


def _copus(args: list[str], cwd, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **FAKE_AWS, **(extra_env or {})}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(
        [sys.executable, "-m", "copus.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


def _summary(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"not a JSON summary on stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}")


def _steps(records_file: Location) -> dict[int, dict]:
    """Each step's last record: a step redone after a restart replaces the lost attempt's."""
    steps = {}
    for line in records_file.read_text().splitlines():
        record = json.loads(line)
        if record["kind"] == "step":
            steps[record["step"]] = record
    return steps


def _write_profile(cfg) -> None:
    """A measured-looking profile table, written to the bucket by ProfileTable.save: GBS 16 is
    the fastest per sample, so the controller has a change worth making."""
    save_stated_table(
        cfg, {CandidateConfig(2, 1, 1, 2, gbs): per_s for gbs, per_s in ((8, 100.0), (16, 180.0), (32, 190.0))}
    )


def test_a_run_lives_in_an_s3_bucket_through_a_killed_worker_a_resume_and_export(s3_endpoint, base_mapping, tmp_path):
    uri = bucket_uri(s3_endpoint, "exp")
    mapping = {
        **base_mapping,
        "output_dir": uri,
        "stop": {"max_steps": 8},
        "checkpoint": {"every_steps": 4},
        "eval": {"every_steps": 4, "val_samples": 8},
        "search": {"gbs_min": 8, "gbs_max": 32, "mbs": [2], "layouts": [[2, 1, 1]]},
        "policy": {"interval_s": 0.3, "in_place_cost_s": 0.05, "restart_cost_s": 0.05, "threshold": 0.05},
    }
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "exp.yaml").write_text(yaml.safe_dump(mapping))
    out = Location.parse(uri)

    # 1. Static, rank 1 killed as step 7 starts: Ray Train restarts the group from step 4's checkpoint in the bucket.
    proc = _copus(
        ["run", "exp.yaml", "--json"], workdir, {"COPUS_INJECT_WORKER_KILL": "7", "COPUS_RECORD_SAMPLE_IDS": "1"}
    )
    killed = _summary(proc)
    assert killed["output_dir"] == uri and killed["steps"] == 8 and killed["samples"] == 8 * 8
    assert killed["launches"] == 1  # Ray Train restarted the group; the driver did not relaunch
    [failure] = killed["worker_failures"]
    assert failure["resumed_at_step"] == 4 and failure["last_step_before"] == 6 and failure["steps_lost"] == 2
    assert "a worker failed: Ray Train restarted the worker group, resumed from the checkpoint at step 4" in proc.stderr
    names = {c.name for c in out.iterdir()}
    assert {"run_state.json", "records.jsonl", "summary.json", "ray", "faults"} <= names, names
    assert (out / "faults" / "killed-at-step-7").is_file()
    checkpoints = checkpoint_dirs(out / "ray" / "train")
    assert checkpoints and all((c / "COMPLETE").is_file() for c in checkpoints)
    assert sorted(p.name for p in workdir.iterdir()) == ["exp.yaml"]  # nothing of the run on local disk

    # 2. The same run, on to step 24 and adaptive now: it resumes from step 8's checkpoint in the
    # bucket; the controller reads the profile table there and keeps its state there.
    cfg = config_from_mapping(mapping, ["policy.name=copus", "stop.max_steps=24"])
    _write_profile(cfg)
    resumed = _summary(
        _copus(["run", "exp.yaml", "--json", "--set", "policy.name=copus", "--set", "stop.max_steps=24"], workdir)
    )
    assert resumed["steps"] == 24 and resumed["launches"] == 2 and resumed["policy"] == "copus"
    assert resumed["controller"]["decisions"] >= 1
    state = (out / "controller_state.json").read_json()
    assert state["history"], state
    assert sorted(p.name for p in workdir.iterdir()) == ["exp.yaml"]

    # 3. One process, the same batch shapes at the same steps: the same data and losses.
    steps = _steps(out / "records.jsonl")
    assert sorted(steps) == list(range(1, 25))
    _, plan = prepare_plan(cfg)
    # The hook is asked before step s + 1 with the s steps done: key each step's shape by s - 1.
    shapes = {s - 1: (r["gbs"], r["mbs"]) for s, r in steps.items()}
    records, final, _ = run_local(
        plan.replaced(dp=1, checkpoint_every_steps=1000), tmp_path / "ref", batch_size=shapes_hook(shapes)
    )
    reference = {r["step"]: r["train_loss"] for r in records if r["kind"] == "step"}
    assert final["samples"] == resumed["samples"]
    for step, record in steps.items():
        assert record["train_loss"] == pytest.approx(reference[step], rel=1e-4), step
    stream = TrainStream(TokenWindows(plan.train_tokens, plan.token_dtype, plan.seq_len), plan.seed)
    expected = [int(i) for _ in range(8) for i in stream.next_global_batch(8)]
    assert [i for s in range(1, 9) for i in steps[s]["sample_ids"]] == expected  # each sample once, through the kill

    # 4. The run's report, from and into the bucket; its export to a local Hugging Face directory.
    assert build_report(uri) == out / "report.html" and "<html" in (out / "report.html").read_text()[:500].lower()
    proc = _copus(["export", uri, str(tmp_path / "hf")], workdir)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "hf" / "config.json").is_file()
    assert proc.stdout.startswith("exported step 24 "), proc.stdout
