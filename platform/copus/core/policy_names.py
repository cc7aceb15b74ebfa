"""The policies' names, defined once: the config validator, the simulator's settings, the
comparison and the policies themselves read them from here. No imports beyond typing, so the
config (imported by every worker process) stays light."""

from __future__ import annotations

from typing import Literal, get_args

PolicyName = Literal["copus", "static", "cbs", "cbs-pessimistic", "cbs-optimistic", "copus-gbs", "ramp"]
POLICIES: tuple[str, ...] = get_args(PolicyName)
# Policies of COPUS itself (the full one and its ablation); every other policy is a baseline.
ADAPTIVE: tuple[str, ...] = ("copus", "copus-gbs")
# Policies that follow a schedule fixed before the run (batch.gbs, or batch.ramp's GBS by samples
# seen): no controller, no noise scale; only static with `policy.layout: best` reads the profile.
SCHEDULED: tuple[str, ...] = ("static", "ramp")
# What `copus compare` runs when a suite names no policies.
DEFAULT_SUITE: tuple[str, ...] = ("copus", "static", "cbs-pessimistic", "cbs-optimistic")
# The entries a suite's tuning phase adds (copus.core.tuning), by the kind of baseline tuned.
TUNED_ENTRY: dict[str, str] = {"static": "tuned-static", "ramp": "tuned-ramp"}
