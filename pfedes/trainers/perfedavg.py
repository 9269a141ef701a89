"""Per-FedAvg client update, first-order variant (Fallah et al., 2020): per step, split the
batch in two halves D and D'; take the inner step w' = w - inner_lr * grad CE(w; D), compute
g = grad CE(w'; D'), restore w and step it with g (first order: the Hessian term is dropped).
The shared model is the meta-model w; before evaluation the client adapts it with one
inner_lr step on one local train batch and scores the adapted copy (the client keeps w).
"""

from __future__ import annotations

import copy

import torch
from torch.nn import functional as F

from ..data import ClientData
from .fedavg import FedAvgTrainer


class PerFedAvgTrainer(FedAvgTrainer):
    def build_extra_modules(self) -> None:
        super().build_extra_modules()
        inner_lr = self.settings.inner_lr  # > 0 when set: methods/perfedavg.py
        self.inner_lr = float(self.cfg["train"]["lr"]) if inner_lr is None else inner_lr

    def inner_step(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
        """model <- model - inner_lr * grad CE(model; x, y), plain gradient descent."""
        loss = F.cross_entropy(model(x), y)
        params = [p for p in model.parameters() if p.requires_grad]
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.sub_(g, alpha=self.inner_lr)
        return loss.item()

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        half = len(y) // 2
        (x1, y1), (x2, y2) = ((x[:half], y[:half]), (x[half:], y[half:])) if half >= 2 else ((x, y), (x, y))
        saved = [p.detach().clone() for p in self.model.parameters()]
        inner_loss = self.inner_step(self.model, x1, y1)
        outer_loss = F.cross_entropy(self.model(x2), y2)
        self.optimizer.zero_grad()
        outer_loss.backward()  # g at w'
        with torch.no_grad():
            for p, w in zip(self.model.parameters(), saved):
                p.copy_(w)
        self.optimizer.step()  # w <- w - lr * g
        return {"train_loss": inner_loss, "meta_loss": outer_loss.item()}

    def adapted_model(self, data: ClientData) -> torch.nn.Module:
        """A copy of the model after one inner step on one local train batch."""
        train = self.cfg["train"]
        generator = torch.Generator().manual_seed(self.steps)
        x, y = next(self.batches(data.x_train, data.y_train, train["batch_size"], generator,
                                 train=True, do_augment=train["augment"]))
        model = copy.deepcopy(self.model)
        model.train()
        with self.placement.autocast():
            self.inner_step(model, x, y)
        return model

    def evaluate(self, data: ClientData) -> dict[str, float]:
        adapted = self.adapted_model(data)
        return self.accuracy(data.x_test, data.y_test, adapted.eval())

    def global_predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)
