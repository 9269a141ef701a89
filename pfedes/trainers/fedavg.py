"""FedAvg client update: cross-entropy on the local data, on the whole model (F_k + H_k).

The base of the homogeneous-model baselines: every client runs the same architecture, the model
is backbone + head (the pFedES projection P_k is not part of these methods, so it is taken out of
the model and never travels), and the method's `share` filter decides what leaves the client.
"""

from __future__ import annotations

from .base import Trainer


class FedAvgTrainer(Trainer):
    """Trainer's cross-entropy step; the shared entries form the global model."""

    has_global_model = True
    requires_same_architecture = True

    def build_extra_modules(self) -> None:
        del self.model.projection
        del self.exchange["projection"]
