"""Batch-size and layout policies. They share everything (planner, controller, in-place
changes and restarts) except two choices: where to start and what to move to.

- copus:           start where static (`policy.layout: best`) starts, the profile's fastest
                   layout and MBS for `batch.gbs` (so a comparison measures adaptation, not a
                   worse start); move to the candidate with the best goodput (GBS, MBS and
                   layout all adapt), with hysteresis and cost.
- static:          fixed GBS (`batch.gbs`); the given layout (`policy.layout: given`) or the
                   one with the best throughput for that GBS in the profile (`best`); never moves.
- cbs:             GBS follows the critical batch size (the planner's mapping: c × B_noise, or
                   the calibrated one; nearest GBS of the grid the layout admits), layout and
                   MBS fixed at the experiment's. COPUS and the cbs baselines read the same
                   evidence through the same mapping.
- cbs-pessimistic: as cbs, with the layout and MBS of best throughput at the initial GBS.
- cbs-optimistic:  as cbs, with the layout and MBS of best throughput at the largest GBS.
- copus-gbs:       an ablation of copus: starts where copus starts and chooses the GBS by
                   goodput exactly as copus does, but keeps that layout and MBS for the whole
                   run. copus − copus-gbs is the gain of co-adapting the layout and MBS.

Pure: no torch, no ray.
"""

from __future__ import annotations

import math

from copus.core.horizon import Horizon
from copus.core.layout import CandidateConfig
from copus.core.planner import Decision, Planner, SwitchCosts, same_shape
from copus.core.policy_names import ADAPTIVE, DEFAULT_SUITE, POLICIES, PolicyName  # noqa: F401 - re-exported


def nearest_gbs(planner: Planner, shape_of: CandidateConfig, gbs: float) -> CandidateConfig:
    """The candidate with `shape_of`'s layout and MBS whose GBS is nearest to `gbs` (in ratio)."""
    same = [c for c in planner.candidates if same_shape(c, shape_of)]
    if not same:
        raise ValueError(f"no candidate has the layout and MBS of {shape_of.label()}")
    return min(same, key=lambda c: (abs(math.log(c.gbs / max(gbs, 1e-9))), c.gbs))


def initial_config(
    policy: str, planner: Planner, start: CandidateConfig, static_layout: str = "given"
) -> CandidateConfig:
    """Where a run of `policy` starts (before any gradient noise is known)."""
    at_gbs = lambda g: lambda c: c.gbs == g  # noqa: E731 - a small predicate factory
    if policy == "cbs" or (policy == "static" and static_layout == "given"):
        return start
    if policy in ("copus", "copus-gbs", "static", "cbs-pessimistic"):
        return planner.best(float("nan"), at_gbs(start.gbs), by="throughput").config
    if policy == "cbs-optimistic":
        largest = max(c.gbs for c in planner.candidates)
        shape = planner.best(float("nan"), at_gbs(largest), by="throughput").config
        return nearest_gbs(planner, shape, start.gbs)
    raise ValueError(f"policy.name: unknown policy {policy!r} (known: {', '.join(POLICIES)})")


def decide(
    policy: str,
    planner: Planner,
    current: CandidateConfig,
    b_noise: float,
    interval_s: float,
    costs: SwitchCosts,
    loss: float = float("nan"),
    elapsed_s: float = 0.0,
    horizon: Horizon | None = None,
    log_b_crit_sd: float = 0.0,
) -> Decision | None:
    """The policy's decision now, or None when it has nothing to decide. `loss` is the run's
    progress (latest validation loss); the critical batch comes from the planner's mapping.
    `horizon`, the rest of the run a switch must repay its cost in (None: as long as
    `elapsed_s`, the run's time so far); `log_b_crit_sd`, the critical batch's uncertainty."""
    if policy == "static":
        return None
    since = {"loss": loss, "elapsed_s": elapsed_s, "horizon": horizon, "log_b_crit_sd": log_b_crit_sd}
    if policy == "copus":
        return planner.decide(current, b_noise, interval_s, costs, **since)
    if policy == "copus-gbs":
        return planner.decide(current, b_noise, interval_s, costs, allowed=lambda c: same_shape(c, current), **since)
    if policy.startswith("cbs"):
        if not math.isfinite(b_noise) or b_noise <= 0:
            return None
        target = nearest_gbs(planner, current, planner.critical_batch(b_noise, loss))
        return planner.decide(current, b_noise, interval_s, costs, target=target, **since)
    raise ValueError(f"policy.name: unknown policy {policy!r} (known: {', '.join(POLICIES)})")
