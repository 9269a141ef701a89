"""Ditto: the global model trains as in FedAvg; a private personal model v trains with
lam/2 * ||v - w_global||^2 and is the one evaluated. trainers/ditto.py."""

from __future__ import annotations

from dataclasses import dataclass

from ..strategies.ditto import Ditto
from ..trainers.ditto import DittoTrainer
from .base import Settings, at_least, register


@dataclass(frozen=True, kw_only=True)
class DittoSettings(Settings):
    lam: float  # pull of the personal model toward the global one

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least("lam", self.lam, 0)


DITTO = register("ditto", strategy=Ditto, trainer=DittoTrainer, share=['all'], settings=DittoSettings)
