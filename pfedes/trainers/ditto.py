"""Ditto client update: the global model w trains as in FedAvg and is what the client shares;
a personal model v, which never leaves the client, trains on

    CE(v(x), y) + lam/2 * ||v - w_t||^2

where w_t is the global model received this round (fixed during the round). Evaluation uses v;
v starts as a copy of the first global model the client receives.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from .personal import PersonalModelTrainer


class DittoTrainer(PersonalModelTrainer):
    def build_extra_modules(self) -> None:
        super().build_extra_modules()
        self.lam = self.settings.lam  # >= 0: methods/ditto.py

    def begin_round(self) -> None:
        super().begin_round()
        self.round_global = {k: p.detach().clone() for k, p in self.model.named_parameters()}

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        metrics = super().train_step(x, y)  # the global model's local FedAvg step
        loss = F.cross_entropy(self.personal(x), y)
        self.personal_optimizer.zero_grad()
        loss.backward()
        with torch.no_grad():
            for k, p in self.personal.named_parameters():
                p.grad.add_(p - self.round_global[k], alpha=self.lam)
        self.personal_optimizer.step()
        return {**metrics, "personal_loss": loss.item()}

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.personal(x)
