"""pFedES (paper form) on the server: the sample-weighted average of the clients' generators G
(PersonalizedStrategy's default; strategy.server_momentum 0 makes it the plain average)."""

from .base import PersonalizedStrategy
from .momentum import ServerMomentum


class PFedESPaper(ServerMomentum, PersonalizedStrategy):
    """Aggregates only G (the `proxy-only` filter on the client decides what is sent)."""
