"""Per-FedAvg (first-order MAML): the meta-model is shared and averaged; before evaluation each
client adapts it with one inner step. trainers/perfedavg.py."""

from __future__ import annotations

from dataclasses import dataclass

from ..strategies.fedavg import FedAvg
from ..trainers.perfedavg import PerFedAvgTrainer
from .base import Settings, at_least, register


@dataclass(frozen=True, kw_only=True)
class PerFedAvgSettings(Settings):
    inner_lr: float | None = None  # alpha, the inner / adaptation step size; None: train.lr (the device's)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.inner_lr is not None:
            at_least("inner_lr", self.inner_lr, 0, strict=True)


PERFEDAVG = register("perfedavg", strategy=FedAvg, trainer=PerFedAvgTrainer, share=["all"],
                     settings=PerFedAvgSettings)
