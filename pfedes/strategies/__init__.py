"""Server strategies (extending flwr.serverapp.strategy.FedAvg): what is aggregated and how."""

from ..robust import weighted_average
from .base import PersonalizedStrategy, reply_problem
from .momentum import ServerMomentum, apply_momentum

__all__ = ["PersonalizedStrategy", "ServerMomentum", "apply_momentum", "reply_problem", "weighted_average"]
