"""LG-FedAvg: a private body under a shared head (the same shape on every architecture); only
the head is averaged (the `head-only` filter), with server momentum. trainers/lgfedavg.py."""

from __future__ import annotations

from ..strategies.lgfedavg import LGFedAvg
from ..trainers.lgfedavg import LGFedAvgTrainer
from .base import MomentumSettings, register

LGFEDAVG = register("lgfedavg", strategy=LGFedAvg, trainer=LGFedAvgTrainer, share=["head-only"],
                    settings=MomentumSettings)
