"""One NaN-to-null rule for every JSON the project writes (calibration files, summary.json's
controller and reconfiguration entries, probe values)."""

from __future__ import annotations

import json
import math

import numpy as np

from copus.core.finite import finite_json


def test_non_finite_floats_become_null_at_any_depth_and_nothing_else_changes():
    value = {"a": math.nan, "b": [1.5, math.inf, (np.float32("nan"), np.float64(2.0))], "c": 3, "d": None, "e": "x"}
    out = finite_json(value)
    assert out == {"a": None, "b": [1.5, None, [None, 2.0]], "c": 3, "d": None, "e": "x"}
    assert type(out["b"][2][1]) is float and type(out["c"]) is int  # numpy floats become floats, ints stay
    assert json.loads(json.dumps(out, allow_nan=False)) == out
    assert finite_json(np.float32(0.5)) == 0.5 and finite_json(True) is True
