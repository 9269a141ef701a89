"""pFedES client update: align the private features with the shared proxy extractor, and (in the
default preset) let the proxy learn from the labels and take part in the prediction.

Per batch, with z = F_k(x), e_local = P_k(z), e_proxy = E_proxy(x):

- private loss: CE(personal logits, y) + lam * align(e_local, e_proxy.detach())
  + anti_collapse(e_local); steps F_k, H_k, P_k (and the private proxy head, below);
- proxy loss: proxy_align_weight * align(e_proxy, e_local.detach())
  + proxy_ce_weight * CE(C(e_proxy), y) + anti_collapse(e_proxy); steps E_proxy (with its shared
  classifier C) with its own optimizer at proxy_lr_scale * lr.

The two stop-gradients keep each side's alignment target fixed, as in the seed form (which is
lam, proxy_align_weight = 1, everything else off). `fusion` says how E_proxy reaches the
personal prediction:

- `none`: logits = H_k(z) (the seed form: the proxy never touches a prediction);
- `concat`: logits = H_k([z, e_proxy]) (H_k is built on the wider vector); the CE gradient
  reaches E_proxy too;
- `ensemble`: a private head G_k on e_proxy; logits = log(0.5 softmax(H_k(z)) +
  0.5 softmax(G_k(e_proxy))), each of H_k and G_k trained by its own CE (G_k's reaches E_proxy),
  so the shared branch is a FedPer-style model on the proxy, personalised by G_k. With
  `distill_weight` > 0 each branch also learns the other's predictions (`mutual_distillation`):
  what the federated branch knows reaches the private model's own weights.

`proxy_epochs` > 0 adds that many passes after the joint ones in which only the shared branch
learns (E_proxy with its classifier and, with `ensemble`, G_k), on the proxy loss (plus G_k's CE)
with F_k and P_k fixed: the proxy costs a fraction of a private model's step, so it can take
more of them.

During the first `warmup_steps` local steps F_k is frozen and E_proxy is left alone, since an
untrained P_k would only pull the proxy toward noise.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from ..models import ProxyExtractor
from .alignment import ALIGN_KINDS, align_loss, anti_collapse
from .base import Trainer

FUSIONS = ("none", "concat", "ensemble")


def _check(name: str, value: float, low: float = 0.0, strict: bool = False) -> float:
    value = float(value)
    ok = math.isfinite(value) and (value > low if strict else value >= low)
    if not ok:
        raise ValueError(f"strategy.{name} must be {'>' if strict else '>='} {low:g}, got {value:g}")
    return value


def mutual_distillation(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """KL(p_b || p_a) + KL(p_a || p_b), each toward the other's fixed prediction (Deep Mutual
    Learning): each branch learns from the other's class probabilities as well as the labels."""
    return (F.kl_div(F.log_softmax(a, 1), F.softmax(b.detach(), 1), reduction="batchmean")
            + F.kl_div(F.log_softmax(b, 1), F.softmax(a.detach(), 1), reduction="batchmean"))


