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

A probe is also weighed against its price (`probe_value`): the run time it could save is at
most the goodput at stake between the two decisions over the rest of the run, of which half is
expected (either decision may be the right one), and the rest of the run is taken to be as long
as the run so far (the horizon a run of unknown length has, on average, once it has lasted that
long). The probe trains beside the run, so it costs the time the run would take to train its
samples. A short run, or a stake of a few percent, does not pay for a probe: on the CPU
trade-off workload probes of 7-16 s cost runs of about a minute up to 13% and moved c by at most
5% (docs/controller.md, "Probes").

Pure: no torch, no ray.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from copus.core.finite import finite_json


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
    min_value_ratio: float = 1.0  # probe only when its expected saving is this multiple of its cost; 0: always


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


def decision_stake(own: tuple[float, float], other: tuple[float, float]) -> float:
    """The share of goodput a wrong choice between the two decisions loses: at each quantile of
    c, 1 - the goodput of the other quantile's decision / that of its own (`own`, `other`: the
    goodputs at the low and at the high quantile), averaged over the two. NaN when a goodput is
    not known (a configuration the planner cannot score)."""
    losses = [1.0 - b / a if a > 0 and math.isfinite(a) and math.isfinite(b) else math.nan for a, b in zip(own, other)]
    return float(np.mean(losses))


@dataclass(frozen=True)
class ProbeValue:
    """A probe weighed against its price (see the module's docstring); `worth` decides."""

    stake: float  # decision_stake
    horizon_s: float  # the rest of the run, taken as long as the run so far
    value_s: float  # the run time it is expected to save: stake x horizon / 2
    cost_s: float  # the run time it costs: its samples at the run's speed
    worth: bool

    def as_dict(self) -> dict:
        return finite_json(asdict(self))


def probe_value(
    settings: ProbeSettings, stake: float, elapsed_s: float, probe_samples: int, run_speed: float
) -> ProbeValue:
    """Whether a probe of `probe_samples` pays for itself, `elapsed_s` into a run training at
    `run_speed` samples/s. An unknown stake or speed does not block it (the value of the
    information cannot be told: the probe is made, as without this test)."""
    value = 0.5 * stake * elapsed_s
    cost = probe_samples / run_speed if run_speed > 0 else math.nan
    known = math.isfinite(value) and math.isfinite(cost)
    worth = settings.min_value_ratio <= 0 or not known or value >= settings.min_value_ratio * cost
    return ProbeValue(stake, elapsed_s, value, cost, worth)
