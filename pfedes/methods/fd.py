"""FD (federated distillation): per-class average logits, averaged per class by the server; clients
add lam * MSE(logits, global average logits of y). No weight leaves a client (the payload is
per-class logits and counts: the filter shares nothing). trainers/fd.py."""

from __future__ import annotations

from dataclasses import dataclass

from ..strategies.fd import FD
from ..trainers.fd import FDTrainer
from .base import Settings, at_least, register


@dataclass(frozen=True, kw_only=True)
class FDSettings(Settings):
    lam: float  # weight of the distillation regulariser

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least("lam", self.lam, 0)


FD = register("fd", strategy=FD, trainer=FDTrainer, share=[], settings=FDSettings)
