"""pFedES, paper form: a tiny shared generator G in front of each private model F; only G is
averaged (it sits in the exchange as `proxy`: the `proxy-only` filter), with server momentum.
trainers/pfedes_paper.py."""

from __future__ import annotations

from dataclasses import dataclass

from ..strategies.pfedes_paper import PFedESPaper
from ..trainers.pfedes_paper import PFedESPaperTrainer
from .base import MomentumSettings, at_least, register, within


@dataclass(frozen=True, kw_only=True)
class PFedESPaperSettings(MomentumSettings):
    mu: float              # weight of CE(F(G(x))) in F's loss
    generator_epochs: int  # passes over the local data for G after F's
    grad_clip: float       # gradient-norm clip for F and G

    def __post_init__(self) -> None:
        super().__post_init__()
        within("mu", self.mu, 0.0, 1.0, bounds="(]")
        at_least("generator_epochs", self.generator_epochs, 1)
        at_least("grad_clip", self.grad_clip, 0, strict=True)


PFEDES_PAPER = register("pfedes_paper", strategy=PFedESPaper, trainer=PFedESPaperTrainer, share=["proxy-only"],
                        settings=PFedESPaperSettings)
