"""FedGH: clients upload class prototypes (common space) with class counts; the server trains a
global head on them and sends it down (the `head-only` filter); clients train their private body
under it. strategies/fedgh.py, trainers/fedgh.py."""

from __future__ import annotations

from dataclasses import dataclass

from ..strategies.fedgh import FedGH
from ..trainers.fedgh import FedGHTrainer
from .base import Settings, at_least, register


@dataclass(frozen=True, kw_only=True)
class FedGHSettings(Settings):
    server_lr: float | None  # SGD learning rate of the global head's training on the server; null: the method's lr
    server_epochs: int   # full-batch steps per round over all (prototype, class) pairs

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.server_lr is not None:
            at_least("server_lr", self.server_lr, 0, strict=True)
        at_least("server_epochs", self.server_epochs, 1)


FEDGH = register("fedgh", strategy=FedGH, trainer=FedGHTrainer, share=["head-only"], settings=FedGHSettings)
