"""FedGH on the server: a global head trained on the clients' class prototypes.

Each round the server takes the head it sent (the shared arrays), trains it with SGD on every
uploaded (prototype, class) pair, one pair per client and class present, with cross-entropy,
`server_epochs` full-batch steps at `server_lr`, and sends the result down as the next head.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F

from ..config import learning_rate
from .fedproto import ClassPayloadStrategy


def train_head(head: dict[str, np.ndarray], prototypes: np.ndarray, labels: np.ndarray,
               lr: float, steps: int) -> dict[str, np.ndarray]:
    """`steps` plain SGD steps of CE(W p + b, label), averaged over the pairs, from `head`."""
    weight = torch.tensor(head["head.weight"], dtype=torch.float32, requires_grad=True)
    bias = torch.tensor(head["head.bias"], dtype=torch.float32, requires_grad=True)
    x, y = torch.from_numpy(prototypes).float(), torch.from_numpy(labels).long()
    optimizer = torch.optim.SGD([weight, bias], lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        F.cross_entropy(F.linear(x, weight, bias), y).backward()
        optimizer.step()
    return {"head.weight": weight.detach().numpy().astype(head["head.weight"].dtype),
            "head.bias": bias.detach().numpy().astype(head["head.bias"].dtype)}


class FedGH(ClassPayloadStrategy):
    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        s = self.settings  # methods/fedgh.py
        self.server_lr = learning_rate(cfg) if s.server_lr is None else s.server_lr
        self.server_epochs = s.server_epochs

    @property
    def payload_dim(self) -> int:
        return int(self.cfg["model"]["proxy_dim"])

    def aggregate_payloads(self, server_round, payloads):
        pairs = [(means[label], label) for means, _ in payloads for label in sorted(means)]
        prototypes = np.stack([p for p, _ in pairs])
        labels = np.array([label for _, label in pairs])
        return train_head(self.current, prototypes, labels, self.server_lr, self.server_epochs)
