"""pFedMe client update (Dinh et al., 2020): the local copy of the global model w is what the
client shares; the personal model theta solves, per batch, the Moreau-envelope problem

    min_theta  CE(theta(x), y) + lam/2 * ||theta - w||^2

approximately with K plain gradient steps at `personal_lr` (warm-started from the previous
batch's theta), then w moves toward it: w <- w - lr * lam * (w - theta). theta is reset to the
received global model at the start of each round, as in the reference algorithm, and is the
model evaluated. BatchNorm running statistics (buffers, not parameters) of w follow theta's.
"""

from __future__ import annotations

import copy

import torch
from torch.nn import functional as F

from .fedavg import FedAvgTrainer


class PFedMeTrainer(FedAvgTrainer):
    def build_extra_modules(self) -> None:
        super().build_extra_modules()
        s = self.settings  # checked: methods/pfedme.py
        self.lam, self.inner_steps = s.lam, s.inner_steps
        self.lr = float(self.cfg["train"]["lr"])
        self.personal_lr = self.lr if s.personal_lr is None else s.personal_lr
        personal = copy.deepcopy(self.model)
        self.private["personal"] = self.personal = personal

    def begin_round(self) -> None:
        self.personal.load_state_dict(self.model.state_dict(), strict=False)

    def envelope_objective(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(CE(theta(x), y) + lam/2 * ||theta - w||^2 with w fixed, the CE part alone)."""
        w = dict(self.model.named_parameters())
        prox = sum((p - w[k].detach()).pow(2).sum() for k, p in self.personal.named_parameters())
        ce = F.cross_entropy(self.personal(x), y)
        return ce + 0.5 * self.lam * prox, ce

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        for _ in range(self.inner_steps):
            objective, ce = self.envelope_objective(x, y)
            grads = torch.autograd.grad(objective, list(self.personal.parameters()))
            with torch.no_grad():
                for p, g in zip(self.personal.parameters(), grads):
                    p.sub_(g, alpha=self.personal_lr)
        with torch.no_grad():
            theta = dict(self.personal.named_parameters())
            for k, p in self.model.named_parameters():
                if k in theta:
                    p.sub_(p - theta[k], alpha=self.lr * self.lam)
            personal_buffers = dict(self.personal.named_buffers())
            for k, b in self.model.named_buffers():
                if k in personal_buffers:
                    b.copy_(personal_buffers[k])
        return {"train_loss": ce.item(), "envelope_loss": objective.item()}

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.personal(x)

    def global_predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)
