"""Crashes mid-run: the controller actor killed, Ray restarts it, it recovers its history and
decisions from its state file, and training never waits on it. (A worker killed with SIGKILL,
with exact sample accounting, is tested with the run's files in an S3 bucket:
tests/cluster/test_object_storage.py.)"""

from __future__ import annotations

import threading
import time

import pytest
import ray

from copus.cluster.driver import run_experiment
from copus.config import config_from_mapping

pytestmark = pytest.mark.slow


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


class _Training:
    """A stand-in for Ray Train's trainer: the driver hands fit() to a thread and drains the
    record actor meanwhile; here fit() waits until the test lets it end."""

    def __init__(self) -> None:
        self.done = threading.Event()

    def fit(self) -> str:
        self.done.wait(60)
        return "fitted"


def test_a_record_actor_that_stays_dead_stops_the_run_and_a_restarted_one_is_waited_for():
    from copus.cluster.launch import MonitorLost, fit_and_drain
    from copus.cluster.monitor import RunMonitor, on_driver_node

    # Dead for good: without it every record rank 0 sends would vanish while training goes on.
    gone = RunMonitor.options(**on_driver_node()).remote()
    ray.get(gone.push.remote({"step": 1}))
    ray.kill(gone, no_restart=True)
    training = _Training()
    with pytest.raises(MonitorLost, match="has not answered for 2 s"):
        fit_and_drain(training, gone, lambda _: None, patience_s=2.0)
    training.done.set()
    # Restarted by Ray (the controller's max_restarts): the driver waits, then drains the new
    # incarnation from its start.
    back = RunMonitor.options(max_restarts=1, **on_driver_node()).remote()
    node = ray.get(back.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()))
    assert node == ray.get_runtime_context().get_node_id()
    ray.get(back.push.remote({"step": 1}))
    seen: list[dict] = []
    killed: list[bool] = []
    training = _Training()

    def drained(records: list[dict]) -> None:
        seen.extend(records)
        if seen == [{"step": 1}] and not killed:
            killed.append(True)
            ray.kill(back, no_restart=False)
            threading.Timer(3.0, lambda: back.push.remote({"step": 2})).start()
        elif {"step": 2} in seen:
            training.done.set()

    outcome = fit_and_drain(training, back, drained, patience_s=60.0)
    assert outcome["result"] == "fitted" and seen == [{"step": 1}, {"step": 2}]
