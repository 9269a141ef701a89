"""Local-only: each client trains its own model on its own data; nothing is shared."""

from .base import Trainer


class LocalTrainer(Trainer):
    """Cross-entropy on local data only (Trainer's default step)."""
