"""LG-FedAvg on the server: the sample-weighted average of the clients' heads (its preset's
server momentum is 0: the plain average).

The clients evaluate with the averaged head on their private bodies, as the method deploys it,
so evaluation messages carry the head too."""

from .base import PersonalizedStrategy
from .momentum import ServerMomentum


class LGFedAvg(ServerMomentum, PersonalizedStrategy):
    """The `head-only` filter on the client decides what is sent: the head, never the body."""

    send_arrays_to_evaluate = True
