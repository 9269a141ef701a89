"""FedPer: the base (backbone) is shared and averaged, the head stays private; both train
jointly. trainers/fedper.py."""

from __future__ import annotations

from ..strategies.fedavg import FedAvg
from ..trainers.fedper import FedPerTrainer
from .base import register

FEDPER = register("fedper", strategy=FedAvg, trainer=FedPerTrainer, share=['base-only'])
