"""The one check of a set of arrays against what it should be, used wherever arrays arrive: a
client's reply on the server (strategies/base.py), a per-class payload on either side
(class_payload.py), the server's arrays on a client (trainers/base.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


def _numpy(value: Any) -> np.ndarray:
    return value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)


def arrays_problem(arrays: Mapping[str, Any], expected: Mapping[str, Any], *, dtypes: bool = True,
                   finite: bool = True) -> str | None:
    """Why `arrays` (numpy arrays or tensors) do not fit `expected` (same keys and shapes, and with
    `dtypes` the same dtypes, and with `finite` no NaN or Inf in floating entries), or None."""
    keys = set(arrays)
    if keys != set(expected):
        missing, extra = sorted(set(expected) - keys), sorted(keys - set(expected))
        return f"keys differ from the expected ones (missing {missing[:3]}, extra {extra[:3]})"
    for key, ref in expected.items():
        value, ref = _numpy(arrays[key]), _numpy(ref)
        if value.shape != ref.shape:
            return f"'{key}' has shape {value.shape}, expected {ref.shape}"
        if dtypes and value.dtype != ref.dtype:
            return f"'{key}' has dtype {value.dtype}, expected {ref.dtype}"
        if finite and value.dtype.kind == "f" and not np.isfinite(value).all():
            return f"'{key}' holds NaN or Inf"
    return None
