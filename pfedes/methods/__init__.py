"""The registry of methods: each module here registers one method (or a few variants of one)
under its name, with its strategy, its trainer, what it shares and its typed settings
(methods/base.py). A preset in conf/strategy/ chooses one with `method: NAME` and sets values.

    from pfedes.methods import method_of
    method = method_of(cfg)          # the run's Method
    settings = method.settings_from(cfg)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..config import ConfigError
from .base import Method, Settings, register
from . import fedrep, pfedes  # noqa: F401  (each registers its methods)

METHODS = Method.registry


def get_method(name: str) -> Method:
    try:
        return METHODS[name]
    except KeyError:
        raise ConfigError(f"strategy.method '{name}' is unknown: expected one of {sorted(METHODS)}") from None


def method_of(cfg: Mapping[str, Any]) -> Method:
    """The method a run's `strategy` section chooses."""
    section = cfg["strategy"]
    if "method" not in section:
        return _legacy_method(section)
    return get_method(str(section["method"]))


def _legacy_method(section: Mapping[str, Any]) -> Method:
    """A preset not yet moved to the registry: classes by their dotted paths (to be removed)."""
    from hydra.utils import get_class

    return Method(section["name"], get_class(section["server"]), get_class(section["trainer"]),
                  tuple(section.get("share", [])), _LegacySettings)


class _LegacySettings(Settings):
    @classmethod
    def from_section(cls, section, method):  # noqa: ANN001
        return None


def settings_of(cfg: Mapping[str, Any]) -> Settings:
    """The run's method settings, checked (ConfigError naming the key)."""
    return method_of(cfg).settings_from(cfg)


__all__ = ["METHODS", "Method", "Settings", "get_method", "method_of", "register", "settings_of"]
