"""FedPer client update: FedAvg's step on the whole model; the `base-only` filter shares the
backbone (the base layers) and keeps the head private, so there is no global model."""

from .fedavg import FedAvgTrainer


class FedPerTrainer(FedAvgTrainer):
    has_global_model = False
