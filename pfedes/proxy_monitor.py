"""Is the shared proxy extractor learning anything? Server-side diagnostics for every method
whose trainer shares a feature extractor (`Trainer.shared_features`), computed each round on
the unified test set (the data's test split, `data.unified_test_samples` rows):

- `proxy_std`: the mean over dimensions of the std of E_proxy(x) across samples;
- `probe_acc`: a linear classifier trained on the proxy's features of the first half of those
  rows and scored on the second half, every `probe_every` rounds and the last;
  `probe_acc_fresh` is the same probe on the proxy as initialised (same seed), computed once.

A proxy whose std falls below `COLLAPSE_RATIO` of its round-1 value has collapsed to a
near-constant map: one warning is logged, and `collapsed` says so in the round's record.
(The clients' side, the projection std and the alignment loss, comes with their train metrics.)
"""

from __future__ import annotations

from logging import WARNING
from typing import Any

import torch
from flwr.common.logger import log
from torch.nn import functional as F

from .data import DataSource, load_unified_test, to_input

COLLAPSE_RATIO = 0.1


@torch.no_grad()
def feature_std(features: torch.Tensor) -> float:
    return float(features.std(dim=0).mean())


def linear_probe(features: torch.Tensor, labels: torch.Tensor, num_classes: int, steps: int = 200,
                 seed: int = 0) -> float:
    """Accuracy on the second half of a linear classifier fit (full-batch L-BFGS, standardised
    features, small L2) on the first half."""
    half = len(labels) // 2
    train_x, test_x = features[:half], features[half:]
    mean, std = train_x.mean(0), train_x.std(0) + 1e-6
    train_x, test_x = (train_x - mean) / std, (test_x - mean) / std
    generator = torch.Generator().manual_seed(seed)
    weight = (torch.randn(features.shape[1], num_classes, generator=generator) * 0.01).requires_grad_()
    bias = torch.zeros(num_classes, requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], max_iter=steps, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = F.cross_entropy(train_x @ weight + bias, labels[:half]) + 1e-3 * weight.pow(2).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        optimizer.step(closure)
    with torch.no_grad():
        return float(((test_x @ weight + bias).argmax(1) == labels[half:]).float().mean())


@torch.no_grad()
def shared_features(trainer, x: torch.Tensor) -> torch.Tensor:
    """The trainer's shared extractor's features of model inputs `x`, in eval mode, 500 at a time."""
    trainer.exchange.eval()
    return torch.cat([trainer.shared_features(x[i:i + 500]) for i in range(0, len(x), 500)])


class ProxyMonitor:
    def __init__(self, cfg: dict[str, Any], trainer, num_classes: int) -> None:
        """`trainer`: a server-side trainer of the method, holding the initial shared entries."""
        self.trainer = trainer
        self.num_classes = num_classes
        self.every = int(cfg["probe_every"])
        self.num_rounds = int(cfg["num_rounds"])
        x, y = load_unified_test(DataSource.from_cfg(cfg["data"]), int(cfg["data"]["unified_test_samples"]))
        self.x, self.y = to_input(x, trainer.image), y
        self.first_std: float | None = None
        self.warned = False
        self.fresh_probe = linear_probe(self._features(), self.y, num_classes)

    def _features(self) -> torch.Tensor:
        return shared_features(self.trainer, self.x)

    def __call__(self, server_round: int, arrays: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The round's diagnostics for the aggregated shared entries `arrays`."""
        self.trainer.load_shared(arrays)
        features = self._features()
        std = feature_std(features)
        if self.first_std is None:
            self.first_std = std
        collapsed = std < COLLAPSE_RATIO * self.first_std
        if collapsed and not self.warned:
            self.warned = True
            log(WARNING, "round %d: the shared proxy has collapsed: its feature std %.4f is below %d%% "
                "of round 1's %.4f (every input maps to nearly the same point; see the method's "
                "anti-collapse settings)", server_round, std, int(COLLAPSE_RATIO * 100), self.first_std)
        out: dict[str, Any] = {"proxy_std": std, "proxy_collapsed": bool(collapsed)}
        if server_round % self.every == 0 or server_round == self.num_rounds:
            out["probe_acc"] = linear_probe(features, self.y, self.num_classes)
            out["probe_acc_fresh"] = self.fresh_probe
        return out
