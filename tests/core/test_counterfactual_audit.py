"""The realized gain of a GBS change against a counterfactual at matched loss
(copus.core.counterfactual), validated on synthetic runs whose critical batch drifts and whose
loss curves are no power law: the bias of the estimate and the coverage of its interval over
noisy replicates, and the one-run estimate (copus.core.audit.realized_gain) on the same data."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

from copus.core.audit import realized_gain
from copus.core.comparison import add_counterfactual_audits
from copus.core.counterfactual import counterfactual_gain

L0, L_INF = 5.5, 1.5
SWITCH, OLD, NEW, END = 1504, 16, 64, 16000  # GBS 16 -> 64 after 94 steps (1,504 samples); runs to 16,000
NOISE = 0.03  # per-step loss sd at GBS 16; a batch's loss averages its samples: sd ∝ 1/√GBS
REPLICATES = 100


def se(b: float, b_crit: float) -> float:
    """McCandlish: progress per sample at batch B relative to B → 0."""
    return b_crit / (b_crit + b)


def critical_batch(loss: float) -> float:
    """Grows 4.6 -> 546 as the loss falls (log-linear between anchors): 30 at the switch (SE(64)/SE(16)
    = 0.5 there), 0.66 on average over the switched run."""
    return float(np.exp(np.interp(loss, [1.75, 2.2, 4.55, 5.5], np.log([546.0, 100.0, 30.0, 4.6]))))


def drifting(loss: float, b: int) -> float:
    """dL/ds: a mixture of a power and an exponential part, times SE at the drifting critical batch."""
    gap = loss - L_INF
    return 2.1e-4 * (0.5 * gap * gap + 0.5 * gap) * se(b, critical_batch(loss))


def stalling(loss: float, b: int) -> float:
    """dL/ds of a curve that stalls as the loss falls below 3 (no power law), halved at the new GBS."""
    gap = loss - L_INF
    return 3.3e-4 * gap * gap / (1.0 + math.exp(-4.0 * (gap - 1.5))) * (0.5 if b == NEW else 1.0)


def integrate(rate, b: int, start: float, until: float, loss: float) -> tuple[np.ndarray, np.ndarray]:
    """(samples, loss) after each step of GBS `b` from `start` to `until` samples, dL/ds = −rate
    integrated by RK4 with 4 sub-steps per step."""
    s, samples, losses = start, [], []
    h = b / 4
    while s < until:
        for _ in range(4):
            k1 = rate(loss, b)
            k2 = rate(loss - h / 2 * k1, b)
            k3 = rate(loss - h / 2 * k2, b)
            k4 = rate(loss - h * k3, b)
            loss -= h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        s += b
        samples.append(s), losses.append(loss)
    return np.array(samples, dtype=float), np.array(losses)


@functools.cache
def noiseless(rate, counterfactual_until: float):
    """The run before the switch, the switched run (GBS 64) to END and the counterfactual (GBS 16
    from the switch) to `counterfactual_until`: END for a comparison's paired baseline, less for
    a short branch from the checkpoint at the switch."""
    before = integrate(rate, OLD, 0, SWITCH, L0)
    switched = integrate(rate, NEW, SWITCH, END, before[1][-1])
    counterfactual = integrate(rate, OLD, SWITCH, counterfactual_until, before[1][-1])
    return before, switched, counterfactual


def samples_to(curve, level: float, at_switch: float) -> float:
    """Samples from the switch until a falling noiseless curve reaches `level`."""
    s = np.concatenate([[SWITCH], curve[0]]) - SWITCH
    loss = np.concatenate([[at_switch], curve[1]])
    return float(np.interp(level, loss[::-1], s[::-1]))


def true_gain(rate, counterfactual_until: float) -> float:
    """The estimand on the noiseless curves: S_cf(ℓ*)/S_sw(ℓ*) at the deepest common loss ℓ*."""
    before, switched, counterfactual = noiseless(rate, counterfactual_until)
    level = max(switched[1][-1], counterfactual[1][-1])
    at_switch = before[1][-1]
    return samples_to(counterfactual, level, at_switch) / samples_to(switched, level, at_switch)


def noisy(curve, b: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    return curve[0], curve[1] + rng.normal(0.0, NOISE * math.sqrt(OLD / b), len(curve[1]))


def replicate(rate, counterfactual_until: float, seed: int):
    """One noisy run (before and after the switch) and its counterfactual, independent noise."""
    before, switched, counterfactual = noiseless(rate, counterfactual_until)
    rng = np.random.default_rng(seed)
    return noisy(before, OLD, rng), noisy(switched, NEW, rng), noisy(counterfactual, OLD, rng)


def one_run_estimate(before, switched) -> float | None:
    """The one-run audit of the same switch, from the switched run's whole curve."""
    return realized_gain(np.concatenate([before[0], switched[0]]), np.concatenate([before[1], switched[1]]), SWITCH).rho


