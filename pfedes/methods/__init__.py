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
from . import (apfl, cfl, ditto, fd, fedavg, fedbn, fedgh, fedper, fedproto, fedprox,  # noqa: F401
               fedrep, fml, lgfedavg, local, lora, perfedavg, pfedes, pfedes_paper, pfedme)  # each registers its methods

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
        raise ConfigError(f"strategy '{section.get('name')}' chooses no method: its preset needs `method: NAME`, "
                          f"one of {sorted(METHODS)}")
    return get_method(str(section["method"]))


def settings_of(cfg: Mapping[str, Any]) -> Settings:
    """The run's method settings, checked (ConfigError naming the key)."""
    return method_of(cfg).settings_from(cfg)


__all__ = ["METHODS", "Method", "Settings", "get_method", "method_of", "register", "settings_of"]
