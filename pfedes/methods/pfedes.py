"""pFedES: each client shares a small proxy feature extractor (and, with `proxy_head: shared`,
its classifier); the server aggregates it, with server momentum (trainers/pfedes.py for what
each setting does). Registered twice: `pfedes` (presets pfedes, pfedes_seed, pfedes_ensemble)
and `pfedes_unshared`, the same client with nothing shared and nothing aggregated (the control
that shows how much of pFedES's gain is federation)."""

from __future__ import annotations

from dataclasses import dataclass

from ..models.proxy import PROXY_NORMS
from ..strategies.local import LocalOnly
from ..strategies.pfedes import PFedES
from ..trainers.alignment import ALIGN_KINDS
from ..trainers.pfedes import ENSEMBLE_WEIGHTINGS, FUSIONS, PREDICT_WITH, PROXY_CLASSIFIERS, PROXY_HEADS, PROXY_SCHEDULES, PFedESTrainer
from .base import MomentumSettings, at_least, fail, one_of, register


@dataclass(frozen=True, kw_only=True)
class PFedESSettings(MomentumSettings):
    """A default here is the value of a key a preset leaves out (the seed form's); the presets
    pfedes, pfedes_ensemble and pfedes_seed set their own."""

    lam: float                      # weight of the alignment loss in the private loss
    align: str                      # mse | cosine | infonce
    temperature: float = 0.1        # infonce: similarities are divided by it
    warmup_steps: int               # first local steps with F_k frozen
    proxy_align_weight: float = 1.0
    proxy_ce_weight: float = 0.0
    proxy_feature_ce_weight: float = 0.0  # plain CE on the proxy's features against C held fixed
    variance_weight: float = 0.0
    covariance_weight: float = 0.0
    proxy_lr_scale: float           # E_proxy's learning rate = proxy_lr_scale * train.lr
    proxy_epochs: int = 0
    fusion: str = "none"            # none | concat | ensemble
    distill_weight: float = 0.0
    proxy_schedule: str = "joint"   # joint | rep
    proxy_head_epochs: int = 0
    predict_with: str = "local"     # local | received
    proxy_head: str = "private"     # private | shared
    proxy_classifier: str = "trained"  # trained | fixed (the shared classifier C stays as initialised)
    ensemble_weight: str = "even"   # even | validated (the private branch's weight, picked on validation)
    proxy_norm: str = "none"        # none | group | batch
    proxy_pool: int = 1
    proxy_width: int = 16

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least("lam", self.lam, 0)
        one_of("align", self.align, ALIGN_KINDS)
        at_least("temperature", self.temperature, 0, strict=True)
        at_least("warmup_steps", self.warmup_steps, 0)
        for key in ("proxy_align_weight", "proxy_ce_weight", "proxy_feature_ce_weight", "variance_weight",
                    "covariance_weight"):
            at_least(key, getattr(self, key), 0)
        at_least("proxy_lr_scale", self.proxy_lr_scale, 0, strict=True)
        at_least("proxy_epochs", self.proxy_epochs, 0)
        one_of("fusion", self.fusion, FUSIONS)
        at_least("distill_weight", self.distill_weight, 0)
        if self.distill_weight and self.fusion != "ensemble":
            fail("distill_weight", f"needs fusion: ensemble (two branches to distil between), "
                                   f"got fusion '{self.fusion}'")
        one_of("proxy_schedule", self.proxy_schedule, PROXY_SCHEDULES)
        at_least("proxy_head_epochs", self.proxy_head_epochs, 0)
        if self.proxy_schedule == "rep" and (self.fusion != "ensemble" or not self.proxy_epochs):
            fail("proxy_schedule", f"'rep' needs fusion: ensemble and proxy_epochs >= 1 (a private head on "
                                   f"the proxy, and passes in which the proxy learns), got fusion "
                                   f"'{self.fusion}', proxy_epochs {self.proxy_epochs}")
        if self.proxy_head_epochs and self.proxy_schedule != "rep":
            fail("proxy_head_epochs", "needs proxy_schedule: rep")
        one_of("predict_with", self.predict_with, PREDICT_WITH)
        if self.predict_with == "received" and self.fusion == "none":
            fail("predict_with", "'received' needs a fusion that puts the proxy in the prediction, got fusion 'none'")
        one_of("proxy_head", self.proxy_head, PROXY_HEADS)
        if self.proxy_head == "shared" and (self.fusion != "ensemble" or self.proxy_schedule == "rep"):
            fail("proxy_head", f"'shared' needs fusion: ensemble and proxy_schedule: joint, "
                               f"got fusion '{self.fusion}', proxy_schedule '{self.proxy_schedule}'")
        one_of("proxy_classifier", self.proxy_classifier, PROXY_CLASSIFIERS)
        if self.proxy_classifier == "fixed" and not (self.proxy_ce_weight or self.proxy_head == "shared"):
            fail("proxy_classifier", "'fixed' needs a shared classifier (proxy_head: shared or proxy_ce_weight > 0)")
        if self.proxy_feature_ce_weight and not (self.proxy_ce_weight or self.proxy_head == "shared"):
            fail("proxy_feature_ce_weight", "needs a shared classifier (proxy_head: shared or proxy_ce_weight > 0)")
        one_of("ensemble_weight", self.ensemble_weight, ENSEMBLE_WEIGHTINGS)
        if self.ensemble_weight == "validated" and self.fusion != "ensemble":
            fail("ensemble_weight", f"'validated' needs fusion: ensemble, got fusion '{self.fusion}'")
        one_of("proxy_norm", self.proxy_norm, PROXY_NORMS)
        at_least("proxy_pool", self.proxy_pool, 1)
        at_least("proxy_width", self.proxy_width, 1)

    @property
    def needs_validation_split(self) -> str | None:
        return "strategy.ensemble_weight=validated" if self.ensemble_weight == "validated" else None


PFEDES = register("pfedes", strategy=PFedES, trainer=PFedESTrainer, share=["proxy-only"], settings=PFedESSettings)
PFEDES_UNSHARED = register("pfedes_unshared", strategy=LocalOnly, trainer=PFedESTrainer, share=[],
                           settings=PFedESSettings)
