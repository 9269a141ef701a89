"""FedBN client update: FedAvg's step; the `no-bn` filter keeps every BatchNorm entry (weight,
bias, running_mean, running_var, num_batches_tracked) on the client.

Since each client keeps its own normalisation, the averaged entries alone are no model: the
method has no global model to score on the unified test set.
"""

from .fedavg import FedAvgTrainer


class FedBNTrainer(FedAvgTrainer):
    has_global_model = False
