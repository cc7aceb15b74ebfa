"""When the controller measures its own critical batch during a run (a probe), at which GBS,
and what the measurement is set against.

Without a calibration the controller maps the live noise scale to a critical batch with a
factor c it does not know well (`copus.core.belief`: prior c = 2.3, a factor of 2 either way).
A probe buys a measurement of c: a branch from a checkpoint of the run, trained at another GBS
while the run goes on, whose losses per sample are set against the run's own from the same
checkpoint (`copus.core.counterfactual`). It costs compute beside the run's (on a shared
machine, the run's own time), so the controller probes only where the answer could change
what it does (the value of the information): when the configuration the planner picks at the
belief's low quantile of c and the one it picks at its high quantile leave the run at
different GBS (a switch at one of them and not at the other, or switches to different GBS).
The probe then trains at the one of those GBS that the run is not at, so the measurement
compares exactly the two batch sizes the decision hangs on.

Probes are spaced geometrically in samples (`spacing`, at most `max_probes`), as the belief
drifts with the log of the samples seen, and not during the LR warm-up, whose rising LR is no
part of what c describes.

Pure: no torch, no ray.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ProbeSettings:
    """`policy.probes` as plain values (docs/controller.md, "Probes")."""

    max_probes: int = 3
    samples: int = 1024  # a probe's longest length; the run's own curve from the same checkpoint is as long
    share: float = 0.5  # a probe's length as a share of the samples seen at its start (early probes are cheap)
    min_steps: int = 12  # but at least this many steps of the larger GBS (the gain needs points on both curves)
    spacing: float = 2.0  # a probe starts no sooner than `spacing` × the samples of the last one's start
    first_samples: int = 0  # none before this many samples (the LR warm-up's end)
    prior_sd: float = 0.69  # the belief's prior sd of log c (about a factor of 2)
    drift_sd: float = 0.5  # how far log c may drift per e-fold of samples (its random walk)
    quantile_z: float = 1.0  # the decision must agree at c × exp(± z·sd) for no probe to be needed


def probe_due(settings: ProbeSettings, samples: int, started: list[int]) -> bool:
    """May a probe start at `samples` samples, given the samples at which earlier ones started?"""
    if len(started) >= settings.max_probes or samples < settings.first_samples:
        return False
    return not started or samples >= settings.spacing * max(started)


def probe_length(settings: ProbeSettings, start_samples: int, gbs_a: int, gbs_b: int) -> int:
    """A probe's length in samples: `share` of the samples seen (the loss falls fast early, so a
    short probe sees enough of it then), at least `min_steps` steps of the larger GBS, at most
    `samples` (unless the steps need more)."""
    wanted = min(settings.share * start_samples, settings.samples)
    return int(max(wanted, settings.min_steps * max(gbs_a, gbs_b)))


def probe_gbs(current_gbs: int, gbs_low: int, gbs_high: int) -> int | None:
    """The GBS to probe at, given the GBS the policy would leave the run at under the belief's
    low and high quantiles of c: None when they agree (the decision does not hang on c), else
    the one of the two that the run is not training at (the larger when it is at neither)."""
    if gbs_low == gbs_high:
        return None
    if current_gbs == gbs_low:
        return gbs_high
    if current_gbs == gbs_high:
        return gbs_low
    return max(gbs_low, gbs_high)


def run_curve_since(history: list[dict], start_samples: int, length: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The run's own per-step training losses from `start_samples` on, at the GBS it trained at
    from there, for at most `length` samples and cut at its next change of GBS: (samples, losses,
    that GBS). `history`: the controller's per-step entries (samples, train_loss, gbs)."""
    after = [h for h in history if h["samples"] > start_samples]
    if not after:
        return np.empty(0), np.empty(0), 0
    gbs = after[0]["gbs"]
    kept = []
    for h in after:
        if h["gbs"] != gbs or h["samples"] > start_samples + length:
            break
        kept.append(h)
    samples = np.array([h["samples"] for h in kept], dtype=float)
    losses = np.array([h["train_loss"] for h in kept], dtype=float)
    return samples, losses, int(gbs)


def run_curve_complete(history: list[dict], start_samples: int, length: int) -> bool:
    """Has the run's own curve from `start_samples` run its length, or ended at a change of GBS?"""
    after = [h for h in history if h["samples"] > start_samples]
    if not after:
        return False
    gbs = after[0]["gbs"]
    return any(h["gbs"] != gbs or h["samples"] >= start_samples + length for h in after)
