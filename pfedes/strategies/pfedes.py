"""pFedES on the server: the weighted average of the clients' proxy extractors with server
momentum (the defaults of PersonalizedStrategy); evaluation needs no shared arrays, since each
client reports its personal model F_k + H_k."""

from .base import PersonalizedStrategy


class PFedES(PersonalizedStrategy):
    """Aggregates only E_proxy (the `proxy-only` filter on the client decides what is sent)."""
