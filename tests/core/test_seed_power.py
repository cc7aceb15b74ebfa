"""What fewer seeds would have given (copus.core.seed_power), on a synthetic calibration whose
continuations follow E(B) = E_min (1 + B / B_crit) with log-normal seed noise."""

import math

import numpy as np
import pytest

from copus.core.seed_power import seed_subsets

B0, GRID, SEEDS = 16, (4, 16, 64, 256), 6
TRUTH = ((2.6, 800.0, 40.0), (2.3, 2000.0, 120.0))  # (val loss, E_min, B_crit) per branch point


def _calibration(noise: float, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    points = [
        {
            "branch": i,
            "gbs": g,
            "seed": k,
            "samples": e_min * (1 + g / b_crit) * math.exp(noise * rng.standard_normal()),
            "reached": True,
        }
        for i, (_, e_min, b_crit) in enumerate(TRUTH)
        for g in GRID
        for k in range(SEEDS)
    ]
    branches = [{"val_loss": loss, "samples_seen": 1000 * (i + 1)} for i, (loss, _, _) in enumerate(TRUTH)]
    # An LR probe's continuation is not part of the fit: it must not move anything.
    points.append({"branch": 0, "gbs": 16, "seed": 0, "samples": 1.0, "reached": True, "lr_factor": 2.0})
    return {"reference_gbs": B0, "decrement": 0.1, "branch_points": branches, "points": points}


def test_all_the_seeds_give_the_whole_fit_once():
    rows = seed_subsets(_calibration(0.2), SEEDS, draws=100)
    for row, (_, _, b_crit) in zip(rows, TRUTH):
        assert row["subsets"] == 1 and row["ratio_median"] == pytest.approx(1.0)
        assert row["within_close_factor"] == 1.0 and row["interval_covers"] == 1.0
        assert row["b_crit"] == pytest.approx(b_crit, rel=0.35)


def test_fewer_seeds_spread_more_and_their_intervals_widen():
    data = _calibration(0.2)
    two, four = seed_subsets(data, 2, draws=100), seed_subsets(data, 4, draws=100)
    for a, b in zip(two, four):
        assert a["subsets"] == math.comb(SEEDS, 2) and b["subsets"] == math.comb(SEEDS, 4)
        assert a["ratio_q10"] <= 1.0 <= a["ratio_q90"]
        assert a["ratio_q90"] / a["ratio_q10"] > b["ratio_q90"] / b["ratio_q10"]
        assert a["interval_width_median"] > b["interval_width_median"]


def test_noiseless_continuations_read_the_same_from_any_seeds():
    for row in seed_subsets(_calibration(0.0), 1, draws=50):
        assert row["ratio_q10"] == pytest.approx(1.0) and row["ratio_q90"] == pytest.approx(1.0)


def test_subsets_are_drawn_when_there_are_too_many_and_k_is_checked():
    assert seed_subsets(_calibration(0.2), 3, limit=5, draws=50)[0]["subsets"] == 5
    with pytest.raises(ValueError, match="seeds: need 1 to 6"):
        seed_subsets(_calibration(0.2), 7)
