"""A client model whose classification head reads the common space: logits = H(P(F(x))).

Every architecture's projection P_k maps its features to the common dimension d, so the head
has the same shape (d -> classes) on every device. Methods that share the head (LG-FedAvg,
FedGH) or need class prototypes that the classifier itself separates (FedProto) use it.
"""

import torch
from torch import nn

from .zoo import ClientModel


class CommonHeadModel(nn.Module):
    """F_k (private backbone), P_k (projection into the common space d), H (Linear d -> classes)."""

    def __init__(self, client_model: ClientModel, proxy_dim: int) -> None:
        super().__init__()
        self.backbone = client_model.backbone
        self.projection = client_model.projection
        self.head = nn.Linear(proxy_dim, client_model.head.out_features)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """The representation in the common space (the prototype space)."""
        return self.projection(self.backbone(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x))
