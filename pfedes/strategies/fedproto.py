"""FedProto on the server: per-class prototypes averaged over clients, weighted by class counts.

Also the server side that every per-class-payload method shares (`ClassPayloadStrategy`):
replies carry a per-class payload (pfedes.class_payload) instead of weights; each is validated
(keys match its counts, shapes, dtypes, finiteness, a positive weight) and a bad one is dropped
with a warning naming the node, and the round goes on.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import Message

from ..class_payload import counts_problem, decode, expected_payload, weighted_class_average
from ..data import DataSource, num_classes_of
from .base import PersonalizedStrategy, reply_problem


def class_reply_problem(msg: Message, num_classes: int, dim: int) -> str | None:
    """Why a train reply is not a usable per-class payload, or None if it is."""
    if msg.has_error() or len(msg.content.array_records) != 1:
        return reply_problem(msg, {})  # names the error or the malformed envelope
    arrays = next(iter(msg.content.array_records.values()))
    as_numpy = {k: a.numpy() for k, a in arrays.items()}
    problem = counts_problem(as_numpy, num_classes)
    if problem:
        return problem
    # Keys, shapes, dtypes, NaN/Inf and the weight, against what these counts imply.
    return reply_problem(msg, expected_payload(as_numpy["counts"], dim))


class ClassPayloadStrategy(PersonalizedStrategy):
    """Aggregates per-class payloads of dimension `payload_dim` (subclasses say which)."""

    averages_arrays = False  # per-class means weighted by counts: no rule, weighting or DP of combine
    replies_start_from_sent = False  # a client's means are its own, not the sent means trained further

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__(cfg)
        self.num_classes = num_classes_of(DataSource.from_cfg(cfg["data"]))

    @property
    def payload_dim(self) -> int:
        raise NotImplementedError

    def reply_problem(self, msg: Message) -> str | None:
        return class_reply_problem(msg, self.num_classes, self.payload_dim)

    def aggregate_arrays(self, server_round: int, replies: list[Message],
                         arrays: list[dict[str, np.ndarray]], weights: list[float]) -> dict[str, np.ndarray]:
        return self.aggregate_payloads(server_round, [decode(a) for a in arrays])

    def aggregate_payloads(self, server_round: int,
                           payloads: list[tuple[dict[int, np.ndarray], np.ndarray]]) -> dict[str, np.ndarray]:
        """What the server sends next: the count-weighted per-class means (and summed counts)."""
        return weighted_class_average(payloads)


class FedProto(ClassPayloadStrategy):
    """Global prototype of class c = sum_k n_kc * p_kc / sum_k n_kc over this round's clients."""

    @property
    def payload_dim(self) -> int:
        return int(self.cfg["model"]["proxy_dim"])
