"""Statistical efficiency: how much progress one sample makes at batch size B, relative to
the reference batch size B0, and the learning-rate gain rules that go with it.

One form, SE(B) = (B_crit + B0) / (B_crit + B), with the critical batch B_crit = c × B_noise
(c = `gns.critical_factor`). Pollux (OSDI 2021) derived it with c = 1 for SGD with AdaScale's
learning rate (the progress of a B-sample step is SE(B)·B/B0 B0-steps; AdaScale's gain
r = (var + sqr)/(var/s + sqr), s = B/B0). With AdamW and the √ learning-rate rule a larger
batch also takes a larger step, which c > 1 credits. `policy.efficiency` names the two
historical forms, `pollux` and `lr-aware`; both now apply c (before, `pollux` ignored it in SE
while the critical-batch policies applied it, so one run read two different critical batches).
For the original Pollux form set `gns.critical_factor: 1`.

Pure math: no torch, no ray.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import numpy as np

# c of the configured mapping: the geometric mean of B_crit / (the run's live estimate) over the
# branch points of the calibrations in docs/ (docs/noise-scale.md), under the progress horizon.
DEFAULT_CRITICAL_FACTOR = 2.3
EfficiencyForm = Literal["pollux", "lr-aware"]  # the statistical-efficiency forms, named once
FORMS: tuple[str, ...] = get_args(EfficiencyForm)


def statistical_efficiency(b_noise: float, b0: float, b: float) -> float:
    if math.isnan(b_noise):
        return float("nan")
    if math.isinf(b_noise):
        return 1.0  # all noise: every sample counts fully at any batch size
    b_noise = max(b_noise, 0.0)
    return (b_noise + b0) / (b_noise + b)


def efficiency(form: str, b_noise: float, b0: float, b, critical_factor: float = DEFAULT_CRITICAL_FACTOR):
    """SE of batch size(s) `b` (a number or a numpy array) under the chosen form."""
    if form not in FORMS:
        raise ValueError(f"policy.efficiency: unknown form {form!r} (known: {', '.join(FORMS)})")
    scale = critical_factor  # every form: the critical batch is c x B_noise (module docstring)
    if math.isnan(b_noise):
        return np.full_like(np.asarray(b, dtype=float), np.nan) if np.ndim(b) else float("nan")
    if math.isinf(b_noise):
        return np.ones_like(np.asarray(b, dtype=float)) if np.ndim(b) else 1.0
    noise = scale * max(b_noise, 0.0)
    return (noise + b0) / (noise + np.asarray(b, dtype=float)) if np.ndim(b) else (noise + b0) / (noise + b)


def adascale_gain(grad_sqr: float, grad_var: float, b0: float, b: float) -> float:
    """AdaScale's gain r = (var + sqr) / (var/s + sqr), s = b/b0, var = tr(Σ)/b0 (the
    gradient variance at the reference batch): 1 at b = b0, at most s. Falls back to 1 while
    the estimates are not yet usable. When the smoothed |G|² is not positive the gradient is
    all noise: r = s, which agrees with SE = 1 at every batch size (`statistical_efficiency`
    with B_noise = inf), as in AdaptDL."""
    s = b / b0
    var = grad_var / b0
    if not (math.isfinite(grad_sqr) and math.isfinite(var)) or var < 0:
        return 1.0
    if grad_sqr <= 0:
        return s if var > 0 else 1.0
    return (var + grad_sqr) / (var / s + grad_sqr)


def adascale_lr_multiplier(gain: float, optimizer: str = "adamw") -> float:
    """The LR multiplier for AdaScale's gain r: r for SGD, √r for Adam/AdamW (AdaptDL's Adam
    form: Adam's update is normalised by √v, so a gain in progress per step needs only the
    square root of it in learning rate, as the √ batch rule). COPUS trains with AdamW."""
    if optimizer == "sgd":
        return gain
    if optimizer in ("adam", "adamw"):
        return math.sqrt(gain)
    raise ValueError(f"optimizer: unknown optimizer {optimizer!r}")
