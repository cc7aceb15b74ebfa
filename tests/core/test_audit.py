"""The realized statistical-efficiency gain of a GBS change, read off noisy synthetic loss curves
with a known critical batch (copus.core.audit), and the audit of a run's reconfigurations."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from copus.core.audit import audit_reconfigurations, realized_gain
from copus.core.reconfiguration import Reconfiguration


def audited(entries: list[dict], records: list[dict], **kw) -> list[dict]:
    """The audit of reconfigurations written as summary.json lists them, as it lists them."""
    changes = [Reconfiguration.from_dict({"in_place": True, **e}) for e in entries]
    return [c.as_dict() for c in audit_reconfigurations(changes, records, **kw)]


def se(b: float, b_crit: float) -> float:
    """McCandlish: progress per sample at batch B relative to B → 0."""
    return b_crit / (b_crit + b)


def loss_curve(
    phases: list[tuple[int, int]],
    rate,
    noise: float = 0.0,
    p: float = 2.0,
    l0: float = 5.5,
    l_inf: float = 1.5,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Step by step through `phases` [(GBS, until samples), ...] with dL/ds = −rate(B, phase)·(L − L∞)^p,
    integrated exactly over each step ((L − L∞)^(1−p) grows by (p − 1)·rate·B). Observed per-step
    losses carry gaussian noise of sd `noise`·√(16/B) (a batch's loss averages B samples)."""
    rng = np.random.default_rng(seed)
    s, gap, samples, losses, batches = 0, l0 - l_inf, [], [], []
    for phase, (b, until) in enumerate(phases):
        while s < until:
            gap = (gap ** (1 - p) + (p - 1) * rate(b, phase) * b) ** (1 / (1 - p))
            s += b
            samples.append(s), losses.append(l_inf + gap), batches.append(b)
    sd = noise * np.sqrt(16.0 / np.array(batches, dtype=float))
    return np.array(samples, dtype=float), np.array(losses) + rng.normal(0.0, 1.0, len(losses)) * sd


def mccandlish(b_crit: float):
    """dL/ds = −k·SE(B)·(L − L∞)^p, k such that the loss falls from 5.5 to about 1.8 in 16,000 samples."""
    k = 1.0 / 4000 / se(16, b_crit)
    return lambda b, phase: k * se(b, b_crit)


# (B_crit, B1, B2): both directions, a small and a large critical batch. k sets the loss from 5.5
# to about 1.8 over the 16,000 samples; per-step noise sd 0.03 at GBS 16 (0.015 at GBS 64).
@pytest.mark.parametrize("b_crit,b1,b2", [(8, 16, 64), (8, 64, 16), (100, 16, 64), (100, 64, 16)])
def test_recovers_the_true_efficiency_ratio_within_10_percent(b_crit, b1, b2):
    samples, loss = loss_curve([(b1, 4096), (b2, 16384)], mccandlish(b_crit), noise=0.03)
    true = se(b2, b_crit) / se(b1, b_crit)
    est = realized_gain(samples, loss, 4096)
    print(
        f"B_crit {b_crit}: GBS {b1}->{b2} true {true:.3f} estimated {est.rho:.3f} "
        f"[{est.interval[0]:.3f}, {est.interval[1]:.3f}] ({est.n_before}/{est.n_after} points)"
    )
    assert est.rho == pytest.approx(true, rel=0.10)
    assert est.interval[0] <= true <= est.interval[1]
    assert est.n_before == 4096 // b1 and est.n_after == 12288 // b2 - 5  # less the settling steps


@settings(max_examples=5, deadline=None)
@given(rho=st.floats(0.2, 5.0), p=st.floats(1.3, 3.0), switch=st.sampled_from([1600, 3200]))
def test_noise_free_curves_give_the_ratio_for_any_loss_gap_exponent(rho, p, switch):
    # One batch size; progress per sample multiplied by ρ after the switch.
    samples, loss = loss_curve([(16, switch), (16, switch + 3200)], lambda b, phase: 1e-4 * rho**phase, p=p)
    est = realized_gain(samples, loss, switch, settle_steps=0)
    assert est.rho == pytest.approx(rho, rel=0.02)


def test_too_few_points_after_the_change_is_none_with_a_reason():
    samples, loss = loss_curve([(16, 4096), (64, 4096 + 64 * 12)], mccandlish(100), noise=0.03)
    est = realized_gain(samples, loss, 4096)  # 12 steps after, 5 of them settling
    assert est.rho is None and est.interval is None and est.n_after == 7
    assert "too few points after the change" in est.note
    est = realized_gain(samples, loss, samples[-1])  # the run ended at the change
    assert est.rho is None and est.n_after == 0
    est = realized_gain(samples, loss, 4096, end=4096 + 64 * 12, start=4096 - 16 * 8, settle_steps=0)
    assert est.rho is None and est.n_before == 8 and "too few points before the change" in est.note
    est = realized_gain(samples, np.full_like(loss, np.nan), 4096)  # non-finite losses are dropped
    assert est.rho is None and est.n_before == est.n_after == 0


