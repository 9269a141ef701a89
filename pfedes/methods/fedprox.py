"""FedProx: FedAvg plus mu/2 * ||w - w_global||^2 over the shared parameters (trainers/fedprox.py).
The method in full: these settings, the trainer, FedAvg's server, and the `all` filter."""

from __future__ import annotations

from dataclasses import dataclass

from ..strategies.fedavg import FedAvg
from ..trainers.fedprox import FedProxTrainer
from .base import Settings, at_least, register


@dataclass(frozen=True, kw_only=True)
class FedProxSettings(Settings):
    mu: float  # proximal weight (the usual grid: 0.01, 0.1, 1.0)

    def __post_init__(self) -> None:
        super().__post_init__()  # each value converted to its field's type first
        at_least("mu", self.mu, 0)


FEDPROX = register("fedprox", strategy=FedAvg, trainer=FedProxTrainer, share=["all"], settings=FedProxSettings)
