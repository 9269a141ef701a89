"""FedProto client update, and what every per-class-payload method shares on the client.

The model's head reads the common space (CommonHeadModel: logits = H(P(F(x)))), so the
prototype of class c, the mean of P(F(x)) over the client's samples of class c, is the
representation the classifier separates. Per batch: loss = CE(logits, y) + lam * MSE(P(F(x)),
global prototype of y) (samples whose class has no global prototype yet add no regulariser).
After local training the client computes its prototypes (no augmentation, eval mode) and sends
only them and their class counts: no weight leaves the client (`share: []`).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ..class_payload import global_means, local_class_means
from ..models.common_head import CommonHeadModel
from .base import SharedStateError, Trainer


class ClassPayloadTrainer(Trainer):
    """Sends a per-class payload (pfedes.class_payload) computed after local training, and
    receives the server's per-class means, which `distance_to_global` uses as targets.

    Subclasses say what is averaged per class (`class_output`) and in what dimension
    (`payload_dim`)."""

    def class_output(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @property
    def payload_dim(self) -> int:
        raise NotImplementedError

    @property
    def num_classes(self) -> int:
        return self.model.head.out_features

    def load_shared(self, arrays: dict[str, torch.Tensor]) -> None:
        """The server's per-class means (empty in the first round)."""
        try:
            means = global_means(arrays, self.num_classes, self.payload_dim)
        except ValueError as exc:
            raise SharedStateError(str(exc)) from None
        table = torch.zeros(self.num_classes, self.payload_dim)
        known = torch.zeros(self.num_classes, dtype=torch.bool)
        for label, mean in means.items():
            table[label] = mean
            known[label] = True
        self.global_table, self.global_known = table.to(self.device), known.to(self.device)

    def distance_to_global(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """MSE between each sample's output and the server's mean of its class (0 if none)."""
        known = getattr(self, "global_known", None)
        if known is None or not known[y].any():
            return out.new_zeros(())
        mask = known[y]
        return F.mse_loss(out[mask], self.global_table[y[mask]])

    def fit(self, data, generator: torch.Generator) -> dict[str, float]:
        metrics = super().fit(data, generator)
        self.exchange.eval()  # BatchNorm statistics as at inference, and left unchanged
        self.upload = local_class_means(self.class_output, data.x_train, data.y_train, self.num_classes,
                                        self.image, device=self.device)
        return metrics

    def shared_state(self) -> dict[str, torch.Tensor]:
        """What leaves the client: the payload of the last `fit` (nothing before one), on the CPU."""
        return {k: v.clone() for k, v in getattr(self, "upload", {}).items()}

    @classmethod
    def initial_shared(cls, cfg, arch, num_classes, image=None) -> dict[str, torch.Tensor]:
        """No global means exist before the first round."""
        return {}


class FedProtoTrainer(ClassPayloadTrainer):
    def build_extra_modules(self) -> None:
        self.model = CommonHeadModel(self.model, int(self.cfg["model"]["proxy_dim"]))
        self.exchange = nn.ModuleDict(dict(self.model.named_children()))
        self.lam = self.settings.lam  # >= 0: methods/fedproto.py

    @property
    def payload_dim(self) -> int:
        return int(self.cfg["model"]["proxy_dim"])

    def class_output(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.embed(x)

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        embedding = self.model.embed(x)
        ce = F.cross_entropy(self.model.head(embedding), y)
        proto = self.distance_to_global(embedding, y)
        loss = ce + self.lam * proto
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {"train_loss": ce.item(), "proto_loss": proto.item()}
