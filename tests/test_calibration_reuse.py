"""`copus calibrate --reuse-points FILE`: what may be taken over from another calibration, and
what is refused with one line naming the field or file (no Ray: the checks run first)."""

from __future__ import annotations

import json
import math

import pytest

from copus.cluster.calibrate import estimator_key
from copus.cluster.calibration_reuse import imported_points, load_reusable, provenance
from copus.config import ConfigError, config_from_mapping
from tests.conftest import REPO

COMMITTED = REPO / "docs" / "calibration-quickstart.json"


def _ours(base_mapping, *overrides):
    """A config, its calibration key and settings as `Calibration` builds them, made to match
    the committed quickstart calibration except where `overrides` say otherwise."""
    data = json.loads(COMMITTED.read_text())
    key = json.loads(json.dumps(data["key"]))
    settings = {k: v for k, v in data["settings"].items() if k != "crossing"}
    cfg = config_from_mapping(base_mapping, list(overrides))
    return cfg, key, settings


def test_the_committed_calibration_is_taken_over_point_by_point(base_mapping):
    cfg, key, settings = _ours(base_mapping)
    key["gns"] = {"horizon": "progress", "half_life_share": 0.05, "min_half_life": 8.0, "precondition": "none"}
    key["workload"]["data"] = "another machine's stdlib"
    data = load_reusable(cfg, key, settings, str(COMMITTED))
    points = imported_points(data, settings["branch_samples"], "f")
    assert len(points) == len(data["points"]) == 40
    for theirs, ours in zip(data["points"], points):
        assert ours["start"] == {
            "samples": settings["branch_samples"][theirs["branch"]],
            "val_loss": theirs["val_loss"],
        }
        assert ours["reached"] == theirs["reached"] and ours["imported_from"] == "f"
        assert ours["samples"] == theirs["samples"] or (theirs["samples"] is None and math.isnan(ours["samples"]))
    origin = provenance(data, str(COMMITTED))
    assert origin["id"] == data["id"] and origin["data"] == data["key"]["workload"]["data"]


@pytest.mark.parametrize(
    "change, names",
    [
        (lambda key, s: key["optimizer"].update(lr=1.0), "optimizer"),
        (lambda key, s: key["workload"].update(seq_len=64), "workload.seq_len"),
        (lambda key, s: key["gns"].update(precondition="adam"), "gns.precondition"),
        (lambda key, s: s.update(decrement=0.2), "calibration.decrement"),
        (lambda key, s: s.update(seeds=4), "calibration.seeds"),
        (lambda key, s: s.update(gbs=[4, 8]), "calibration.gbs"),
    ],
)
def test_points_measured_for_another_question_are_refused(base_mapping, change, names):
    cfg, key, settings = _ours(base_mapping)
    change(key, settings)
    with pytest.raises(ConfigError, match=names.replace(".", r"\.")):
        load_reusable(cfg, key, settings, str(COMMITTED))


def test_adascale_and_missing_or_damaged_files_are_refused(base_mapping, tmp_path):
    cfg, key, settings = _ours(base_mapping, "optimizer.lr_scaling=adascale")
    with pytest.raises(ConfigError, match="optimizer.lr_scaling"):
        load_reusable(cfg, key, settings, str(COMMITTED))
    cfg, key, settings = _ours(base_mapping)
    with pytest.raises(ConfigError, match="no such calibration file"):
        load_reusable(cfg, key, settings, str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="bad.json: not JSON"):
        load_reusable(cfg, key, settings, str(bad))
    bad.write_text(json.dumps({"key": {"kind": "profile"}}))
    with pytest.raises(ConfigError, match="not a calibration"):
        load_reusable(cfg, key, settings, str(bad))


def test_outlier_weighting_is_part_of_the_estimator_a_calibration_belongs_to(base_mapping):
    # c = B_crit / the run's estimate: an estimator that weighs outlier steps down reads another
    # estimate, so a calibration made with one does not serve a run with the other; without it,
    # the key is the one written before the option existed (committed calibrations still serve).
    committed = json.loads(COMMITTED.read_text())["key"]["gns"]
    assert estimator_key(config_from_mapping(base_mapping, []).gns) == committed
    weighted = config_from_mapping(base_mapping, ["gns.outlier_ratio=8"])
    assert estimator_key(weighted.gns) == committed | {"outlier_ratio": 8.0}
    with pytest.raises(ConfigError, match=r"gns\.outlier_ratio"):
        config_from_mapping(base_mapping, ["gns.outlier_ratio=1"])
