"""FedProto: class prototypes in the common space, averaged per class by the server; clients add
lam * MSE(prototype(x), global prototype of y). No weight leaves a client (the payload is
prototypes and counts: the filter shares nothing). trainers/fedproto.py."""

from __future__ import annotations

from dataclasses import dataclass

from ..strategies.fedproto import FedProto
from ..trainers.fedproto import FedProtoTrainer
from .base import Settings, at_least, register


@dataclass(frozen=True, kw_only=True)
class FedProtoSettings(Settings):
    lam: float  # weight of the prototype-distance regulariser

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least("lam", self.lam, 0)


FEDPROTO = register("fedproto", strategy=FedProto, trainer=FedProtoTrainer, share=[], settings=FedProtoSettings)