class PFedESTrainer(Trainer):
    shares_feature_extractor = True

    def build_extra_modules(self) -> None:
        s, d = self.cfg["strategy"], int(self.cfg["model"]["proxy_dim"])
        self.lam = _check("lam", s["lam"])
        self.align = s["align"]
        if self.align not in ALIGN_KINDS:
            raise ValueError(f"strategy.align '{self.align}' is unknown: expected one of {list(ALIGN_KINDS)}")
        self.temperature = _check("temperature", s.get("temperature", 0.1), strict=True)
        self.warmup_steps = int(_check("warmup_steps", s["warmup_steps"]))
        self.proxy_align_weight = _check("proxy_align_weight", s.get("proxy_align_weight", 1.0))
        self.proxy_ce_weight = _check("proxy_ce_weight", s.get("proxy_ce_weight", 0.0))
        self.variance_weight = _check("variance_weight", s.get("variance_weight", 0.0))
        self.covariance_weight = _check("covariance_weight", s.get("covariance_weight", 0.0))
        _check("proxy_lr_scale", s["proxy_lr_scale"], strict=True)
        self.proxy_epochs = int(_check("proxy_epochs", s.get("proxy_epochs", 0)))
        self.fusion = s.get("fusion", "none")
        if self.fusion not in FUSIONS:
            raise ValueError(f"strategy.fusion '{self.fusion}' is unknown: expected one of {list(FUSIONS)}")
        self.distill_weight = _check("distill_weight", s.get("distill_weight", 0.0))
        if self.distill_weight and self.fusion != "ensemble":
            raise ValueError(f"strategy.distill_weight needs fusion: ensemble (two branches to distil "
                             f"between), got fusion '{self.fusion}'")
        num_classes = self.model.head.out_features
        self.proxy = ProxyExtractor(d, norm=s.get("proxy_norm", "none"),
                                    num_classes=num_classes if self.proxy_ce_weight else 0,
                                    pool=int(s.get("proxy_pool", 1)))
        self.exchange["proxy"] = self.proxy
        if self.fusion == "concat":
            self.model.head = nn.Linear(self.model.head.in_features + d, num_classes)
            self.exchange["head"] = self.model.head
        elif self.fusion == "ensemble":
            self.private["proxy_head"] = nn.Linear(d, num_classes)

    def trainable_parameters(self):
        return [*self.model.parameters(), *self.private.parameters()]

    def begin_round(self) -> None:
        # The proxy is replaced by the server's each round: its optimizer starts fresh too.
        train = self.cfg["train"]
        self.proxy_optimizer = torch.optim.SGD(
            self.proxy.parameters(), lr=train["lr"] * float(self.cfg["strategy"]["proxy_lr_scale"]),
            momentum=train["momentum"])
        self.proxy.train()

    def train_epochs(self, data, generator: torch.Generator, epochs: int) -> dict[str, float]:
        metrics = super().train_epochs(data, generator, epochs)
        if self.proxy_epochs and self.steps >= self.warmup_steps:
            step, self.train_step = self.train_step, self.proxy_step
            try:
                proxy = super().train_epochs(data, generator, self.proxy_epochs)
            finally:
                self.train_step = step
            metrics.update({f"extra_{k}": v for k, v in proxy.items()})
        return metrics

    def proxy_loss(self, x: torch.Tensor, y: torch.Tensor, e_proxy: torch.Tensor,
                   e_local: torch.Tensor | None, metrics: dict[str, float]) -> torch.Tensor:
        """The shared branch's own loss; `e_local` is a fixed target (None when unweighted)."""
        loss = anti_collapse(e_proxy, self.variance_weight, self.covariance_weight)
        if self.proxy_align_weight:
            loss = loss + self.proxy_align_weight * self._align(e_proxy, e_local.detach())
        if self.proxy_ce_weight:
            shared_ce = F.cross_entropy(self.proxy.classify(e_proxy), y)
            loss = loss + self.proxy_ce_weight * shared_ce
            metrics["proxy_ce"] = shared_ce.item()
        metrics["proxy_loss"] = loss.item()
        return loss

    def proxy_step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        """One step of the shared branch alone (E_proxy, its classifier, and G_k with `ensemble`)."""
        e_local = None
        if self.proxy_align_weight:  # the private model's forward only where the loss reads it
            with torch.no_grad():
                e_local = self.model.projection(self.model.backbone(x))
        e_proxy = self.proxy(x)
        metrics: dict[str, float] = {}
        loss = self.proxy_loss(x, y, e_proxy, e_local, metrics)
        if self.fusion == "ensemble":
            branch_ce = F.cross_entropy(self.private["proxy_head"](e_proxy), y)
            loss = loss + branch_ce
            metrics["proxy_branch_ce"] = branch_ce.item()
        self.optimizer.zero_grad()
        self.proxy_optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()  # only G_k has gradients here: SGD leaves the rest as they are
        self.proxy_optimizer.step()
        return metrics

    def _align(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return align_loss(a, b, self.align, self.temperature)

    def _personal_logits(self, z: torch.Tensor, e_proxy: torch.Tensor
                         ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """(the personal prediction's logits, and with `ensemble` the two branches' logits, each
        of which is trained by its own CE; None otherwise)."""
        if self.fusion == "concat":
            return self.model.head(torch.cat([z, e_proxy], dim=1)), None
        logits = self.model.head(z)
        if self.fusion == "ensemble":
            proxy_logits = self.private["proxy_head"](e_proxy)
            mixed = torch.logsumexp(torch.stack([F.log_softmax(logits, 1), F.log_softmax(proxy_logits, 1)]),
                                    dim=0) - math.log(2.0)
            return mixed, (logits, proxy_logits)
        return logits, None

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        warm = self.steps < self.warmup_steps
        with torch.set_grad_enabled(not warm):
            z = self.model.backbone(x)
            e_proxy = self.proxy(x)
        e_local = self.model.projection(z)
        logits, parts = self._personal_logits(z, e_proxy)
        if parts is None:
            ce = F.cross_entropy(logits, y)
        else:  # each branch of the ensemble learns from the labels on its own
            ce = sum(F.cross_entropy(p, y) for p in parts)
            if self.distill_weight:
                ce = ce + self.distill_weight * mutual_distillation(*parts)
        alignment = self._align(e_local, e_proxy.detach())
        private_loss = ce + self.lam * alignment + anti_collapse(
            e_local, self.variance_weight, self.covariance_weight)
        metrics = {"train_loss": F.cross_entropy(logits, y).item(), "align_loss": alignment.item(),
                   "projection_std": e_local.detach().std(dim=0).mean().item(),
                   "proxy_batch_std": e_proxy.detach().std(dim=0).mean().item()}
        proxy_loss = None if warm else self.proxy_loss(x, y, e_proxy, e_local, metrics)
        self.optimizer.zero_grad()
        self.proxy_optimizer.zero_grad()
        (private_loss if proxy_loss is None else private_loss + proxy_loss).backward()
        self.optimizer.step()
        if proxy_loss is not None:
            self.proxy_optimizer.step()
        return metrics

    def evaluate(self, data) -> dict[str, float]:
        """The personal prediction's figures; with `ensemble`, each branch's accuracy beside them
        (on the validation split when there is one, else on the test split)."""
        metrics = super().evaluate(data)
        if self.fusion == "ensemble":
            x, y = (data.x_val, data.y_val) if data.y_val is not None and len(data.y_val) else (data.x_test, data.y_test)
            private = lambda x: self.model.head(self.model.backbone(x))  # noqa: E731
            shared = lambda x: self.private["proxy_head"](self.proxy(x))  # noqa: E731
            metrics["private_branch_accuracy"] = self.accuracy(x, y, private)["accuracy"]
            metrics["proxy_branch_accuracy"] = self.accuracy(x, y, shared)["accuracy"]
        return metrics

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        if self.fusion == "none":
            return self.model(x)
        return self._personal_logits(self.model.backbone(x), self.proxy(x))[0]

    def shared_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.proxy(x)
