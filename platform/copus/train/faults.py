"""Fault injection for tests, benchmarks and users who want to see recovery work: what the
driver reads from its environment and hands the workers as plain values.

    COPUS_INJECT_WORKER_KILL=STEP[:RANK]   rank RANK (default 1, or 0 on one worker) kills its own
                                           process with SIGKILL as step STEP starts, once per run
    COPUS_INJECT_NONFINITE_STEPS=5,6       these steps' gradients are made NaN (the loop skips them)
    COPUS_INJECT_RESHARD_FAILURE=1         an in-place layout change fails on rank 0 after the state moved
    COPUS_INJECT_HOLD=13,33                every rank waits as step STEP starts, the first time, until
                                           OUTPUT_DIR/faults/release-step-STEP exists (rank 0 writes
                                           held-at-step-STEP there first): a fault from outside (a
                                           node killed, a link cut) lands at a known step
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field

from copus.storage import Location

KILL_ENV = "COPUS_INJECT_WORKER_KILL"
NONFINITE_ENV = "COPUS_INJECT_NONFINITE_STEPS"
RESHARD_ENV = "COPUS_INJECT_RESHARD_FAILURE"
HOLD_ENV = "COPUS_INJECT_HOLD"
HOLD_POLL_S = 0.1


class FaultSpecError(ValueError):
    pass


@dataclass(frozen=True)
class Faults:
    fail_reshard: bool = False
    poison_steps: frozenset[int] = field(default_factory=frozenset)
    kill_step: int | None = None
    kill_rank: int = 1
    # Created before the kill, in the run's storage: a restarted group (on any node) does not kill again.
    kill_marker: Location | None = None
    # The doomed rank waits this long before dying (its peers wait in the step's collectives):
    # Ray Train registers a reported checkpoint when its controller next polls the workers
    # (every few seconds), so a kill right after a checkpoint could find it unregistered; on a
    # real cluster checkpoints are minutes apart.
    kill_delay_s: float = 5.0

    def maybe_kill(self, step: int, rank: int) -> None:
        """SIGKILL this process if it is the chosen rank at the chosen step, the first time."""
        if self.kill_step != step or self.kill_rank != rank or self.kill_marker is None:
            return
        marker = self.kill_marker
        if marker.exists():
            return
        marker.write_text(f"rank {rank} killed at step {step}\n")
        time.sleep(self.kill_delay_s)
        os.kill(os.getpid(), signal.SIGKILL)

    # The holds: their steps, and the run's fault-marker folder where their files live.
    hold_steps: frozenset[int] = field(default_factory=frozenset)
    hold_dir: Location | None = None

    def maybe_hold(self, step: int, rank: int) -> None:
        """Wait as `step` starts until the release file exists: the first time only, since a
        group restarted from an earlier checkpoint finds it there. Ranks wait outside any
        collective, so a node killed meanwhile is seen by Ray Train as at any other time."""
        if step not in self.hold_steps or self.hold_dir is None:
            return
        release = self.hold_dir / f"release-step-{step}"
        if release.exists():
            return
        if rank == 0:
            (self.hold_dir / f"held-at-step-{step}").write_text(f"held as step {step} starts\n")
        while not release.exists():
            time.sleep(HOLD_POLL_S)


def faults_from_env(marker_dir: Location, world: int, environ=os.environ) -> Faults:
    """The faults the environment asks for; a malformed value is one line naming the variable."""

    def steps(name: str) -> frozenset[int]:
        text = environ.get(name, "").strip()
        try:
            return frozenset(int(x) for x in text.split(",") if x.strip())
        except ValueError:
            raise FaultSpecError(f"{name}: expected comma-separated step numbers, got {text!r}") from None

    kill_step, kill_rank = None, min(1, world - 1)
    kill = environ.get(KILL_ENV, "").strip()
    if kill:
        try:
            step_text, _, rank_text = kill.partition(":")
            kill_step, kill_rank = int(step_text), int(rank_text) if rank_text else kill_rank
        except ValueError:
            raise FaultSpecError(f"{KILL_ENV}: expected STEP or STEP:RANK, got {kill!r}") from None
        if not 0 <= kill_rank < world:
            raise FaultSpecError(f"{KILL_ENV}: rank {kill_rank} is not one of the {world} workers")
    hold_steps = steps(HOLD_ENV)
    return Faults(
        fail_reshard=bool(environ.get(RESHARD_ENV)),
        poison_steps=steps(NONFINITE_ENV),
        kill_step=kill_step,
        kill_rank=kill_rank,
        kill_marker=marker_dir / f"killed-at-step-{kill_step}" if kill_step is not None else None,
        hold_steps=hold_steps,
        hold_dir=marker_dir if hold_steps else None,
    )
