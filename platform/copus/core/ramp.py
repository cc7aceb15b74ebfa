"""A batch-size ramp (`policy.name: ramp`): the GBS as a pure function of the samples seen, the
schedule users of Megatron-LM (`--rampup-batch-size <start> <increment> <ramp-up samples>`),
torchtitan forks and MaxText set by hand. A baseline for comparisons and a feature in itself.

Two forms, one representation: Megatron's linear ramp (start at `start_gbs`, grow by `increment`
in equal sample chunks over `ramp_samples` up to the final GBS, then stay) is turned into the
same table of (samples, GBS) points a user may give explicitly. Since the GBS depends on the
samples seen only, and every checkpoint keeps them, a resumed or relaunched run continues the
ramp where it was. Pure: no torch, no ray.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, replace

from copus.core.layout import CandidateConfig
from copus.core.reconfiguration import SwitchOrder


@dataclass(frozen=True)
class BatchRamp:
    """The GBS by samples seen: `points` ((samples, gbs), ...), the first at 0 samples, samples
    strictly increasing; the GBS at s is that of the last point at or before s."""

    points: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        if not self.points or self.points[0][0] != 0:
            raise ValueError(f"a batch ramp starts at 0 samples (got {self.points[:1]})")
        samples = [s for s, _ in self.points]
        if any(b <= a for a, b in zip(samples, samples[1:])):
            raise ValueError(f"a batch ramp's samples must increase strictly (got {samples})")
        if min(g for _, g in self.points) < 1:
            raise ValueError(f"a batch ramp's GBS must be positive (got {[g for _, g in self.points]})")

    @classmethod
    def linear(cls, start_gbs: int, increment: int, ramp_samples: int, final_gbs: int) -> BatchRamp:
        """Megatron's rampup: gbs(s) = min(final, start + floor(s / (ramp_samples / n)) x increment)
        with n = (final - start) / increment increments, in exact integer arithmetic."""
        if not 0 < start_gbs < final_gbs or increment < 1 or ramp_samples < 1 or (final_gbs - start_gbs) % increment:
            raise ValueError(
                f"no linear ramp from GBS {start_gbs} to {final_gbs} by {increment} over {ramp_samples} samples"
            )
        n = (final_gbs - start_gbs) // increment
        points: dict[int, int] = {}
        for k in range(n + 1):
            # ceil(k x ramp_samples / n): the first sample count with floor(s x n / ramp_samples) >= k.
            # Chunks under one sample put several increments at one count: the last one holds.
            points[-(-k * ramp_samples // n)] = start_gbs + k * increment
        return cls(tuple(points.items()))

    @classmethod
    def from_table(cls, table) -> BatchRamp:
        """An explicit schedule, [[samples, gbs], ...]."""
        return cls(tuple((int(samples), int(gbs)) for samples, gbs in table))

    @property
    def start_gbs(self) -> int:
        return self.points[0][1]

    @property
    def final_gbs(self) -> int:
        return self.points[-1][1]

    @property
    def end_samples(self) -> int:
        """Where the last change is scheduled: the GBS stays the final one from here on."""
        return self.points[-1][0]

    def gbs(self, samples: int) -> int:
        """The GBS of the step that starts after `samples` samples."""
        return self.points[bisect_right([s for s, _ in self.points], samples) - 1][1]

    def describe(self) -> str:
        return f"GBS {self.start_gbs} to {self.final_gbs} in {len(self.points) - 1} changes over {self.end_samples} samples"


def ramp_order(ramp: BatchRamp, samples: int, current: CandidateConfig) -> SwitchOrder | None:
    """The order that moves `current` to the ramp's GBS after `samples` samples, or None when it
    is there already. Only the GBS changes (the number of micro-batches per step, as in Megatron):
    the layout and MBS stay, so the change is always made in place."""
    gbs = ramp.gbs(samples)
    if gbs == current.gbs:
        return None
    return SwitchOrder(
        config=replace(current, gbs=gbs),
        change="gbs",
        cost_s=0.0,
        reason=f"ramp: {samples} samples seen, schedule says GBS {gbs}",
        way="in_place",
    )
