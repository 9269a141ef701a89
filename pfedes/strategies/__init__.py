"""Server strategies (extending flwr.serverapp.strategy.FedAvg): what is aggregated and how."""

from ..robust import weighted_average
from .base import PersonalizedStrategy, apply_momentum, reply_problem

__all__ = ["PersonalizedStrategy", "apply_momentum", "reply_problem", "weighted_average"]
