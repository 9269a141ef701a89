"""FedRep: the backbone is shared and averaged, the head stays private; each round trains the
head first (backbone frozen), then the backbone (head frozen). trainers/fedrep.py."""

from __future__ import annotations

from dataclasses import dataclass

from ..strategies.fedavg import FedAvg
from ..trainers.fedrep import FedRepTrainer
from .base import Settings, at_least, register


@dataclass(frozen=True, kw_only=True)
class FedRepSettings(Settings):
    head_epochs: int  # passes of the head alone before the backbone's train.local_epochs

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least("head_epochs", self.head_epochs, 0)


FEDREP = register("fedrep", strategy=FedAvg, trainer=FedRepTrainer, share=["base-only"], settings=FedRepSettings)
