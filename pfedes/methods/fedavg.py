"""FedAvg: every client trains the whole model (one architecture everywhere); the server averages
it. No settings of its own. trainers/fedavg.py."""

from __future__ import annotations

from ..strategies.fedavg import FedAvg
from ..trainers.fedavg import FedAvgTrainer
from .base import register

FEDAVG = register("fedavg", strategy=FedAvg, trainer=FedAvgTrainer, share=['all'])