CASES = {  # (dL/ds, where the counterfactual stops)
    "drifting B_crit, paired baseline": (drifting, END),
    "drifting B_crit, 4,000-sample branch": (drifting, SWITCH + 4000),
    "constant 0.5, stalling curve, paired baseline": (stalling, END),
    "constant 0.5, stalling curve, 4,000-sample branch": (stalling, SWITCH + 4000),
}


@pytest.mark.parametrize("case", CASES)
def test_unbiased_with_intervals_that_cover_the_truth(case):
    rate, until = CASES[case]
    true = true_gain(rate, until)
    estimates, covered = [], 0
    for seed in range(REPLICATES):
        _, switched, counterfactual = replicate(rate, until, seed)
        est = counterfactual_gain(switched, counterfactual, SWITCH, draws=200, seed=seed)
        estimates.append(est.rho)
        covered += est.interval[0] <= true <= est.interval[1]
    bias = np.mean(estimates) / true - 1
    print(f"{case}: true {true:.3f}, mean {np.mean(estimates):.3f} (bias {bias:+.1%}), coverage {covered}%")
    assert abs(bias) <= 0.10
    assert covered >= 0.90 * REPLICATES


@pytest.mark.parametrize("case", ["drifting B_crit, paired baseline", "constant 0.5, stalling curve, paired baseline"])
def test_the_one_run_estimate_of_the_same_switch_is_biased(case):
    """What the counterfactual is for: read off the switched run alone (a power law of effective
    samples), the same switch is off by far more than 10%."""
    rate, until = CASES[case]
    true = true_gain(rate, until)
    one_run = [one_run_estimate(*replicate(rate, until, seed)[:2]) for seed in range(3)]
    print(f"{case}: true {true:.3f}, one-run estimates {np.round(one_run, 3)}")
    assert abs(np.mean(one_run) / true - 1) > 0.2


def test_the_estimand_is_the_mean_gain_over_the_switched_runs_samples():
    """With a critical batch that moves with the loss, S_cf(ℓ*)/S_sw(ℓ*) is the instantaneous
    SE(64)/SE(16) averaged over the switched run's samples to ℓ*: between the ratio at the switch
    and the one at the end."""
    before, switched, counterfactual = noiseless(drifting, END)
    ratios = [se(NEW, critical_batch(x)) / se(OLD, critical_batch(x)) for x in switched[1]]
    assert ratios[0] == pytest.approx(0.5, abs=0.01) and ratios[-1] > 0.8
    assert true_gain(drifting, END) == pytest.approx(np.mean(ratios), rel=0.01)


@pytest.mark.parametrize("ratio", [0.3, 2.0])
def test_noise_free_curves_give_the_ratio(ratio):
    def rate(loss: float, b: int) -> float:
        return 2e-4 * (loss - L_INF) ** 2 * (ratio if b == NEW else 1.0)

    _, switched, counterfactual = noiseless(rate, END)
    est = counterfactual_gain(switched, counterfactual, SWITCH)
    assert est.rho == pytest.approx(ratio, rel=0.01) and est.rho == pytest.approx(true_gain(rate, END), rel=0.01)
    # No noise: the residuals are the smoothing's misfit alone, and the interval is narrow.
    assert est.interval[0] <= ratio <= est.interval[1] and est.interval[1] - est.interval[0] < 0.1 * ratio
    assert est.samples_counterfactual / est.samples_switched == est.rho and est.level is not None


