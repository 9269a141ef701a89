"""Client trainers: how a client learns under each method (one module per method)."""

from .base import SharedStateError, Trainer

__all__ = ["SharedStateError", "Trainer"]
