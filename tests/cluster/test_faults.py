"""Crashes mid-run. A worker killed with SIGKILL: Ray Train restarts the worker group from the
last checkpoint, in the configuration the run had reached, and the run completes; sample
accounting is exact (the surviving steps consumed exactly the samples of an uninterrupted run,
each once, and trained to the same losses). The controller actor killed: Ray restarts it, it
recovers its history and decisions from its state file, and training never waits on it."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import ray

from copus.cluster.driver import run_experiment
from copus.cluster.launch import prepare_plan
from copus.config import config_from_mapping
from copus.train.data import TokenWindows, TrainStream
from copus.train.local import run_local

pytestmark = pytest.mark.slow


def _surviving_steps(records_file: Path) -> dict[int, dict]:
    """Each step's last record: a step redone after a restart replaces the lost attempt's."""
    steps: dict[int, dict] = {}
    for line in records_file.read_text().splitlines():
        record = json.loads(line)
        if record["kind"] == "step":
            steps[record["step"]] = record
    return steps


def test_a_killed_worker_costs_the_steps_since_the_last_checkpoint_and_no_sample(base_mapping, tmp_path, monkeypatch):
    monkeypatch.setenv("COPUS_RECORD_SAMPLE_IDS", "1")
    monkeypatch.setenv("COPUS_INJECT_WORKER_KILL", "7")  # rank 1 dies as step 7 starts
    messages: list[str] = []
    cfg = config_from_mapping(base_mapping, ["stop.max_steps=12", "checkpoint.every_steps=4", "eval.every_steps=100"])
    killed = run_experiment(cfg, echo=messages.append)

    assert killed["stop_reason"] == "max_steps" and killed["steps"] == 12 and killed["samples"] == 12 * 8
    assert killed["launches"] == 1  # Ray Train restarted the group; the driver did not relaunch
    [failure] = killed["worker_failures"]
    assert failure["resumed_at_step"] == 4 and failure["last_step_before"] == 6 and failure["steps_lost"] == 2
    assert any(
        "a worker failed: Ray Train restarted the worker group, resumed from the checkpoint at step 4" in m
        for m in messages
    )
    out = cfg.resolved_output_dir()
    assert (out / "faults" / "killed-at-step-7").is_file()

    # The uninterrupted run, in this process: the same data order and losses.
    _, plan = prepare_plan(cfg)
    records, _, _ = run_local(plan.replaced(dp=1, checkpoint_every_steps=100), tmp_path / "ref")
    reference = {r["step"]: r["train_loss"] for r in records if r["kind"] == "step"}
    stream = TrainStream(TokenWindows(plan.train_tokens, plan.token_dtype, plan.seq_len), plan.seed)
    expected_ids = [int(i) for _ in range(12) for i in stream.next_global_batch(8)]

    ours = _surviving_steps(out / "records.jsonl")
    assert sorted(ours) == list(range(1, 13))
    sample_ids = [i for step in sorted(ours) for i in ours[step]["sample_ids"]]
    assert sample_ids == expected_ids
    assert len(set(sample_ids)) == 12 * 8  # each sample once (an epoch is far longer)
    for step, record in ours.items():
        assert record["train_loss"] == pytest.approx(reference[step], rel=1e-4), step


def test_a_killed_controller_is_restarted_and_goes_on_from_its_state(base_mapping, tmp_path):
    from tests.cluster.test_controller import _mapping, _write_scripted_profile

    cfg = config_from_mapping({**_mapping(base_mapping), "stop": {"max_steps": 70, "max_wall_clock_s": 150}})
    _write_scripted_profile(cfg)
    out = cfg.resolved_output_dir()
    result: dict = {}
    # The script's first decision (B_noise 20) doubles the GBS; the second (1000) moves to the
    # pipeline; later ones repeat 1000. A controller restarted without its state would start
    # the script over and move the GBS back.
    thread = threading.Thread(
        target=lambda: result.update(summary=run_experiment(cfg, echo=lambda _: None, b_noise_script=(20.0, 1000.0)))
    )
    thread.start()
    deadline = time.time() + 120
    while time.time() < deadline:  # kill it once it has made its first switch
        log = out / "records.jsonl"
        if log.is_file() and '"kind": "reconfigure"' in log.read_text():
            break
        time.sleep(0.2)
    [name] = [n for n in ray.util.list_named_actors() if n.startswith("copus-controller-")]
    ray.kill(ray.get_actor(name), no_restart=False)  # as if its process crashed
    thread.join(timeout=300)
    summary = result["summary"]
    assert summary["stop_reason"] == "max_steps" and summary["steps"] == 70
    assert summary["controller"]["restarts"] == 1
    changes = [(r["from"]["gbs"], r["to"]["gbs"], r["to"]["pp"]) for r in summary["reconfigurations"]]
    assert changes == [(8, 16, 1), (16, 32, 2)], changes
