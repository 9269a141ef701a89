"""Clustered FL client update: FedAvg's step on the model of the client's cluster (the server
decides which cluster model each client receives), so there is no single global model."""

from .fedavg import FedAvgTrainer


class CFLTrainer(FedAvgTrainer):
    has_global_model = False
