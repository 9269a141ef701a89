"""FedRep client update: the backbone (representation) is shared, the head is private; each
round first trains the head for `strategy.head_epochs` with the backbone frozen, then the
backbone for `train.local_epochs` with the head frozen.

Each part has its own optimizer, and a frozen part gets no gradient at all, so neither weight
decay nor momentum can move it during the other part's phase.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional as F

from ..data import ClientData
from .fedavg import FedAvgTrainer

HEAD, BODY = "head", "body"


class FedRepTrainer(FedAvgTrainer):
    has_global_model = False

    def build_extra_modules(self) -> None:
        super().build_extra_modules()
        self.head_epochs = self.settings.head_epochs  # >= 0: methods/fedrep.py
        self.head_optimizer = self.local_sgd(self.model.head.parameters())
        self.phase = BODY

    def trainable_parameters(self):
        return self.model.backbone.parameters()  # the body's optimizer; the head has its own

    def set_phase(self, phase: str) -> None:
        self.phase = phase
        for p in self.model.backbone.parameters():
            p.requires_grad_(phase == BODY)
        for p in self.model.head.parameters():
            p.requires_grad_(phase == HEAD)

    def train_epochs(self, data: ClientData, generator: torch.Generator, epochs: int) -> dict[str, float]:
        self.set_phase(HEAD)
        head = super().train_epochs(data, generator, self.head_epochs) if self.head_epochs else {}
        self.set_phase(BODY)
        body = super().train_epochs(data, generator, epochs)
        self.model.requires_grad_(True)
        return {**({"head_loss": head["train_loss"]} if head else {}), **body}

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        optimizer = self.head_optimizer if self.phase == HEAD else self.optimizer
        with torch.set_grad_enabled(self.phase == BODY):
            z = self.model.backbone(x)
        loss = F.cross_entropy(self.model.head(z), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return {"train_loss": loss.item()}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "head_optimizer": self.head_optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.head_optimizer.load_state_dict(state["head_optimizer"])
