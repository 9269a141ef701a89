"""APFL client update (Deng et al., 2020): the global model w trains as in FedAvg and is what
the client shares; a personal model v and a mixing weight alpha never leave the client. The
personalized model is the parameter mixture

    v_bar = alpha * v + (1 - alpha) * w,

and each step updates w on CE(w(x), y), then v and alpha on CE(v_bar(x), y) (the gradient
reaches v through alpha * v, and alpha through <v - w, grad>); alpha is kept in [0, 1].
Evaluation uses v_bar with the global w as received (the server sends it). v starts as a copy
of the first global model the client receives. BatchNorm running statistics of v_bar are v's.
"""

from __future__ import annotations

import torch
from torch.func import functional_call
from torch.nn import functional as F

from .personal import PersonalModelTrainer


class APFLTrainer(PersonalModelTrainer):
    def build_extra_modules(self) -> None:
        super().build_extra_modules()
        s = self.settings  # checked: methods/apfl.py
        alpha = s.alpha_init
        self.alpha_lr = float(self.cfg["train"]["lr"]) if s.alpha_lr is None else s.alpha_lr
        self.personal.register_buffer("alpha", torch.tensor(alpha))

    def mixed_logits(self, x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        """v_bar(x): alpha * v + (1 - alpha) * w, with w held fixed."""
        global_params = dict(self.model.named_parameters())
        mixed = {k: alpha * v + (1 - alpha) * global_params[k].detach()
                 for k, v in self.personal.named_parameters()}
        buffers = {k: b for k, b in self.personal.named_buffers() if k not in ("alpha", "initialised")}
        return functional_call(self.personal, {**mixed, **buffers}, (x,), strict=False)

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        alpha = self.personal.alpha.clone().requires_grad_(True)
        loss = F.cross_entropy(self.mixed_logits(x, alpha), y)
        self.personal_optimizer.zero_grad()
        loss.backward()
        self.personal_optimizer.step()
        with torch.no_grad():
            self.personal.alpha.sub_(self.alpha_lr * alpha.grad).clamp_(0.0, 1.0)
        metrics = super().train_step(x, y)  # the global model's local FedAvg step
        return {**metrics, "personal_loss": loss.item(), "alpha": float(self.personal.alpha)}

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.mixed_logits(x, self.personal.alpha)
