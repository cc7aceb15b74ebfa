"""JSON has no NaN or infinity: a value not measured is written as null."""

from __future__ import annotations

import math
from numbers import Integral, Real


def positive_number(value) -> bool:
    """A real, finite, positive number (not a bool): what a file's measured seconds must be."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def finite_json(value):
    """`value` with every non-finite float in it (in dicts, lists and tuples too) made None: a
    value not measured (a GBS that never reached the decrement, a ratio of nothing) is null."""
    if isinstance(value, Real) and not isinstance(value, Integral):  # numpy's floats too
        value = float(value)
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value
