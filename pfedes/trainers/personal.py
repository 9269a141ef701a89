"""What Ditto and APFL share: besides the global model w (trained and shared as in FedAvg), a
personal model v that never leaves the client, with its own optimizer; v starts as a copy of
the first global model the client receives. Evaluation uses the personal prediction, the
server's global accuracy uses w."""

from __future__ import annotations

import copy
from typing import Any

import torch

from .fedavg import FedAvgTrainer


class PersonalModelTrainer(FedAvgTrainer):
    def build_extra_modules(self) -> None:
        super().build_extra_modules()
        personal = copy.deepcopy(self.model)
        personal.register_buffer("initialised", torch.zeros((), dtype=torch.bool))
        self.private["personal"] = self.personal = personal
        self.personal_optimizer = self.local_sgd(self.personal.parameters())

    def begin_round(self) -> None:
        if not bool(self.personal.initialised):
            self.personal.load_state_dict(self.model.state_dict(), strict=False)
            self.personal.initialised.fill_(True)

    def global_predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "personal_optimizer": self.personal_optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.personal_optimizer.load_state_dict(state["personal_optimizer"])
