"""pFedES on the server: the aggregate of the clients' proxy extractors (the aggregation rule;
default the sample-weighted average), then server momentum; evaluation needs no shared arrays,
since each client reports its personal model."""

from .base import PersonalizedStrategy
from .momentum import ServerMomentum


class PFedES(ServerMomentum, PersonalizedStrategy):
    """Aggregates only E_proxy (the `proxy-only` filter on the client decides what is sent)."""
