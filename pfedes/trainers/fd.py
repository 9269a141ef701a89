"""FD (federated distillation) client update: per-class average logits are what is shared.

Per batch: loss = CE(logits, y) + lam * MSE(logits, the server's average logits of class y)
(samples whose class has no global average yet add no regulariser). After local training the
client sends its per-class average logits (no augmentation, eval mode) and class counts; no
weight leaves the client (`share: []`). The private model is the zoo's F_k + H_k.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from .fedproto import ClassPayloadTrainer


class FDTrainer(ClassPayloadTrainer):
    def build_extra_modules(self) -> None:
        self.lam = self.settings.lam  # >= 0: methods/fd.py

    @property
    def payload_dim(self) -> int:
        return self.num_classes

    def class_output(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        logits = self.model(x)
        ce = F.cross_entropy(logits, y)
        distill = self.distance_to_global(logits, y)
        loss = ce + self.lam * distill
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {"train_loss": ce.item(), "distill_loss": distill.item()}