def test_sparse_validation_losses_are_read_as_well():
    """Every 10th step's loss with little noise (validation): a curve of ~90 and ~23 points."""
    true = true_gain(drifting, END)
    _, switched, counterfactual = noiseless(drifting, END)
    rng = np.random.default_rng(7)
    val = [(s[::10], x[::10] + rng.normal(0.0, 0.003, len(x[::10]))) for s, x in (switched, counterfactual)]
    est = counterfactual_gain(*val, SWITCH)
    assert est.rho == pytest.approx(true, rel=0.05) and est.interval[0] <= true <= est.interval[1]
    assert (est.n_before, est.n_after) == (len(val[1][0]), len(val[0][0]))


def test_the_same_curves_give_the_same_answer_whatever_else_is_passed():
    before, switched, counterfactual = replicate(drifting, END, 3)
    est = counterfactual_gain(switched, counterfactual, SWITCH)
    # The run's points before the switch are left out; order and non-finite points do not matter.
    whole = (np.concatenate([before[0], switched[0]]), np.concatenate([before[1], switched[1]]))
    order = np.random.default_rng(0).permutation(len(whole[0]))
    shuffled = (np.append(whole[0][order], 20000.0), np.append(whole[1][order], np.nan))
    assert counterfactual_gain(shuffled, counterfactual, SWITCH) == est
    assert est.n_before == len(counterfactual[0]) and est.n_after == len(switched[0])
    assert "matched loss" in est.note


def test_too_few_points_or_no_common_progress_is_none_with_a_reason():
    _, switched, counterfactual = replicate(drifting, END, 0)
    short = (switched[0][:9], switched[1][:9])
    est = counterfactual_gain(short, counterfactual, SWITCH)
    assert est.rho is None and est.interval is None and "too few points after the switch" in est.note
    assert (est.n_before, est.n_after) == (len(counterfactual[0]), 9)
    # A run that diverged after the switch: its loss rose above where it started.
    diverged = (switched[0], switched[1] + np.linspace(0.0, 4.0, len(switched[1])))
    est = counterfactual_gain(diverged, counterfactual, SWITCH)
    assert est.rho is None and "no common progress" in est.note


# `copus compare`: a copus run's first change of GBS audited against the static run of its repeat.

LAYOUT = {"dp": 2, "tp": 1, "pp": 1, "mbs": 8}


def step_records(*curves) -> list[dict]:
    """Step records of a run made of consecutive (samples, loss) curves."""
    samples = np.concatenate([c[0] for c in curves])
    loss = np.concatenate([c[1] for c in curves])
    return [
        {"kind": "step", "step": i + 1, "samples": float(s), "train_loss": float(x)}
        for i, (s, x) in enumerate(zip(samples, loss))
    ]


def gbs_change(step: int, samples: float, old: int, new: int, **audit) -> dict:
    """A summary.json reconfigurations entry."""
    return {
        "step": step,
        "samples": samples,
        "from": {**LAYOUT, "gbs": old},
        "to": {**LAYOUT, "gbs": new},
        "in_place": True,
        **audit,
    }


def row(policy: str, repeat: int = 0, seed: int = 0) -> dict:
    """An entry of comparison.json's runs."""
    return {
        "policy": policy,
        "repeat": repeat,
        "seed": seed,
        "initial_layout": {**LAYOUT, "gbs": OLD},
        "output_dir": f"/suite/{policy}/r{repeat}",
    }


def suite_of_two():
    """A copus run that switched 16 -> 64 (drifting B_crit) and the static run of its repeat:
    the same run until the switch (the same losses), then each with its own noise."""
    before, switched, counterfactual = replicate(drifting, END, 11)
    change = gbs_change(
        94,
        SWITCH,
        OLD,
        NEW,
        predicted_efficiency_gain=0.5,
        realized_efficiency_gain=0.81,
        realized_efficiency_interval=[0.7, 0.9],
    )
    records = {
        "/suite/copus/r0": step_records(before, switched),
        "/suite/static/r0": step_records(before, counterfactual),
    }
    summaries = {("copus", 0): {"reconfigurations": [change]}, ("static", 0): {"reconfigurations": []}}
    return records, summaries


