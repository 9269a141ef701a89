"""What a method is: a strategy class (the server), a trainer class (the client), what it shares
(a parameter-filter spec, pfedes/filters.py) and a typed settings class, registered together
under the method's name.

Settings are frozen dataclasses built from the run's `strategy` section (a preset in
conf/strategy/ chooses the method with `method:` and sets values). Why `dataclasses` and not
pydantic: it is in the standard library (no new dependency for a client device), the objects are
frozen (a trainer cannot change its settings halfway through a run), and `__post_init__` checks
every value where the object is built, naming its key: `strategy.lam must be >= 0, got -1`. A
preset key the settings class does not declare, a missing required key, a value of the wrong type,
and a value out of range all raise `ConfigError` with one line when the configuration is composed
(config.validate), before Ray, the SuperLink or any client starts; a client builds the same
object from the configuration in its message, and the strategy from the server's.
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar

from ..config import ConfigError

SECTION = "strategy"
NOT_SETTINGS = ("name", "method")  # preset keys that choose, not configure


def fail(key: str, why: str) -> None:
    raise ConfigError(f"{SECTION}.{key} {why}")


def at_least(key: str, value: float, low: float, strict: bool = False) -> None:
    """`strategy.KEY must be >= LOW` (or > LOW with strict)."""
    if not (value > low if strict else value >= low):
        fail(key, f"must be {'>' if strict else '>='} {low:g}, got {value:g}")


def within(key: str, value: float, low: float, high: float, bounds: str = "[]") -> None:
    """`strategy.KEY must be in [LOW, HIGH]`; `bounds` says which ends are closed, e.g. "(]"."""
    ok = (value >= low if bounds[0] == "[" else value > low) and (value <= high if bounds[1] == "]" else value < high)
    if not ok:
        fail(key, f"must be in {bounds[0]}{low:g}, {high:g}{bounds[1]}, got {value:g}")


def one_of(key: str, value: str, options: Sequence[str]) -> None:
    if value not in options:
        fail(key, f"'{value}' is unknown: expected one of {list(options)}")


def _coerce(key: str, kind: Any, value: Any) -> Any:
    """`value` as the field's declared type (hydra and Flower's run config give ints for whole
    floats, floats for whole ints); a value of another kind fails naming the key."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):  # X | None: null allowed
        if value is None:
            return None
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    if kind is bool:
        if not isinstance(value, bool):
            fail(key, f"must be true or false, got {value!r}")
        return value
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            fail(key, f"must be a finite number, got {value!r}")
        return float(value)
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value).is_integer():
            fail(key, f"must be an integer, got {value!r}")
        return int(value)
    if kind is str:
        if not isinstance(value, str):
            fail(key, f"must be a string, got {value!r}")
        return value
    return value


@dataclass(frozen=True, kw_only=True)
class Settings:
    """A method's settings: every field is a key of the preset's `strategy` section. Subclasses
    declare typed fields (a default where the preset may leave the key out) and check their
    ranges in `__post_init__` after calling this one, which converts each value to its type.
    Every method has `lr`: its own SGD learning rate, where its preset sets one (chosen on
    validation, benchmarks/tuning_grid.py); null trains at train.lr (config.for_device)."""

    lr: float | None = None

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in fields(self):
            object.__setattr__(self, f.name, _coerce(f.name, hints[f.name], getattr(self, f.name)))
        if self.lr is not None:
            at_least("lr", self.lr, 0, strict=True)

    @property
    def needs_validation_split(self) -> str | None:
        """The setting (as `strategy.key=value`) that reads each client's validation split, if one does:
        config.validate then requires data.val_fraction > 0."""
        return None

    @classmethod
    def from_section(cls, section: Mapping[str, Any], method: str) -> Settings:
        """The settings of a run's `strategy` section (its `name` and `method` aside)."""
        declared = {f.name: f for f in fields(cls)}
        unknown = sorted(k for k in section if k not in declared and k not in NOT_SETTINGS)
        if unknown:
            raise ConfigError(f"{SECTION}.{unknown[0]} is not a setting of method '{method}' "
                              f"(its settings: {sorted(declared) or 'none'})")
        missing = [k for k, f in declared.items()
                   if k not in section and f.default is MISSING and f.default_factory is MISSING]
        if missing:
            raise ConfigError(f"{SECTION}.{missing[0]} is missing: method '{method}' needs it")
        return cls(**{k: v for k, v in section.items() if k in declared})


@dataclass(frozen=True, kw_only=True)
class NoSettings(Settings):
    """A method without settings of its own (FedAvg, FedBN, FedPer, Local-only)."""


@dataclass(frozen=True, kw_only=True)
class MomentumSettings(Settings):
    """Server momentum (strategies/momentum.py), for the methods whose strategy composes it:
    new = beta * old + (1 - beta) * aggregate, beta in [0, 1)."""

    server_momentum: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.server_momentum < 1.0:
            fail("server_momentum", f"{self.server_momentum:g} is outside [0, 1)")


@dataclass(frozen=True)
class Method:
    """One registered method: its server strategy, its client trainer, the filter spec of what
    leaves a client (pfedes/filters.py), and its settings class."""

    name: str
    strategy: type
    trainer: type
    share: tuple[str, ...]
    settings: type[Settings]
    registry: ClassVar[dict[str, Method]] = {}

    def settings_from(self, cfg: Mapping[str, Any]) -> Settings:
        return self.settings.from_section(cfg[SECTION], self.name)


def register(name: str, *, strategy: type, trainer: type, share: Sequence[str],
             settings: type[Settings] = NoSettings) -> Method:
    """Register a method under `name` (what a preset's `method:` names)."""
    if name in Method.registry:
        raise ValueError(f"method '{name}' is registered twice")
    from ..filters import FILTER_NAMES

    unknown = [f for f in share if f not in FILTER_NAMES]
    if unknown:
        raise ValueError(f"method '{name}' shares through unknown filter(s) {unknown}: expected some of "
                         f"{list(FILTER_NAMES)}")
    method = Method(name, strategy, trainer, tuple(share), settings)
    Method.registry[name] = method
    return method
