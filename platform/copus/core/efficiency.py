"""Statistical efficiency: how much progress one sample makes at batch size B, relative to
the reference batch size B0, and the learning-rate gain rules that go with it.

Two forms, selectable (`policy.efficiency`):

- pollux (Pollux, OSDI 2021):   SE(B) = (B_noise + B0) / (B_noise + B)
  1 at B = B0, falls as B grows; the progress of a B-sample step is SE(B)·B/B0 B0-steps, the
  AdaScale gain r = (var + sqr)/(var/s + sqr) with s = B/B0.
- lr-aware (COPUS):             SE(B) = (c·B_noise + B0) / (c·B_noise + B)
  the noise scale replaced by the critical batch c·B_noise (c = `gns.critical_factor`, 2 by
  default): with AdamW and √ learning-rate scaling a larger batch also takes a larger step,
  which the Pollux form (derived for a tuned SGD learning rate) does not credit; the factor
  c > 1 credits it, so larger batches keep more of their efficiency.

Pure math: no torch, no ray.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import numpy as np

EfficiencyForm = Literal["pollux", "lr-aware"]  # the statistical-efficiency forms, named once
FORMS: tuple[str, ...] = get_args(EfficiencyForm)


def statistical_efficiency(b_noise: float, b0: float, b: float) -> float:
    if math.isnan(b_noise):
        return float("nan")
    if math.isinf(b_noise):
        return 1.0  # all noise: every sample counts fully at any batch size
    b_noise = max(b_noise, 0.0)
    return (b_noise + b0) / (b_noise + b)


def efficiency(form: str, b_noise: float, b0: float, b, critical_factor: float = 2.0):
    """SE of batch size(s) `b` (a number or a numpy array) under the chosen form."""
    if form not in FORMS:
        raise ValueError(f"policy.efficiency: unknown form {form!r} (known: {', '.join(FORMS)})")
    scale = critical_factor if form == "lr-aware" else 1.0
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
