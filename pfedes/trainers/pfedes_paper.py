"""pFedES in its paper form: a tiny shared generator G in front of each private model F.

A round has two phases. Phase 1 (G frozen): per batch, F trains on
mu * CE(F(G(x)), y) + (1 - mu) * CE(F(x), y), with G(x) computed without gradient. Phase 2
(F frozen, in eval mode so its BatchNorm statistics stay put too): G trains on CE(F(G(x)), y)
for `generator_epochs` passes. Only G leaves the client: it sits in the exchange under the name
`proxy`, so the `proxy-only` filter shares it. Inference is F(x): G is never called.
Both optimizers use the experiment's lr, momentum and weight decay; gradients are clipped to
`grad_clip` (the reference optimiser's 50).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from ..models.generator import ConvGenerator
from .base import Trainer


class PFedESPaperTrainer(Trainer):
    def build_extra_modules(self) -> None:
        self.generator = ConvGenerator(self.image.channels)
        self.exchange["proxy"] = self.generator
        s = self.settings  # checked: methods/pfedes_paper.py
        self.mu, self.generator_epochs, self.grad_clip = s.mu, s.generator_epochs, s.grad_clip

    def begin_round(self) -> None:
        # G is replaced by the server's each round: its optimizer starts fresh too.
        self.generator_optimizer = self.local_sgd(self.generator.parameters())

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        """Phase 1: F on the mixed loss, G frozen."""
        with torch.no_grad():
            generated = self.generator(x)
        ce_generated = F.cross_entropy(self.model(generated), y)
        ce_plain = F.cross_entropy(self.model(x), y)
        loss = self.mu * ce_generated + (1.0 - self.mu) * ce_plain
        self.optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.optimizer.step()
        return {"train_loss": ce_plain.item(), "generated_loss": ce_generated.item()}

    def generator_step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Phase 2: G on CE(F(G(x)), y), F frozen."""
        loss = F.cross_entropy(self.model(self.generator(x)), y)
        self.generator_optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(self.generator.parameters(), self.grad_clip)
        self.generator_optimizer.step()
        return loss.item()

    def fit(self, data, generator: torch.Generator) -> dict[str, float]:
        metrics = super().fit(data, generator)  # phase 1
        train = self.cfg["train"]
        self.model.eval()
        self.model.requires_grad_(False)
        losses = []
        try:
            for _ in range(self.generator_epochs):
                for x, y in self.batches(data.x_train, data.y_train, train["batch_size"], generator,
                                         train=True, do_augment=train["augment"]):
                    with self.placement.autocast():
                        losses.append(self.generator_step(x, y))
        finally:
            self.model.requires_grad_(True)
            self.model.train()
        metrics["generator_loss"] = sum(losses) / max(len(losses), 1)
        if not math.isfinite(metrics["generator_loss"]):
            raise FloatingPointError(f"generator training diverged: {metrics}")
        return metrics

    # predict: Trainer's F(x); G is not used at inference.
