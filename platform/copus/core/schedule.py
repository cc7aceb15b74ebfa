"""Learning rate as a pure function of (samples seen, current GBS).

Counted in samples, not steps, because COPUS changes the step length (GBS) during training:
warm-up and decay must mean the same amount of data whatever the batch size was.
The batch-size rule rescales the base LR, given at `reference_gbs`, to the current GBS.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from copus.core.efficiency import adascale_lr_multiplier


def batch_scale(rule: str, gbs: int, reference_gbs: int) -> float:
    """LR multiplier for training at `gbs` instead of `reference_gbs`.

    sqrt: Adam/AdamW (Malladi et al. 2022; the COPUS and AdaptDL default); linear: SGD
    (Goyal et al. 2017); none: keep the LR. adascale follows the measured gain instead
    (`LRSchedule.lr(..., gain=...)`), 1 here.
    """
    ratio = gbs / reference_gbs
    if rule == "sqrt":
        return math.sqrt(ratio)
    if rule == "linear":
        return ratio
    if rule in ("none", "adascale"):
        return 1.0
    raise ValueError(f"optimizer.lr_scaling: unknown rule {rule!r}")


@dataclass(frozen=True)
class LRSchedule:
    base_lr: float
    reference_gbs: int
    scaling: str = "sqrt"
    warmup_samples: int = 0
    decay: str = "constant"  # or "cosine"
    decay_samples: int | None = None
    min_lr_ratio: float = 0.1

    def shape(self, samples_seen: int) -> float:
        """Warm-up and decay factor in [0, 1] for the step that starts at `samples_seen`."""
        if self.warmup_samples and samples_seen < self.warmup_samples:
            # +1 sample so the very first step does not take a zero LR.
            return (samples_seen + 1) / self.warmup_samples
        if self.decay == "cosine":
            assert self.decay_samples is not None
            progress = min(1.0, (samples_seen - self.warmup_samples) / max(1, self.decay_samples - self.warmup_samples))
            return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
        return 1.0

    def lr(self, samples_seen: int, gbs: int, gain: float | None = None) -> float:
        """The LR of the step that starts at `samples_seen` with batch size `gbs`. With the
        adascale rule the multiplier is √r of AdaScale's gain r for AdamW
        (`copus.core.efficiency.adascale_gain`, `adascale_lr_multiplier`; 1 until the noise scale
        is known), which warm-up and decay then shape as for the others."""
        scale = (
            adascale_lr_multiplier(gain if gain is not None else 1.0)
            if self.scaling == "adascale"
            else batch_scale(self.scaling, gbs, self.reference_gbs)
        )
        return self.base_lr * scale * self.shape(samples_seen)


@dataclass(frozen=True)
class Cadence:
    """How often something recurs in a run (evaluation, checkpoints): every `samples` samples
    when that is set, the same amount of data whatever the batch size, so that a small-batch
    and a large-batch policy pay the same evaluation cost per sample; else every `steps` steps."""

    steps: int
    samples: int | None = None

    def due(self, step: int, samples: int, gbs: int) -> bool:
        """After the step that took the run to `step` and `samples` (its batch was `gbs`): did
        it reach or cross a multiple of the interval?"""
        if self.samples:
            return samples // self.samples > (samples - gbs) // self.samples
        return step % self.steps == 0
