"""The trade-off figures of a profile and a calibration (copus.core.tradeoffs)."""

from __future__ import annotations

import math

import pytest

from copus.core.layout import CandidateConfig
from copus.core.tradeoffs import fastest_by_gbs, layout_boundary, layout_table_lines, tradeoff_lines, tradeoffs


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
    assert "x5.00" in lines[0] and "change with the GBS" in lines[0] and "x8.0" in lines[2]
    # dp4 leads pp4 by 50% at GBS 4, pp4 leads dp4 by 25% at GBS 256: the layout must move.
    b = t["layout_boundary"]
    assert b["must_move"] and (b["fastest_at_small"], b["fastest_at_large"]) == ("dp4-tp1-pp1", "dp1-tp1-pp4")
    assert b["lead_at_small"] == pytest.approx(0.5) and b["lead_at_large"] == pytest.approx(0.25)
    assert "+50%" in lines[1] and "+25%" in lines[1] and "must move" in lines[1]


def test_a_flat_space_says_so_and_missing_parts_are_left_out():
    t = tradeoffs({CandidateConfig(2, 1, 1, 4, 8): 100.0, CandidateConfig(2, 1, 1, 4, 16): 105.0}, [{"b_crit": 3.0}])
    assert not t["fastest_shape_changes"] and "b_crit_growth" not in t
    assert "are the same at both ends" in tradeoff_lines(t)[0]
    assert tradeoffs({})["fastest_by_gbs"] == [] and tradeoff_lines(tradeoffs({})) == []
    assert not tradeoffs({})["layout_boundary"]["must_move"]


def test_the_layout_need_not_move_when_a_lead_is_under_the_bar():
    table = {4: {"dp4-tp1-pp1": 30.0, "dp1-tp1-pp4": 20.0}, 256: {"dp4-tp1-pp1": 120.0, "dp1-tp1-pp4": 132.0}}
    b = layout_boundary(table)
    assert not b["must_move"] and b["lead_at_large"] == pytest.approx(0.10)
    assert layout_boundary(table, min_lead=0.1)["must_move"]
    # Where the large-GBS layout wins by most counts, not only the largest GBS, where compute can
    # drown both layouts' communication (the emulated cluster's seq-128 profile looked so).
    table = {
        4: {"dp4-tp1-pp1": 10.0, "dp2-tp1-pp2": 16.6},
        64: {"dp4-tp1-pp1": 77.2, "dp2-tp1-pp2": 66.0},
        256: {"dp4-tp1-pp1": 89.6, "dp2-tp1-pp2": 88.5},
    }
    b = layout_boundary(table)
    assert b["must_move"] and (b["fastest_at_small"], b["fastest_at_large"]) == ("dp2-tp1-pp2", "dp4-tp1-pp1")
    assert (b["large_gbs"], b["largest_gbs"]) == (64, 256)
    assert b["lead_at_large"] == pytest.approx(77.2 / 66.0 - 1) and b["lead_at_largest"] == pytest.approx(
        89.6 / 88.5 - 1
    )
    line = tradeoff_lines({"layout_boundary": b})[0]
    assert "+17% at GBS 64 (+1% at GBS 256): the layout must move" in line
    # The same layout fastest at both ends: no boundary, whatever happens between them.
    table[256] = {"dp4-tp1-pp1": 80.0, "dp2-tp1-pp2": 88.5}
    b = layout_boundary(table)
    assert not b["must_move"] and b["large_gbs"] == 256
    assert (
        "none, dp2-tp1-pp2 is the fastest layout at GBS 4 and at GBS 256" in tradeoff_lines({"layout_boundary": b})[0]
    )
    # The best MBS of each layout stands for it; the fastest is marked, per GBS.
    t = tradeoffs(
        {
            CandidateConfig(4, 1, 1, 1, 4): 30.0,
            CandidateConfig(4, 1, 1, 4, 4): 35.0,
            CandidateConfig(1, 1, 4, 1, 4): 20.0,
        }
    )
    assert t["layouts_by_gbs"] == [{"gbs": 4, "samples_per_s": {"dp4-tp1-pp1": 35.0, "dp1-tp1-pp4": 20.0}}]
    lines = layout_table_lines(t, {"dp4-tp1-pp1": ["dp"], "dp1-tp1-pp4": []})
    assert "crosses: dp" in lines[2] and "in-node" in lines[2] and "35.0*" in lines[3]
