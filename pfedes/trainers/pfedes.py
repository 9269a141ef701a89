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

`proxy_head` says which head reads the proxy in the ensemble's shared branch:

- `private`: G_k, a linear head that never leaves the client;
- `shared`: the proxy's own classifier C, shared and averaged with it, trained with the
  logit-adjusted cross-entropy CE(C(e_proxy) + log pi_k, y), where pi_k is this client's label
  distribution (its train split's class frequencies, add-one smoothed; private). Under label skew
  the clients then agree on what C should learn (the class-conditional part, which is the same
  everywhere), instead of each pulling C toward its own classes; the branch predicts
  C(e_proxy) + log pi_k, the shared classifier put back on this client's label mix.

`proxy_feature_ce_weight` > 0 adds, to the proxy's loss, the plain CE of the proxy's features
against the shared classifier C held fixed for this term: CE(W.detach() e_proxy + b.detach(), y),
every class a negative, including those this client never sees. The logit-adjusted CE that trains
C (`proxy_head: shared`) hardly moves the features away from an absent class (its logit is
pushed down by log pi_k), so under strong label skew each client's proxy only learns to separate
its own classes; this term makes it separate them from the others too, while C stays trained by
the adjusted loss only (FedLC's classifier, with the features of a full softmax). Measured on
the pathological tuning seed it lowers the probe (README): an option, off.

`proxy_classifier: fixed` keeps the shared classifier C as initialised (the same on every client,
since the server sends the initial proxy): only E_proxy learns, toward fixed class directions, so
clients that see different classes no longer pull C apart and move the features instead
(FedBABU's frozen head, on the proxy).

`proxy_schedule` says how the shared branch of the ensemble learns in a round:

- `joint` (FedPer on the proxy): E_proxy and its head learn together in every pass;
- `rep` (FedRep on the proxy): G_k first learns on the proxy as received, which stays fixed (the
  joint pass and `proxy_head_epochs` more passes), then E_proxy learns with G_k fixed for
  `proxy_epochs` passes.

`ensemble_weight` says how the ensemble weighs its branches: `even`, 0.5 each, or `validated`:
after each round's training the client picks the private branch's weight w from
ENSEMBLE_WEIGHTS by the mixture's accuracy on its own validation split (ties go to the weight
nearest 0.5), and predicts w p_private + (1 - w) p_shared until the next round. A client whose
shared branch is worse than its private model (noised by central DP, say) then falls back on
its private model; w is private state. With either weighting, a sample on which the shared
branch gives no finite logits is predicted by the private branch alone, and a round whose
training diverges in the shared branch only keeps the private model's learning (and its w) and
sends no update (`SharedUpdateDiverged`, pfedes/trainers/base.py).

`predict_with` says which proxy the personal prediction uses: `local`, the proxy as this client's
passes left it, or `received`, the proxy as the server sent it this round (kept as private state
for the evaluation): what the federation learnt, not this client's last passes over its own data.

During the first `warmup_steps` local steps F_k is frozen and E_proxy is left alone, since an
untrained P_k would only pull the proxy toward noise.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn
from torch.nn import functional as F

from ..models import ProxyExtractor
from ..optim import LocalSGD
from .alignment import ALIGN_KINDS, align_loss, anti_collapse
from .base import SharedUpdateDiverged, Trainer

FUSIONS = ("none", "concat", "ensemble")
PROXY_SCHEDULES = ("joint", "rep")
PROXY_HEADS = ("private", "shared")
PREDICT_WITH = ("local", "received")
PROXY_CLASSIFIERS = ("trained", "fixed")
ENSEMBLE_WEIGHTINGS = ("even", "validated")
ENSEMBLE_WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)  # the private branch's weights `validated` picks from


class BranchWeight(nn.Module):
    """The ensemble's weight on the private branch (a buffer, so it persists with the client)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("value", torch.tensor(0.5))


def mixture(private_logits: torch.Tensor, shared_logits: torch.Tensor, weight) -> torch.Tensor:
    """log(w softmax(private) + (1 - w) softmax(shared)), w = `weight` in [0, 1]; a sample whose
    shared logits are not all finite (a proxy broken by noise) gets the private branch's alone."""
    w = torch.as_tensor(weight, dtype=private_logits.dtype, device=private_logits.device)
    private = F.log_softmax(private_logits, 1)
    mixed = torch.logsumexp(torch.stack([private + w.log(), F.log_softmax(shared_logits, 1) + (1 - w).log()]), dim=0)
    return private_where_shared_broken(mixed, private, shared_logits)


def private_where_shared_broken(mixed: torch.Tensor, private: torch.Tensor, shared_logits: torch.Tensor) -> torch.Tensor:
    """`mixed`, except for a sample whose shared logits are not all finite: `private` there."""
    return torch.where(shared_logits.isfinite().all(1, keepdim=True), mixed, private)


def best_weight(private_logits: torch.Tensor, shared_logits: torch.Tensor, labels: torch.Tensor) -> float:
    """The weight in ENSEMBLE_WEIGHTS whose `mixture` of the two branches is right most often on
    `labels`; ties go to the weight nearest 0.5 (the even mixture)."""
    def correct(w: float) -> int:
        return int((mixture(private_logits, shared_logits, w).argmax(1) == labels).sum())

    return max(ENSEMBLE_WEIGHTS, key=lambda w: (correct(w), -abs(w - 0.5)))


class LabelPrior(nn.Module):
    """log pi_k, the client's label distribution (add-one smoothed); uniform until `fit_to`."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.register_buffer("log_prior", torch.full((num_classes,), -math.log(num_classes)))

    def fit_to(self, labels: torch.Tensor) -> None:
        counts = torch.bincount(labels, minlength=len(self.log_prior)).float() + 1.0
        self.log_prior.copy_((counts / counts.sum()).log())

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return logits + self.log_prior


def features_against_fixed(classifier: nn.Linear, features: torch.Tensor) -> torch.Tensor:
    """The classifier's logits with its weights held fixed: the gradient reaches only `features`."""
    return F.linear(features, classifier.weight.detach(), classifier.bias.detach())


def mutual_distillation(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """KL(p_b || p_a) + KL(p_a || p_b), each toward the other's fixed prediction (Deep Mutual
    Learning): each branch learns from the other's class probabilities as well as the labels."""
    return (F.kl_div(F.log_softmax(a, 1), F.softmax(b.detach(), 1), reduction="batchmean")
            + F.kl_div(F.log_softmax(b, 1), F.softmax(a.detach(), 1), reduction="batchmean"))


class PFedESTrainer(Trainer):
    shares_feature_extractor = True

    def build_extra_modules(self) -> None:
        s, d = self.settings, int(self.cfg["model"]["proxy_dim"])  # checked: methods/pfedes.py
        self.lam, self.align, self.temperature = s.lam, s.align, s.temperature
        self.warmup_steps = s.warmup_steps
        self.proxy_align_weight, self.proxy_ce_weight = s.proxy_align_weight, s.proxy_ce_weight
        self.proxy_feature_ce_weight = s.proxy_feature_ce_weight
        self.variance_weight, self.covariance_weight = s.variance_weight, s.covariance_weight
        self.proxy_epochs, self.fusion, self.distill_weight = s.proxy_epochs, s.fusion, s.distill_weight
        self.proxy_schedule, self.proxy_head_epochs = s.proxy_schedule, s.proxy_head_epochs
        self.rep = self.proxy_schedule == "rep"
        self.predict_with_received = s.predict_with == "received"
        self.proxy_head = s.proxy_head
        num_classes = self.model.head.out_features
        shared_head = bool(self.proxy_ce_weight) or self.proxy_head == "shared"
        # The proxy with its shared classifier C is a small model of the whole federation:
        # the server scores C(E_proxy(x)) on the unified test set (no label prior: it is balanced).
        self.has_global_model = shared_head
        self.proxy = ProxyExtractor(d, norm=s.proxy_norm, num_classes=num_classes if shared_head else 0,
                                    pool=s.proxy_pool, width=s.proxy_width, in_channels=self.image.channels)
        if shared_head and s.proxy_classifier == "fixed":  # C stays as the server initialised it
            self.proxy.classifier.requires_grad_(False)
        self.exchange["proxy"] = self.proxy
        if self.fusion == "concat":
            self.model.head = nn.Linear(self.model.head.in_features + d, num_classes)
            self.exchange["head"] = self.model.head
        elif self.fusion == "ensemble" and self.proxy_head == "private":
            self.private["proxy_head"] = nn.Linear(d, num_classes)
        elif self.fusion == "ensemble":
            self.private["label_prior"] = LabelPrior(num_classes)
        if s.ensemble_weight == "validated":
            self.private["ensemble_weight"] = BranchWeight()
        if self.predict_with_received:  # the proxy as received this round
            self.private["received_proxy"] = copy.deepcopy(self.proxy).requires_grad_(False)
            self.server_copies.add("received_proxy")

    def trainable_parameters(self):
        return [p for p in (*self.model.parameters(), *self.private.parameters()) if p.requires_grad]

    def begin_round(self) -> None:
        # The proxy is replaced by the server's each round: its optimizer starts fresh too.
        train = self.cfg["train"]
        self.proxy_optimizer = LocalSGD(
            self.proxy.parameters(), lr=train["lr"] * self.settings.proxy_lr_scale,
            momentum=train["momentum"])
        self.proxy.train()
        if self.predict_with_received:
            self.private["received_proxy"].load_state_dict(self.proxy.state_dict())

    def fit(self, data, generator: torch.Generator) -> dict[str, float]:
        if "label_prior" in self.private:
            self.private["label_prior"].fit_to(data.y_train)
        try:
            metrics = super().fit(data, generator)
        except SharedUpdateDiverged:  # the private model's round is kept: so is the weight it picks
            if "ensemble_weight" in self.private:
                self.choose_ensemble_weight(data)
            raise
        if "ensemble_weight" in self.private:
            metrics["ensemble_weight"] = self.choose_ensemble_weight(data)
        return metrics

    @torch.no_grad()
    def choose_ensemble_weight(self, data) -> float:
        """`validated`: the private branch's weight, picked on the validation split (kept at its
        last value when the split is empty)."""
        weight = self.private["ensemble_weight"].value
        if data.y_val is None or not len(data.y_val):
            return float(weight)
        self.exchange.eval()
        self.private.eval()
        proxy, parts = self.prediction_proxy, []
        for x, _ in self.batches(data.x_val, data.y_val, 256, None, train=False, do_augment=False):
            with self.placement.autocast():
                _, branches = self._personal_logits(self.model.backbone(x), proxy(x), proxy)
            parts.append([b.float().cpu() for b in branches])
        private_logits, shared_logits = (torch.cat(p) for p in zip(*parts))
        weight.fill_(best_weight(private_logits, shared_logits, data.y_val))
        return float(weight)

    def branch_logits(self, e_proxy: torch.Tensor, proxy: ProxyExtractor | None = None) -> torch.Tensor:
        """The ensemble's shared branch on the features of `proxy` (default: the local one; see
        `proxy_head`)."""
        if self.proxy_head == "shared":
            return self.private["label_prior"]((self.proxy if proxy is None else proxy).classify(e_proxy))
        return self.private["proxy_head"](e_proxy)

    @property
    def prediction_proxy(self) -> nn.Module:
        """The proxy the personal prediction uses (see `predict_with`)."""
        return self.private["received_proxy"] if self.predict_with_received else self.proxy

    def train_epochs(self, data, generator: torch.Generator, epochs: int) -> dict[str, float]:
        metrics = super().train_epochs(data, generator, epochs)
        if self.proxy_epochs and self.steps >= self.warmup_steps:
            if self.proxy_head_epochs:
                metrics.update({f"head_{k}": v for k, v in self._passes(
                    data, generator, self.proxy_head_epochs, self.proxy_head_step).items()})
            metrics.update({f"extra_{k}": v for k, v in self._passes(
                data, generator, self.proxy_epochs, self.proxy_step).items()})
        return metrics

    def _passes(self, data, generator: torch.Generator, epochs: int, step) -> dict[str, float]:
        """`epochs` passes over the train split with `step` in place of `train_step`."""
        self.train_step = step
        try:
            return super().train_epochs(data, generator, epochs)
        finally:
            del self.train_step  # the class's method again

    def proxy_head_step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        """One step of G_k alone on the proxy's features (`rep`: the proxy as received, fixed)."""
        with torch.no_grad():
            e_proxy = self.proxy(x)
        loss = F.cross_entropy(self.private["proxy_head"](e_proxy), y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()  # only G_k has gradients
        return {"proxy_branch_ce": loss.item()}

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
        if self.proxy_feature_ce_weight:
            feature_ce = F.cross_entropy(features_against_fixed(self.proxy.classifier, e_proxy), y)
            loss = loss + self.proxy_feature_ce_weight * feature_ce
            metrics["proxy_feature_ce"] = feature_ce.item()
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
            if self.rep:  # G_k stays as fitted while the proxy learns
                self.private["proxy_head"].requires_grad_(False)
            branch_ce = F.cross_entropy(self.branch_logits(e_proxy), y)
            if self.rep:
                self.private["proxy_head"].requires_grad_(True)
            loss = loss + branch_ce
            metrics["proxy_branch_ce"] = branch_ce.item()
        self.optimizer.zero_grad()
        self.proxy_optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()  # only G_k has gradients here (none with `rep`): SGD leaves the rest
        self.proxy_optimizer.step()
        return metrics

    def _align(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return align_loss(a, b, self.align, self.temperature)

    def _personal_logits(self, z: torch.Tensor, e_proxy: torch.Tensor, proxy: ProxyExtractor | None = None
                         ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """(the personal prediction's logits, and with `ensemble` the two branches' logits, each
        of which is trained by its own CE; None otherwise)."""
        if self.fusion == "concat":
            return self.model.head(torch.cat([z, e_proxy], dim=1)), None
        logits = self.model.head(z)
        if self.fusion == "ensemble":
            proxy_logits = self.branch_logits(e_proxy, proxy)
            if "ensemble_weight" in self.private:
                mixed = mixture(logits, proxy_logits, self.private["ensemble_weight"].value)
            else:  # `even`: written out, not mixture(..., 0.5), so its runs stay bit for bit as committed
                private = F.log_softmax(logits, 1)
                mixed = private_where_shared_broken(torch.logsumexp(torch.stack(
                    [private, F.log_softmax(proxy_logits, 1)]), dim=0) - math.log(2.0), private, proxy_logits)
            return mixed, (logits, proxy_logits)
        return logits, None

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        warm = self.steps < self.warmup_steps
        with torch.set_grad_enabled(not warm):
            z = self.model.backbone(x)
        with torch.set_grad_enabled(not (warm or self.rep)):  # `rep`: the proxy is fixed here
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
        private_loss = ce + anti_collapse(e_local, self.variance_weight, self.covariance_weight)
        if self.lam:  # only then: 0 x a non-finite alignment (a proxy broken by noise) is NaN
            private_loss = private_loss + self.lam * alignment
        metrics = {"train_loss": F.cross_entropy(logits, y).item(), "align_loss": alignment.item(),
                   "projection_std": e_local.detach().std(dim=0).mean().item(),
                   "proxy_batch_std": e_proxy.detach().std(dim=0).mean().item()}
        proxy_loss = None if warm or self.rep else self.proxy_loss(x, y, e_proxy, e_local, metrics)
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
            proxy = self.prediction_proxy
            shared = lambda x: self.branch_logits(proxy(x), proxy)  # noqa: E731
            metrics["private_branch_accuracy"] = self.accuracy(x, y, private)["accuracy"]
            metrics["proxy_branch_accuracy"] = self.accuracy(x, y, shared)["accuracy"]
        return metrics

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        if self.fusion == "none":
            return self.model(x)
        proxy = self.prediction_proxy
        return self._personal_logits(self.model.backbone(x), proxy(x), proxy)[0]

    def global_predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.proxy.classify(self.proxy(x))

    def shared_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.proxy(x)
