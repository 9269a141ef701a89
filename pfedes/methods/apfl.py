"""APFL: personalized model = alpha * v + (1 - alpha) * w, v private, w the shared global model,
alpha learned per client. trainers/apfl.py."""

from __future__ import annotations

from dataclasses import dataclass

from ..strategies.fedavg import FedAvg
from ..trainers.apfl import APFLTrainer
from .base import Settings, at_least, register, within


@dataclass(frozen=True, kw_only=True)
class APFLSettings(Settings):
    alpha_init: float            # starting mixing weight, learned from there and kept in [0, 1]
    alpha_lr: float | None = None  # step size of alpha; None: train.lr (the device's)

    def __post_init__(self) -> None:
        super().__post_init__()
        within("alpha_init", self.alpha_init, 0.0, 1.0)
        if self.alpha_lr is not None:
            at_least("alpha_lr", self.alpha_lr, 0, strict=True)


APFL = register("apfl", strategy=FedAvg, trainer=APFLTrainer, share=["all"], settings=APFLSettings)
