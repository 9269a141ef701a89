"""FML on the server: the sample-weighted average of the clients' shared "meme" models
(PersonalizedStrategy's default; strategy.server_momentum 0 makes it the plain average)."""

from .base import PersonalizedStrategy
from .momentum import ServerMomentum


class FML(ServerMomentum, PersonalizedStrategy):
    """Aggregates only the meme (the `proxy-only` filter on the client decides what is sent)."""
