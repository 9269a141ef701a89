"""Local-only on the server: sample clients, collect their metrics, aggregate nothing."""

from .base import PersonalizedStrategy


class LocalOnly(PersonalizedStrategy):
    """Clients share no entries (`share: []`), so the shared model stays empty."""