def test_a_copus_run_is_audited_once_its_static_run_is_done():
    records, summaries = suite_of_two()
    runs, warnings = [row("copus")], []
    add_counterfactual_audits(
        runs, {("copus", 0): summaries[("copus", 0)]}, ["copus", "static"], records.get, warnings.append
    )
    assert "counterfactual_audit" not in runs[0]  # static has not run yet
    runs.append(row("static"))
    add_counterfactual_audits(runs, summaries, ["copus", "static"], records.get, warnings.append)
    audit = runs[0]["counterfactual_audit"]
    assert "counterfactual_audit" not in runs[1] and warnings == []
    assert (audit["step"], audit["samples"], audit["from_gbs"], audit["to_gbs"]) == (94, SWITCH, OLD, NEW)
    assert audit["predicted_efficiency_gain"] == 0.5 and audit["one_run_efficiency_gain"] == 0.81
    true = true_gain(drifting, END)
    low, high = audit["realized_efficiency_interval"]
    assert audit["realized_efficiency_gain"] == pytest.approx(true, rel=0.05) and low <= true <= high
    assert audit["loss_gap_before_switch"] == 0.0  # one run until the switch
    _, switched, counterfactual = noiseless(drifting, END)
    assert audit["audit_points"] == {"static": len(counterfactual[0]), "switched": len(switched[0])}
    need = audit["samples_to_matched_loss"]
    assert need["static"] / need["switched"] == audit["realized_efficiency_gain"] and audit["matched_loss"] > L_INF
    # Computed once: a later run does not redo it.
    add_counterfactual_audits(runs, summaries, ["copus", "static"], None, warnings.append)
    assert runs[0]["counterfactual_audit"] is audit and warnings == []


def test_the_switched_curve_ends_at_the_next_change_of_gbs():
    records, summaries = suite_of_two()
    layout_only = {**gbs_change(120, 3168, NEW, NEW), "to": {**LAYOUT, "dp": 1, "pp": 2, "gbs": NEW}}
    summaries[("copus", 0)]["reconfigurations"] += [layout_only, gbs_change(200, 8288, NEW, 128)]
    runs = [row("copus"), row("static")]
    add_counterfactual_audits(runs, summaries, ["copus", "static"], records.get, print)
    audit = runs[0]["counterfactual_audit"]
    assert audit["audit_points"]["switched"] == (8288 - SWITCH) // NEW and audit["realized_efficiency_gain"] is not None


def test_runs_that_cannot_be_audited_say_why():
    records, summaries = suite_of_two()
    summaries[("copus-gbs", 0)] = {"reconfigurations": []}
    summaries[("copus", 1)] = summaries[("copus", 0)]
    summaries[("static", 1)] = summaries[("static", 0)]
    runs = [row("copus-gbs"), row("copus", repeat=1, seed=1), row("static", repeat=1, seed=5), row("static")]
    add_counterfactual_audits(runs, summaries, ["copus", "copus-gbs", "static"], records.get, print)
    assert runs[0]["counterfactual_audit"]["audit_note"] == "no change of GBS: nothing to audit"
    assert "no static run with the same seed" in runs[1]["counterfactual_audit"]["audit_note"]  # seeds: vary
    assert runs[1]["counterfactual_audit"]["realized_efficiency_gain"] is None
    # No static policy in the suite: said at once.
    alone = [row("copus")]
    add_counterfactual_audits(alone, summaries, ["copus", "cbs-optimistic"], records.get, print)
    assert "no static run" in alone[0]["counterfactual_audit"]["audit_note"]


def test_an_audit_that_fails_keeps_the_comparison_with_the_reason():
    _, summaries = suite_of_two()
    runs, warnings = [row("copus"), row("static")], []

    def unreadable(output_dir: str) -> list[dict]:
        raise OSError("gone")

    add_counterfactual_audits(runs, summaries, ["copus", "static"], unreadable, warnings.append)
    audit = runs[0]["counterfactual_audit"]
    assert audit["audit_note"] == "audit failed: OSError" and audit["predicted_efficiency_gain"] == 0.5
    assert len(warnings) == 1 and "gone" in warnings[0]
