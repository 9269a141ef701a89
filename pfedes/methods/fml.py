"""FML: mutual learning between each client's private model and a small shared "meme" model
(E_proxy and a linear classifier); only the meme is averaged (the `proxy-only` filter), with
server momentum. trainers/fml.py."""

from __future__ import annotations

from dataclasses import dataclass

from ..strategies.fml import FML
from ..trainers.fml import FMLTrainer
from .base import MomentumSettings, register, within


@dataclass(frozen=True, kw_only=True)
class FMLSettings(MomentumSettings):
    alpha: float  # private model: alpha * CE + (1 - alpha) * KL(meme || private)
    beta: float   # meme: beta * CE + (1 - beta) * KL(private || meme)

    def __post_init__(self) -> None:
        super().__post_init__()
        within("alpha", self.alpha, 0.0, 1.0)
        within("beta", self.beta, 0.0, 1.0)


FML_METHOD = register("fml", strategy=FML, trainer=FMLTrainer, share=["proxy-only"], settings=FMLSettings)
