"""A calibration continuation that screens its evaluations reads the same crossing off fewer
full evaluations: the training does not depend on which evaluations were made, and the screen
reads the whole set at every evaluation near the crossing. A screen that opened too late is
caught: the continuation runs again unscreened."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from copus.train.calibrate import Screening, continue_branch, reference_run
from tests.train.loop_helpers import small_plan


@pytest.fixture(scope="module")
def branch(tmp_path_factory):
    root = tmp_path_factory.mktemp("screen")
    plan = small_plan(root / "cache", val_samples=64)
    point = reference_run(plan, [256], root / "branches", 64)[0]  # past the warm-up's steep fall
    return plan, point


@pytest.fixture(scope="module")
def whole(branch):
    return _continue(branch, None)


def _continue(branch, screen, gbs=4):
    plan, point = branch
    start = {"samples": point["samples"], "val_loss": point["val_loss"]}
    return continue_branch(plan, Path(point["checkpoint"]), start, gbs, 0, 0.2, 4000, 8, 64, screen=screen)


def test_a_screened_continuation_reads_the_same_crossing_off_fewer_full_evaluations(branch, whole):
    screened = _continue(branch, Screening(16))
    assert math.isfinite(whole["samples"]) and whole["screen"] is None
    assert screened["samples"] == whole["samples"]  # the same trajectory, the same points near the crossing
    s = screened["screen"]
    assert s["screened"] > 0 and s["due"] == len(whole["curve_samples"]) - 1  # the same due evaluations
    assert len(screened["curve_samples"]) == len(whole["curve_samples"]) - s["screened"]
    assert screened["curve_samples"][-1] == whole["curve_samples"][-1]  # it stopped where the unscreened one did


def test_a_screen_that_opened_after_the_crossing_runs_the_continuation_again_unscreened(branch, whole):
    # A screen of 16 samples whose offset reads far too high (as if it had drifted by the whole
    # decrement): it opens only past the stop point, and the crossing is not resolved by full evaluations.
    late = _continue(branch, _Misread(16))
    assert late["unscreened_rerun"] and late["samples"] == whole["samples"] and late["screen"] is None


class _Misread(Screening):
    def screen(self, start_loss, decrement, window):
        s = super().screen(start_loss, decrement, window)
        s.begin = lambda screen_loss: setattr(s, "offset", screen_loss - start_loss - 2 * decrement)
        return s
