"""Statistical efficiency (Pollux): how much progress one sample makes at batch size B,
relative to the reference batch size B0.

    SE(B) = (B_noise + B0) / (B_noise + B)        1 at B = B0, falls as B grows

Pure math: no torch, no ray.
"""

from __future__ import annotations

import math


def statistical_efficiency(b_noise: float, b0: float, b: float) -> float:
    if math.isnan(b_noise):
        return float("nan")
    if math.isinf(b_noise):
        return 1.0  # all noise: every sample counts fully at any batch size
    b_noise = max(b_noise, 0.0)
    return (b_noise + b0) / (b_noise + b)
