"""The step-time model's sharding, recomputation and overlap terms: they move the prediction the
way their definitions say, and a profile that measures them fits them."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from copus.core.layout import DP_SHARD_MODES, RECOMPUTE_MODES, CandidateConfig
from copus.core.search import candidates, valid_layouts
from copus.core.throughput import Measurement, StepTimeModel, StepTimeParams, dp_collectives, fit_step_time_model
from workloads.flavours import FLAVOURS

SHAPE = FLAVOURS["small"].shape()
TRUE = StepTimeParams(
    a0=0.004, a1=0.012, c0=0.002, c1=0.0008, p0=0.003, p1=0.0005, d0=0.01, d1=4e-10, o0=0.02, o1=2e-9, z=0.8,
    r_full=0.4, r_sel=0.08, gamma=1.6,
)  # fmt: skip
MODEL = StepTimeModel(TRUE, SHAPE)


def test_recomputation_adds_its_share_of_compute():
    base = CandidateConfig(2, 2, 1, 4, 32)
    compute = {r: MODEL.terms(replace(base, recompute=r)).compute for r in RECOMPUTE_MODES}
    assert compute["full"] == pytest.approx(compute["none"] * 1.4)
    assert compute["selective"] == pytest.approx(compute["none"] * 1.08)


def test_full_sharding_gathers_for_every_micro_batch_and_sharded_optimizers_step_faster():
    few, many = CandidateConfig(4, 1, 1, 4, 16), CandidateConfig(4, 1, 1, 4, 128)
    assert dp_collectives("none", 8) == dp_collectives("optimizer", 8) == 1.0
    assert dp_collectives("full", 8) == 8.5
    none_ar, full_ar = (MODEL.terms(replace(many, dp_shard=s)).dp_allreduce for s in ("none", "full"))
    assert full_ar == pytest.approx(none_ar * dp_collectives("full", many.microbatches))
    assert MODEL.terms(replace(few, dp_shard="full")).dp_allreduce < full_ar
    assert MODEL.terms(replace(few, dp_shard="optimizer")).fixed < MODEL.terms(few).fixed


def test_a_profile_with_every_knob_fits_their_costs_and_the_overlap():
    cands = candidates(valid_layouts(4, SHAPE), [2, 4], [16, 32, 64], SHAPE, DP_SHARD_MODES, RECOMPUTE_MODES)
    cands += candidates(valid_layouts(8, SHAPE), [2, 4], [32, 64], SHAPE, DP_SHARD_MODES, RECOMPUTE_MODES)
    points = [Measurement(c, float(t)) for c, t in zip(cands, MODEL.step_times(cands))]
    fitted = fit_step_time_model(points, SHAPE)
    assert fitted.params.r_full == pytest.approx(0.4, rel=0.05)
    assert fitted.params.r_sel == pytest.approx(0.08, rel=0.1)
    assert fitted.params.gamma > 1.2  # overlap is fitted, not assumed absent
    assert np.allclose(fitted.step_times(cands), MODEL.step_times(cands), rtol=0.02)


def test_without_recomputed_points_their_costs_keep_the_prior():
    cands = candidates(valid_layouts(4, SHAPE), [2, 4], [16, 32, 64], SHAPE)
    points = [Measurement(c, float(t)) for c, t in zip(cands, MODEL.step_times(cands))]
    fitted = fit_step_time_model(points, SHAPE)
    assert (fitted.params.r_full, fitted.params.r_sel) == (StepTimeParams().r_full, StepTimeParams().r_sel)
