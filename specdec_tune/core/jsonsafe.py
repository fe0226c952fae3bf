"""JSON without NaN or infinity, shared by the CLI's ``--json`` output and the database's JSON columns.

JSON has no NaN or infinity (and PostgreSQL rejects them): an undefined rate, such as α_i at a
position no cycle reached, becomes null.
"""
from __future__ import annotations

import math
from typing import Any


def finite(obj: Any) -> Any:
    """``obj`` with every non-finite float in nested dicts/lists/tuples replaced by None; arrays and
    numpy/torch scalars (anything with ``tolist``) are converted first."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    if hasattr(obj, "tolist"):
        return finite(obj.tolist())
    return obj
