"""Which clients train in a round, for every strategy (`selection.*`), when not all of them do
(`fraction_train` < 1):

- `uniform`: Flower's own sampling (FedAvg's `sample_nodes`), the default;
- `power_of_choice`: draw `candidates` x as many nodes as the round takes, uniformly, and keep the
  ones whose last reported training loss is highest (a node not heard from yet counts as highest,
  so every node is tried), while keeping the round's mix of device profiles: the kept nodes are
  taken in turn from each profile seen among the candidates (Cho et al., "Client selection in
  federated learning", power-of-choice, with a per-profile round robin).

The loss a node reports is untrusted: a missing, negative or non-finite one is not remembered,
and the rest are clipped to `MAX_LOSS`.
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .settings import Section

MODES = ("uniform", "power_of_choice")
MAX_LOSS = 100.0


@dataclass(frozen=True)
class Selection:
    mode: str = "uniform"
    candidates: int = 2

    @classmethod
    def from_cfg(cls, cfg: Mapping[str, Any]) -> Selection:
        s = Section(cfg, "selection")
        return cls(s.choice("mode", "uniform", MODES), s.integer("candidates", 2, 1))


class ClientHistory:
    """What the server remembers of each node: its last training loss and its device profile."""

    def __init__(self) -> None:
        self.loss: dict[int, float] = {}
        self.device: dict[int, str] = {}

    def remember(self, node_id: int, loss: Any, device: Any) -> None:
        if isinstance(loss, (int, float)) and not isinstance(loss, bool) and math.isfinite(loss) and loss >= 0:
            self.loss[node_id] = min(float(loss), MAX_LOSS)
        if device is not None:  # one string per profile, not per node: a checkpoint stores it once
            self.device[node_id] = sys.intern(str(device))

    def state_dict(self) -> dict[str, Any]:
        return {"loss": dict(self.loss), "device": dict(self.device)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.loss = {int(k): float(v) for k, v in (state.get("loss") or {}).items()}
        self.device = {int(k): sys.intern(str(v)) for k, v in (state.get("device") or {}).items()}


def power_of_choice(node_ids: list[int], count: int, candidates: int, history: ClientHistory,
                    rng: random.Random) -> list[int]:
    """`count` nodes: the highest-loss of `candidates * count` drawn uniformly, round robin over the
    device profiles among them (unknown profile: its own group)."""
    pool = rng.sample(node_ids, min(len(node_ids), candidates * count))
    by_device: dict[str, list[int]] = {}
    for node in sorted(pool, key=lambda n: (-history.loss.get(n, math.inf), n)):
        by_device.setdefault(history.device.get(node, "?"), []).append(node)
    queues = [by_device[d] for d in sorted(by_device, key=lambda d: -history.loss.get(by_device[d][0], math.inf))]
    chosen: list[int] = []
    while len(chosen) < min(count, len(pool)):
        for queue in queues:
            if queue and len(chosen) < count:
                chosen.append(queue.pop(0))
    return sorted(chosen)