def test_audit_of_a_run_adds_predicted_and_realized_gain_to_every_change():
    samples, loss = loss_curve([(16, 4096), (64, 16384)], mccandlish(100), noise=0.03)
    steps = [
        {"kind": "step", "step": i + 1, "samples": float(s), "train_loss": float(v), "gbs": 16 if s <= 4096 else 64}
        for i, (s, v) in enumerate(zip(samples, loss))
    ]
    layout = {"dp": 2, "tp": 1, "pp": 1, "mbs": 8}
    change = {"step": 256, "samples": 4096, "from": {**layout, "gbs": 16}, "to": {**layout, "gbs": 64}}
    relayout = {
        "step": 300,
        "samples": 6912,
        "from": {**layout, "gbs": 64},
        "to": {**layout, "dp": 1, "pp": 2, "gbs": 64},
    }
    reconfigure = {"kind": "reconfigure", **change, "predicted_efficiency_gain": 0.7}
    # A worker failure after step 110: the group resumed from step 100's checkpoint and redid
    # steps 101-110. The first attempt's records (a wild loss here) are superseded.
    failed = [{**r, "train_loss": 50.0} for r in steps[100:110]]
    records = steps[:100] + failed + steps[100:256] + [reconfigure] + steps[256:]
    first, second = audited([change, relayout], records)
    assert "realized_efficiency_gain" not in change  # the inputs are left unchanged
    assert first["predicted_efficiency_gain"] == 0.7
    assert first["realized_efficiency_gain"] == pytest.approx(se(64, 100) / se(16, 100), rel=0.10)
    lo, hi = first["realized_efficiency_interval"]
    assert lo <= first["realized_efficiency_gain"] <= hi
    assert first["audit_points"] == {"before": 256, "after": 192 - 5} and "power-law" in first["audit_note"]
    assert second["realized_efficiency_gain"] is None and second["predicted_efficiency_gain"] is None
    assert "no change of GBS" in second["audit_note"]
    # No prediction carried (an older record, a scripted decision): none is made up.
    alone = audited([change], steps)[0]
    assert alone["predicted_efficiency_gain"] is None and math.isfinite(alone["realized_efficiency_gain"])


def test_a_change_between_two_others_is_read_between_them():
    """16 -> 32 -> 64: each window stops at the neighbouring change; the middle phase's first
    steps (settling after the first change) are left out of the second change's window before."""
    phases = [(16, 4096), (32, 8192), (64, 16384)]
    samples, loss = loss_curve(phases, mccandlish(100), noise=0.03)
    steps = [
        {"kind": "step", "step": i + 1, "samples": s, "train_loss": v} for i, (s, v) in enumerate(zip(samples, loss))
    ]
    layout = {"dp": 2, "tp": 1, "pp": 1, "mbs": 8}
    entries = [
        {"step": 256, "samples": 4096, "from": {**layout, "gbs": 16}, "to": {**layout, "gbs": 32}},
        {"step": 384, "samples": 8192, "from": {**layout, "gbs": 32}, "to": {**layout, "gbs": 64}},
    ]
    first, second = audited(entries, steps, run_start_samples=320)
    print(
        f"16->32 true {se(32, 100) / se(16, 100):.3f} estimated {first['realized_efficiency_gain']:.3f}; "
        f"32->64 true {se(64, 100) / se(32, 100):.3f} estimated {second['realized_efficiency_gain']:.3f}"
    )
    assert first["audit_points"] == {"before": 256 - 20, "after": 128 - 5}  # after the warm-up's 20 steps
    assert second["audit_points"] == {"before": 128 - 5, "after": 128 - 5}
    assert first["realized_efficiency_gain"] == pytest.approx(se(32, 100) / se(16, 100), rel=0.10)
    assert second["realized_efficiency_gain"] == pytest.approx(se(64, 100) / se(32, 100), rel=0.10)


def test_a_curve_the_model_cannot_follow_gives_none():
    """No progress at all after the change (a run that diverged, a data loader that repeats):
    the fit runs to ρ = 1/20, which is reported as no estimate."""
    samples, loss = loss_curve([(16, 4096), (64, 8192)], mccandlish(100), noise=0.03)
    loss[samples > 4096] = loss[samples <= 4096][-1] + 0.5
    est = realized_gain(samples, loss, 4096)
    assert est.rho is None and "search bound" in est.note
