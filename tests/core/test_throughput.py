"""The step-time model: fitting recovers known coefficients, predicts GBS values it never saw,
reports honest held-out error, and behaves as the physics says it must."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from copus.core.layout import CandidateConfig, bubble_fraction
from copus.core.search import candidates, gbs_grid, valid_layouts
from copus.core.throughput import (
    Measurement,
    StepTimeModel,
    StepTimeParams,
    cross_validate,
    fit_step_time_model,
)
from workloads.flavours import FLAVOURS

SHAPE = FLAVOURS["small"].shape()  # 4 layers, 8 heads: tp and pp up to 4
TRUE = StepTimeParams(
    a0=0.004, a1=0.012, c0=0.002, c1=0.0008, p0=0.003, p1=0.0005, d0=0.01, d1=4e-10, o0=0.02, o1=2e-9, z=0.8
)
TRUE_MODEL = StepTimeModel(TRUE, SHAPE)


def synthetic(world: int, noise: float = 0.0, seed: int = 0, gbs=(16, 32, 64, 128)) -> list[Measurement]:
    cands = candidates(valid_layouts(world, SHAPE), [2, 4, 8], list(gbs), SHAPE)
    rng = np.random.default_rng(seed)
    times = TRUE_MODEL.step_times(cands) * (1 + noise * rng.standard_normal(len(cands)))
    return [Measurement(c, float(t)) for c, t in zip(cands, times)]


def test_fit_recovers_known_coefficients_from_a_noiseless_profile():
    points = synthetic(8) + synthetic(4)  # two world sizes: every coefficient is identifiable
    fitted = fit_step_time_model(points, SHAPE)
    for name in ("a0", "a1", "c0", "c1", "p0", "p1", "d0", "d1", "o0", "o1", "z"):
        assert getattr(fitted.params, name) == pytest.approx(getattr(TRUE, name), rel=0.02, abs=1e-12), name


def test_fit_predicts_gbs_values_it_never_saw():
    fitted = fit_step_time_model(synthetic(8, noise=0.02, gbs=(16, 128)), SHAPE)
    unseen = candidates(valid_layouts(8, SHAPE), [2, 4, 8], [24, 48, 96], SHAPE)
    predicted, truth = fitted.step_times(unseen), TRUE_MODEL.step_times(unseen)
    assert np.max(np.abs(predicted / truth - 1)) < 0.05


def test_cross_validation_error_is_small_on_clean_data_and_honest_on_noisy_data():
    clean = cross_validate(synthetic(8), SHAPE)
    assert clean.mape < 0.01 and clean.max_ape < 0.03
    noisy = cross_validate(synthetic(8, noise=0.08, seed=3), SHAPE)
    # Held-out error cannot beat the noise it never saw.
    assert 0.03 < noisy.mape < 0.15
    assert len(noisy.predicted) == len(synthetic(8))


def test_a_noisy_outlier_does_not_drag_the_fit():
    points = synthetic(8)
    points[5] = Measurement(points[5].config, points[5].step_time_s * 3)  # one disturbed measurement
    fitted = fit_step_time_model(points, SHAPE)
    others = [p.config for i, p in enumerate(points) if i != 5]
    assert np.median(np.abs(fitted.step_times(others) / TRUE_MODEL.step_times(others) - 1)) < 0.02


@given(pp=st.integers(2, 4), m=st.integers(1, 64))
def test_more_microbatches_shrink_the_bubble_fraction(pp, m):
    m = max(m, pp)
    assert bubble_fraction(pp, m + 1) < bubble_fraction(pp, m)
    a, b = (TRUE_MODEL.terms(CandidateConfig(1, 1, pp, 2, 2 * k)) for k in (m, m + 1))
    assert b.bubble / b.step < a.bubble / a.step


def test_larger_dp_raises_all_reduce_time_for_the_same_gradient():
    times = [TRUE_MODEL.terms(CandidateConfig(dp, 1, 1, 2, 2 * dp * 4)).dp_allreduce for dp in (1, 2, 4, 8, 16)]
    assert times[0] == 0.0
    assert all(b > a for a, b in zip(times, times[1:]))


@settings(max_examples=50)
@given(st.sampled_from(candidates(valid_layouts(8, SHAPE), [2, 4], [16, 32, 64], SHAPE)))
def test_step_time_grows_with_gbs_and_is_positive(cfg):
    bigger = CandidateConfig(cfg.dp, cfg.tp, cfg.pp, cfg.mbs, cfg.gbs * 2)
    assert 0 < TRUE_MODEL.step_time(cfg) < TRUE_MODEL.step_time(bigger)
    assert TRUE_MODEL.throughput(cfg) == pytest.approx(cfg.gbs / TRUE_MODEL.step_time(cfg))


def test_overlap_never_makes_a_step_slower_than_no_overlap():
    overlapped = StepTimeModel(StepTimeParams(**{**TRUE.as_dict(), "gamma": 3.0}), SHAPE)
    cfgs = candidates(valid_layouts(8, SHAPE), [4], [32, 64], SHAPE)
    assert np.all(overlapped.step_times(cfgs) <= TRUE_MODEL.step_times(cfgs) + 1e-12)


def test_model_knows_when_it_extrapolates():
    fitted = fit_step_time_model([p for p in synthetic(8) if p.config.tp == 1], SHAPE)
    assert not fitted.extrapolates(CandidateConfig(4, 1, 2, 2, 32))
    assert fitted.extrapolates(CandidateConfig(4, 2, 1, 2, 32))


def test_gbs_grid_spacing_and_bounds():
    assert gbs_grid(8, 128) == [8, 12, 16, 24, 32, 48, 64, 96, 128]
    assert gbs_grid(10, 10) == [10]
    assert gbs_grid(20, 100) == [20, 24, 32, 48, 64, 96, 100]


def test_a_point_measured_twice_keeps_the_faster_unless_the_two_disagree_then_the_median_of_three():
    from copus.core.throughput import kept_step_time, measurements_disagree

    assert kept_step_time([0.30]) == 0.30
    # Two within 20%: the slower (the emulated cluster's pp2 point read 0.083 then 0.071 s; runs
    # of it paid 0.089-0.098 s).
    assert kept_step_time([0.083, 0.071]) == 0.083 and not measurements_disagree([0.083, 0.071])
    # The emulated cluster's point: 0.16 s, then 0.30 s; a third measurement decides.
    assert measurements_disagree([0.16, 0.30])
    assert kept_step_time([0.16, 0.30, 0.31]) == 0.30
    assert kept_step_time([0.16, 0.30, 0.17]) == 0.17
    assert not measurements_disagree([0.16, 0.30, 0.31])  # three: nothing more to measure
    with pytest.raises(ValueError):
        kept_step_time([])
