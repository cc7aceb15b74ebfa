"""Fault injection read from the environment (copus.train.faults): the hold that lets a fault
from outside land at a known step."""

import threading
import time

import pytest

from copus.storage import Location
from copus.train.faults import HOLD_ENV, FaultSpecError, faults_from_env


def test_a_hold_waits_for_its_release_once(tmp_path):
    markers = Location.parse(tmp_path / "faults")
    faults = faults_from_env(markers, world=4, environ={HOLD_ENV: "3, 7"})
    assert faults.hold_steps == {3, 7}
    faults.maybe_hold(2, rank=0)  # not a held step: returns at once
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (faults.maybe_hold(3, rank=0), done.set()))
    waiter.start()
    held = markers / "held-at-step-3"
    deadline = time.monotonic() + 10
    while not held.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert held.exists() and not done.is_set()  # rank 0 said so, and waits
    (markers / "release-step-3").write_text("go\n")
    waiter.join(timeout=10)
    assert done.is_set()
    faults.maybe_hold(3, rank=1)  # released already: a restarted group passes step 3 again


def test_without_the_variable_nothing_holds(tmp_path):
    faults = faults_from_env(Location.parse(tmp_path), world=2, environ={})
    assert not faults.hold_steps and faults.hold_dir is None
    faults.maybe_hold(1, rank=0)


def test_a_malformed_hold_is_one_line_naming_the_variable(tmp_path):
    with pytest.raises(FaultSpecError, match=rf"^{HOLD_ENV}: expected comma-separated step numbers, got 'x'$"):
        faults_from_env(Location.parse(tmp_path), world=2, environ={HOLD_ENV: "x"})
