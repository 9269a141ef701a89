"""Local-only: every client trains its own model alone; nothing is shared, nothing aggregated."""

from __future__ import annotations

from ..strategies.local import LocalOnly
from ..trainers.local import LocalTrainer
from .base import register

LOCAL = register("local", strategy=LocalOnly, trainer=LocalTrainer, share=[])
