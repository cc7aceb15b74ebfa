"""The trade-off figures of a profile and a calibration (copus.core.tradeoffs)."""

from __future__ import annotations

import math

import pytest

from copus.core.layout import CandidateConfig
from copus.core.tradeoffs import fastest_by_gbs, tradeoff_lines, tradeoffs


def test_fastest_per_gbs_and_the_figures_of_both_trade_offs():
    measured = {
        CandidateConfig(4, 1, 1, 1, 4): 30.0,
        CandidateConfig(1, 1, 4, 1, 4): 20.0,
        CandidateConfig(2, 1, 2, 1, 4): float("nan"),
        CandidateConfig(4, 1, 1, 16, 256): 120.0,
        CandidateConfig(1, 1, 4, 16, 256): 150.0,
        CandidateConfig(4, 1, 1, 4, 64): 140.0,
    }
    rows = fastest_by_gbs(measured)
    assert [(r["gbs"], r["shape"]) for r in rows] == [
        (4, "dp4-tp1-pp1 mbs1"),
        (64, "dp4-tp1-pp1 mbs4"),
        (256, "dp1-tp1-pp4 mbs16"),
    ]
    branches = [{"b_crit": 5.0}, {"b_crit": None}, {"b_crit": math.inf}, {"b_crit": 40.0}]
    t = tradeoffs(measured, branches)
    assert t["throughput_ratio"] == pytest.approx(5.0) and t["fastest_shape_changes"]
    assert (t["fastest_at_smallest_gbs"], t["fastest_at_largest_gbs"]) == ("dp4-tp1-pp1 mbs1", "dp1-tp1-pp4 mbs16")
    assert t["b_crit_growth"] == pytest.approx(8.0)
    lines = tradeoff_lines(t)
    assert "x5.00" in lines[0] and "change with the GBS" in lines[0] and "x8.0" in lines[1]


def test_a_flat_space_says_so_and_missing_parts_are_left_out():
    t = tradeoffs({CandidateConfig(2, 1, 1, 4, 8): 100.0, CandidateConfig(2, 1, 1, 4, 16): 105.0}, [{"b_crit": 3.0}])
    assert not t["fastest_shape_changes"] and "b_crit_growth" not in t
    assert "are the same at both ends" in tradeoff_lines(t)[0]
    assert tradeoffs({}) == {"fastest_by_gbs": []} and tradeoff_lines(tradeoffs({})) == []
