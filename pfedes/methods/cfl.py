"""Clustered FL: a model per cluster; a cluster splits in two by the cosine similarity of its
clients' updates when the mean update is small (< eps1) but some update is large (> eps2).
strategies/cfl.py (the splitting), trainers/cfl.py."""

from __future__ import annotations

from dataclasses import dataclass

from ..strategies.cfl import ClusteredFL
from ..trainers.cfl import CFLTrainer
from .base import Settings, at_least, register


@dataclass(frozen=True, kw_only=True)
class CFLSettings(Settings):
    eps1: float          # split when the mean update's norm is below this ...
    eps2: float          # ... and some client's update norm is above this
    min_split_size: int  # split only clusters with at least this many replying clients
    split_after: int     # no split before this many rounds are done (the reference waits 20)

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least("eps1", self.eps1, 0, strict=True)
        at_least("eps2", self.eps2, 0, strict=True)
        at_least("min_split_size", self.min_split_size, 2)
        at_least("split_after", self.split_after, 0)


CFL = register("cfl", strategy=ClusteredFL, trainer=CFLTrainer, share=["all"], settings=CFLSettings)
