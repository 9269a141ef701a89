"""FD (federated distillation) on the server: per-class average logits over clients, weighted
by class counts (the same aggregation as FedProto, on logits instead of prototypes)."""

from .fedproto import ClassPayloadStrategy


class FD(ClassPayloadStrategy):
    @property
    def payload_dim(self) -> int:
        return self.num_classes
