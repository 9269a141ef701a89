"""Server momentum, a piece a strategy composes (pFedES, FML, LG-FedAvg and pFedES's paper form,
whose settings classes extend `methods.base.MomentumSettings`: `strategy.server_momentum`):

    new = beta * old + (1 - beta) * aggregate

for floating entries, where old is what the server sent this round and the aggregate is the
strategy's own (the aggregation rule over the accepted replies); beta = 0 is the aggregate itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import Message


def apply_momentum(old: dict[str, np.ndarray], new: dict[str, np.ndarray], beta: float) -> dict[str, np.ndarray]:
    """beta * old + (1 - beta) * new for floating entries; integer entries (counters) take new."""
    if beta == 0.0:
        return new
    return {k: ((beta * old[k].astype(np.float64) + (1.0 - beta) * v.astype(np.float64)).astype(v.dtype)
                if v.dtype.kind == "f" else v) for k, v in new.items()}


class ServerMomentum:
    """Mixed in before PersonalizedStrategy: momentum over whatever the strategy aggregates."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__(cfg)
        self.server_momentum = self.settings.server_momentum  # in [0, 1): methods/base.py MomentumSettings

    def aggregate_arrays(self, server_round: int, replies: list[Message],
                         arrays: list[dict[str, np.ndarray]], weights: list[float]) -> dict[str, np.ndarray]:
        new = super().aggregate_arrays(server_round, replies, arrays, weights)
        return apply_momentum(self.current, new, self.server_momentum) if new else new
