"""Checkpoints are written, verified, then marked complete; a torn or corrupt one is refused
with the reason and the newest complete one before it is used, and training resumes from it
exactly."""

from __future__ import annotations

import contextlib
import shutil

import pytest

from copus.storage import Location
from copus.train.checkpoint import COMPLETE, checkpoint_problems, newest_complete, resume_candidates
from copus.train.local import run_local
from copus.train.worker_plan import StopRule
from tests.train.loop_helpers import losses, small_plan


@pytest.fixture()
def two_checkpoints(token_cache, tmp_path):
    plan = small_plan(token_cache, stop=StopRule(max_steps=4), checkpoint_every_steps=2)
    records, _, _ = run_local(plan, tmp_path / "ck")
    return plan, losses(records), tmp_path / "ck" / "step2", tmp_path / "ck" / "step4"


def test_complete_checkpoints_verify(two_checkpoints):
    _, _, step2, step4 = two_checkpoints
    assert checkpoint_problems(step2) == [] and checkpoint_problems(step4) == []
    assert (step4 / COMPLETE).is_file() and (step4 / "manifest_rank0.json").is_file()


@pytest.mark.parametrize(
    "damage,reason",
    [
        ("truncate", "__0_0.distcp has"),
        ("flip", "__0_0.distcp does not match its SHA-256"),
        ("delete", "__0_0.distcp missing"),
        ("unmark", "not marked COMPLETE"),
        ("manifest", "manifest_rank0.json missing"),
    ],
)
def test_a_damaged_checkpoint_is_refused_and_the_previous_one_resumes_exactly(
    two_checkpoints, tmp_path, damage, reason
):
    plan, reference, step2, step4 = two_checkpoints
    data = step4 / "__0_0.distcp"
    if damage == "truncate":
        data.write_bytes(data.read_bytes()[:-100])
    elif damage == "flip":
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        data.write_bytes(bytes(raw))
    elif damage == "delete":
        data.unlink()
    elif damage == "unmark":
        (step4 / COMPLETE).unlink()
    else:
        (step4 / "manifest_rank0.json").unlink()
    with contextlib.ExitStack() as stack:
        chosen, refused = newest_complete([step4, step2], stack)
    assert chosen == step2 and refused[0][0] == step4 and reason in refused[0][1]

    # Resuming from the chosen one retrains steps 3 and 4 to the same losses.
    resumed_root = tmp_path / "resumed"
    shutil.copytree(step2, resumed_root / "step2")
    records, final, _ = run_local(plan, resumed_root, resume_step=2)
    got = losses(records)
    assert sorted(got) == [3, 4] and final["samples"] == 4 * plan.gbs
    for step in (3, 4):
        assert got[step] == pytest.approx(reference[step], rel=1e-6)


def test_resume_candidates_are_every_stored_checkpoint_newest_first(tmp_path):
    names = ["checkpoint_2026-11-30_10-00-00.1", "checkpoint_2026-11-30_10-05-00.1", "checkpoint_2026-11-30_10-10-00.1"]
    for n in names:
        (tmp_path / n).mkdir()
    (tmp_path / "checkpoint_manager_snapshot.json").write_text("{}")  # Ray's own file, not a checkpoint
    root = Location.parse(tmp_path)
    newest_first = [tmp_path / n for n in reversed(names)]
    # Ray handed over the middle one: the newest, written when a node was lost before Ray's
    # controller collected every rank's report, is tried first (newest_complete refuses it if torn).
    assert resume_candidates(root / names[1], root) == newest_first
    # Ray knows of none yet (a fault within its poll interval after the first save).
    assert resume_candidates(None, root) == newest_first
    assert resume_candidates(None, Location.parse(tmp_path / "missing")) == []
    assert resume_candidates(None, None) == []
