"""pFedMe on the server: w <- (1 - beta) * w + beta * (weighted average of the clients' w).

beta = 1 is FedAvg's average; the paper also uses beta > 1 (extrapolation), so beta may be
up to 2. Evaluation needs no arrays: each client reports its personal model theta.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Message

from .base import PersonalizedStrategy
from .momentum import apply_momentum


class PFedMe(PersonalizedStrategy):
    send_arrays_to_evaluate = False

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self.beta = self.settings.beta  # in (0, 2]: methods/pfedme.py

    def aggregate_arrays(self, server_round: int, replies: list[Message],
                         arrays: list[dict[str, np.ndarray]], weights: list[float]) -> dict[str, np.ndarray]:
        if not self.current:
            return {}
        # apply_momentum(old, new, m) = m * old + (1 - m) * new, with m = 1 - beta.
        return apply_momentum(self.current, self.combine(replies, arrays, weights), 1.0 - self.beta)
