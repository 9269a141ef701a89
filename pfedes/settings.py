"""One section of the run's settings (`compression`, `aggregation`, `selection`, `privacy`), read
with the checks every section needs; a bad value raises ValueError naming its dotted key, which
config.validate turns into the one-line error before anything starts."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any


class Section:
    def __init__(self, cfg: Mapping[str, Any], name: str) -> None:
        self.name = name
        self.values = dict(cfg.get(name) or {})

    def fail(self, key: str, why: str) -> None:
        raise ValueError(f"{self.name}.{key} {why}")

    def choice(self, key: str, default: str, options: Sequence[str]) -> str:
        value = str(self.values.get(key, default))
        if value not in options:
            self.fail(key, f"'{value}' is unknown: expected one of {list(options)}")
        return value

    def number(self, key: str, default: float, rule: str, ok: Callable[[float], bool]) -> float:
        """A finite number for which `ok` holds; `rule` says which in the error."""
        raw = self.values.get(key, default)
        try:
            value = float(raw)
        except (TypeError, ValueError):
            value = math.nan
        if isinstance(raw, bool) or not math.isfinite(value) or not ok(value):
            self.fail(key, f"must be {rule}, got {raw}")
        return value

    def integer(self, key: str, default: int, low: int) -> int:
        raw = self.values.get(key, default)
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < low:
            self.fail(key, f"must be an integer >= {low}, got {raw}")
        return raw

    def flag(self, key: str, default: bool) -> bool:
        return bool(self.values.get(key, default))
