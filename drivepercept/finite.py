"""JSON values with every NaN or infinity as null: strict JSON has no NaN, and a number that
is not one (a figure with nothing to measure) should read as "none", not break a parser."""

from __future__ import annotations

import math
from typing import Any


def finite(value: Any) -> Any:
    """`value` (nested dicts, lists and tuples of it) with every non-finite float as None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value
