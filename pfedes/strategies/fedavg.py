"""FedAvg on the server: the sample-weighted average of the shared entries (PersonalizedStrategy
with no server momentum). Evaluation messages carry the averaged entries, since the evaluated
model is built from them: FedAvg's personalized accuracy is the global model on each client's
own test split; with a filter that keeps some entries private (FedBN's BatchNorm, FedPer's and
FedRep's head, a frozen LoRA base) it is the averaged entries plus the client's private ones.

One server class for every method whose server step is exactly this: FedAvg, FedProx, FedBN,
FedPer, FedRep, APFL, Per-FedAvg and LoRA-adapter sharing (their presets in conf/strategy).
"""

from .base import PersonalizedStrategy


class FedAvg(PersonalizedStrategy):
    send_arrays_to_evaluate = True
