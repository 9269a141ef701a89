"""FedGH client update: a private F_k + P_k under the global head the server trained.

The model's head reads the common space (CommonHeadModel). Each round the client loads the
server's global head (the `head-only` filter), trains the whole model with CE, then sends its
class prototypes (mean of P(F(x)) per class) and class counts; the server trains the global
head on them. Weights travel only downward, and only the head's.
"""

from __future__ import annotations

import torch
from torch import nn

from ..models.common_head import CommonHeadModel
from .base import Trainer
from .fedproto import ClassPayloadTrainer


class FedGHTrainer(ClassPayloadTrainer):
    def build_extra_modules(self) -> None:
        self.model = CommonHeadModel(self.model, int(self.cfg["model"]["proxy_dim"]))
        self.exchange = nn.ModuleDict(dict(self.model.named_children()))

    @property
    def payload_dim(self) -> int:
        return int(self.cfg["model"]["proxy_dim"])

    def class_output(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.embed(x)

    def load_shared(self, arrays: dict[str, torch.Tensor]) -> None:
        """Down comes the global head (the entries the `head-only` filter admits)."""
        Trainer.load_shared(self, arrays)

    # train_step: Trainer's cross-entropy step on H(P(F(x))), the global head included.

    @classmethod
    def initial_shared(cls, cfg, arch, num_classes, image=None) -> dict[str, torch.Tensor]:
        """The server starts from a freshly initialised head (seeded by cfg['seed'])."""
        trainer = cls(cfg, arch, num_classes, seed=int(cfg["seed"]), image=image)
        return Trainer.shared_state(trainer)
