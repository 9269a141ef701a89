"""LG-FedAvg client update: a private body (F_k and P_k) under a shared head.

The head reads the common space (CommonHeadModel: logits = H(P(F(x)))), so it has the same
shape d -> classes on every architecture. The whole model trains with CE; the `head-only`
filter sends and receives the head alone: the body never leaves the client.
"""

from __future__ import annotations

from torch import nn

from ..models.common_head import CommonHeadModel
from .base import Trainer


class LGFedAvgTrainer(Trainer):
    def build_extra_modules(self) -> None:
        self.model = CommonHeadModel(self.model, int(self.cfg["model"]["proxy_dim"]))
        self.exchange = nn.ModuleDict(dict(self.model.named_children()))

    # train_step: Trainer's cross-entropy step on H(P(F(x))).
