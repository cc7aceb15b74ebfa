"""The profile table file: versioned, keyed, atomic; measured outcomes override the memory
model; the fitted model and its held-out error are stored with the points."""

from __future__ import annotations

import json

import pytest

from copus.cluster.profile_table import SCHEMA_VERSION, ProfileTable, ProfileTableError, profile_key
from copus.core.layout import CandidateConfig
from copus.core.memory import GIB, MemoryBreakdown
from workloads.flavours import FLAVOURS

KEY = profile_key({"model": "tiny", "seq_len": 128}, {"kind": "cpu", "device": "x", "cores": 2}, 2)


def _need(gib: float) -> MemoryBreakdown:
    return MemoryBreakdown(0, gib * GIB, 0, 0, 0, 0)


def test_round_trip_and_reuse_by_key(tmp_path):
    table = ProfileTable.open(tmp_path, KEY)
    table.record(CandidateConfig(2, 1, 1, 4, 16), status="ok", source="measured", step_time_s=0.1, step_times=[0.1])
    path = table.save(tmp_path)
    assert path.name == f"profile-{table.id}.json" and not list(tmp_path.glob(".*.tmp"))
    again = ProfileTable.open(tmp_path, KEY)
    assert again.measured()[0].step_time_s == 0.1
    other = profile_key({"model": "tiny", "seq_len": 256}, KEY["hardware"], 2)
    assert ProfileTable.open(tmp_path, other).rows == []  # another key: another file
    assert ProfileTable.open(tmp_path, KEY, refresh=True).rows == []


def test_a_newer_schema_or_a_broken_file_is_refused_with_its_path(tmp_path):
    table = ProfileTable(KEY)
    path = table.save(tmp_path)
    data = json.loads(path.read_text())
    data["schema_version"] = SCHEMA_VERSION + 1
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileTableError, match=f"{path}: schema_version"):
        ProfileTable.open(tmp_path, KEY)
    path.write_text("{not json")
    with pytest.raises(ProfileTableError, match=str(path)):
        ProfileTable.open(tmp_path, KEY)


def test_measured_outcomes_override_the_memory_model():
    table = ProfileTable(KEY)
    ran, crashed, unknown = (
        CandidateConfig(2, 1, 1, 8, 16),
        CandidateConfig(1, 1, 2, 8, 16),
        CandidateConfig(1, 2, 1, 8, 16),
    )
    table.record(ran, status="ok", source="measured", step_time_s=0.2, step_times=[0.2])
    table.record(crashed, status="infeasible", source="measured", reason="OutOfMemoryError: CUDA out of memory")
    assert table.feasible(ran, _need(100), 10 * GIB) == (True, "")  # ran although the model says no
    assert table.feasible(crashed, _need(1), 10 * GIB) == (False, "OutOfMemoryError: CUDA out of memory")
    ok, reason = table.feasible(unknown, _need(11), 10 * GIB)
    assert not ok and reason.startswith("memory model")


def test_measured_peaks_above_the_model_make_it_more_careful():
    table = ProfileTable(KEY)
    table.record(
        CandidateConfig(2, 1, 1, 8, 16),
        status="ok",
        source="measured",
        step_time_s=0.2,
        step_times=[0.2],
        peak_memory_bytes=3 * GIB,
        model_memory_bytes=2 * GIB,
    )
    assert table.memory_calibration() == pytest.approx(1.5)
    assert table.feasible(CandidateConfig(1, 2, 1, 8, 16), _need(8), 10 * GIB)[0] is False  # 8 x 1.5 > 10


def test_fit_stores_the_model_and_held_out_errors():
    shape = FLAVOURS["tiny"].shape()
    table = ProfileTable(KEY)
    with pytest.raises(ProfileTableError, match="at least 2"):
        table.fit(shape, 5)
    for mbs in (2, 4):
        for gbs in (8, 16, 32, 64):
            t = 0.01 + 0.004 * gbs + 0.002 * gbs / mbs
            table.record(
                CandidateConfig(2, 1, 1, mbs, gbs), status="ok", source="measured", step_time_s=t, step_times=[t]
            )
    model = table.fit(shape, 4)
    assert model["error"]["folds"] == 4 and model["error"]["mape"] < 0.05
    assert all("cv_ape" in r and "fitted_step_time_s" in r for r in table.rows)
    fitted = table.step_time_model(shape)
    assert fitted.step_time(CandidateConfig(2, 1, 1, 4, 48)) == pytest.approx(0.01 + 0.004 * 48 + 0.002 * 12, rel=0.05)


def test_in_place_layout_changes_are_kept_and_their_median_is_the_first_changes_cost(tmp_path):
    from copus.cluster.controller_setup import DEFAULT_IN_PLACE_COST_S, first_in_place_cost_s
    from copus.config import ExperimentConfig

    table = ProfileTable(KEY)
    assert table.in_place_reshard_s() is None
    dp2, pp2 = CandidateConfig(2, 1, 1, 4, 16), CandidateConfig(1, 1, 2, 4, 16)
    for seconds in (0.9, 0.4, 0.5):
        table.record_reshard(dp2, pp2, seconds, 1e7)
    path = table.save(tmp_path)
    again = ProfileTable.load(path)
    assert again.reshards == table.reshards and again.in_place_reshard_s() == 0.5
    cfg = ExperimentConfig.model_validate({"stop": {"max_steps": 1}})
    assert first_in_place_cost_s(cfg, again) == 0.5  # the profile's, where the experiment says nothing
    assert first_in_place_cost_s(cfg, ProfileTable(KEY)) == DEFAULT_IN_PLACE_COST_S
    stated = ExperimentConfig.model_validate({"stop": {"max_steps": 1}, "policy": {"in_place_cost_s": 2.0}})
    assert first_in_place_cost_s(stated, again) == 2.0  # the experiment's, where it says


@pytest.mark.parametrize("damage", [{"seconds": -1.0}, {"seconds": "fast"}, {"from": None}, "x"])
def test_a_damaged_reshard_entry_is_refused_with_its_path(tmp_path, damage):
    table = ProfileTable(KEY)
    table.record_reshard(CandidateConfig(2, 1, 1, 4, 16), CandidateConfig(1, 1, 2, 4, 16), 0.5, 1e7)
    path = table.save(tmp_path)
    data = json.loads(path.read_text())
    data["reshards"] = [damage if isinstance(damage, str) else {**data["reshards"][0], **damage}]
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileTableError, match=f"{path}: a damaged profile table \\(reshards is damaged\\)"):
        ProfileTable.load(path)
