"""FedProx client update: cross-entropy plus the proximal term mu/2 * ||w - w_g||^2.

w_g is the global model as received this round. The term covers the shared *parameters* only:
BatchNorm running statistics are buffers, not parameters, and entries that the filter keeps
private have no global value to be pulled toward. Its gradient, mu * (w - w_g), is added to
each parameter's gradient before the optimizer step.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from .fedavg import FedAvgTrainer


class FedProxTrainer(FedAvgTrainer):
    def build_extra_modules(self) -> None:
        super().build_extra_modules()
        self.mu = self.settings.mu  # >= 0: methods/fedprox.py

    def proximal_parameters(self) -> dict[str, torch.nn.Parameter]:
        shared = set(self.shared_keys)
        return {k: p for k, p in self.exchange.named_parameters() if k in shared}

    def begin_round(self) -> None:
        self.global_params = {k: p.detach().clone() for k, p in self.proximal_parameters().items()}

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        loss = F.cross_entropy(self.model(x), y)
        self.optimizer.zero_grad()
        loss.backward()
        proximal = 0.0
        with torch.no_grad():
            for k, p in self.proximal_parameters().items():
                diff = p - self.global_params[k]
                p.grad = diff.mul(self.mu) if p.grad is None else p.grad.add_(diff, alpha=self.mu)
                proximal += diff.pow(2).sum().item()
        self.optimizer.step()
        return {"train_loss": loss.item(), "prox_term": 0.5 * self.mu * proximal}
