"""LoRA-adapter sharing: a frozen base model with LoRA adapters on its Linear layers (and Conv2d
with conv); only the adapters train and travel (the `lora-only` filter). trainers/lora.py."""

from __future__ import annotations

from dataclasses import dataclass

from ..strategies.fedavg import FedAvg
from ..trainers.lora import LoRATrainer
from .base import Settings, at_least, register


@dataclass(frozen=True, kw_only=True)
class LoRASettings(Settings):
    rank: int                          # r
    alpha: float                       # scale = alpha / rank
    conv: bool                         # also adapt Conv2d layers
    base_checkpoint: str | None = None  # server_checkpoint.pt of a whole-model run; None: the seeded model

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least("rank", self.rank, 1)
        at_least("alpha", self.alpha, 0, strict=True)


LORA = register("lora", strategy=FedAvg, trainer=LoRATrainer, share=["lora-only"], settings=LoRASettings)
