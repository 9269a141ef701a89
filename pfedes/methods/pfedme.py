"""pFedMe: a personal model theta solves the Moreau-envelope problem with inner_steps steps per
batch; the local w moves toward it; the server mixes w <- (1 - beta) w + beta * average.
strategies/pfedme.py, trainers/pfedme.py."""

from __future__ import annotations

from dataclasses import dataclass

from ..strategies.pfedme import PFedMe
from ..trainers.pfedme import PFedMeTrainer
from .base import Settings, at_least, fail, register


@dataclass(frozen=True, kw_only=True)
class PFedMeSettings(Settings):
    lam: float                         # pull of theta toward w
    inner_steps: int                   # K
    personal_lr: float | None = None   # step size of the K inner steps; None: train.lr (the device's)
    beta: float                        # server mixing; 1: the plain weighted average; up to 2

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least("lam", self.lam, 0, strict=True)
        at_least("inner_steps", self.inner_steps, 1)
        if self.personal_lr is not None:
            at_least("personal_lr", self.personal_lr, 0, strict=True)
        if not 0.0 < self.beta <= 2.0:
            fail("beta", f"{self.beta:g} is outside (0, 2]")


PFEDME = register("pfedme", strategy=PFedMe, trainer=PFedMeTrainer, share=["all"], settings=PFedMeSettings)
