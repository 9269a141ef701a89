"""FedBN: FedAvg that keeps every BatchNorm entry (weights, biases, running statistics) local
(the `no-bn` filter). trainers/fedbn.py."""

from __future__ import annotations

from ..strategies.fedavg import FedAvg
from ..trainers.fedbn import FedBNTrainer
from .base import register

FEDBN = register("fedbn", strategy=FedAvg, trainer=FedBNTrainer, share=['all', 'no-bn'])
