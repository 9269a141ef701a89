"""Quality-weighted aggregation (`aggregation.weighting=quality`): the FQI/DLI blend of the method
guide, w_i <- (1 - b) w_i + b q_i with q_i = 0.6 FQI_i + 0.4 DLI_i, for methods that share a
feature extractor.

- FQI (feature quality index), measured by the client on its train split: intra-class compactness
  in the shared feature space, the mean cosine similarity of each sample's shared features to
  its class's mean feature, in [0, 1] (negative values count as 0). Scale-free, and defined for a
  client with one class.
- DLI (data label index): how close the client's label distribution p_i is to the federation's,
  exp(-KL(p_i || p)), in (0, 1], where p is the sample-weighted mean of the round's reported
  distributions (so p > 0 wherever p_i > 0 and the KL is finite). The client reports p_i: its
  label distribution reaches the server, which FedProto, FD and FedGH reveal anyway through their
  per-class counts, but the default weighting does not.
- Both the sample weights and the q_i are normalised to sum to 1 before the blend, so b (the
  `quality_blend` setting) is the share of the weight that quality decides.

The client's reports are untrusted: the server drops a reply without a finite FQI or with a label
distribution of the wrong length, a negative or non-finite entry, or a zero sum, and clips FQI
to [0, 1].
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from .data import batches

FQI_KEY = "fqi"
LABELS_KEY = "label_dist"
FQI_SHARE = 0.6  # q_i = 0.6 FQI_i + 0.4 DLI_i (the method guide's blend)


@torch.no_grad()
def feature_quality(trainer, x_uint8: torch.Tensor, labels: torch.Tensor) -> float:
    """FQI: the mean cosine similarity of each sample's shared features to its class mean."""
    trainer.exchange.eval()
    trainer.private.eval()
    features = torch.cat([trainer.shared_features(x.to(trainer.device)).cpu() for x, _ in
                          batches(x_uint8, labels, 256, None, train=False, do_augment=False,
                                  fmt=trainer.image)])
    features = features.flatten(1).float()
    similarity = torch.empty(len(labels))
    for c in labels.unique():
        members = labels == c
        centre = features[members].mean(0, keepdim=True)
        similarity[members] = F.cosine_similarity(features[members], centre.expand_as(features[members]), dim=1)
    return float(similarity.clamp(min=0.0).mean()) if len(labels) else 0.0


def label_distribution(labels: torch.Tensor, num_classes: int) -> list[float]:
    counts = torch.bincount(labels, minlength=num_classes).double()
    return (counts / counts.sum().clamp(min=1.0)).tolist()


def client_report(trainer, x_train: torch.Tensor, y_train: torch.Tensor, num_classes: int) -> dict[str, Any]:
    """What a client sends with its train reply under quality weighting."""
    return {FQI_KEY: feature_quality(trainer, x_train, y_train),
            LABELS_KEY: label_distribution(y_train, num_classes)}


def report_problem(metrics: Mapping[str, Any], num_classes: int | None) -> str | None:
    """Why a reply's quality report is unusable, or None."""
    fqi = metrics.get(FQI_KEY)
    if isinstance(fqi, bool) or not isinstance(fqi, (int, float)) or not math.isfinite(fqi):
        return f"'{FQI_KEY}' is {fqi!r}, not a finite number (aggregation.weighting=quality)"
    dist = metrics.get(LABELS_KEY)
    if not isinstance(dist, (list, tuple)) or (num_classes is not None and len(dist) != num_classes):
        return f"'{LABELS_KEY}' is not a list of {num_classes} class shares (aggregation.weighting=quality)"
    values = np.asarray(dist, dtype=np.float64)
    if not np.isfinite(values).all() or (values < 0).any() or values.sum() <= 0:
        return f"'{LABELS_KEY}' has a negative or non-finite entry, or sums to 0 (aggregation.weighting=quality)"
    return None


def quality_weights(samples: Sequence[float], metrics: Sequence[Mapping[str, Any]], blend: float) -> list[float]:
    """(1 - blend) n_i / sum n + blend q_i / sum q over the accepted replies."""
    n = np.asarray(samples, dtype=np.float64)
    dists = np.asarray([m[LABELS_KEY] for m in metrics], dtype=np.float64)
    dists /= dists.sum(axis=1, keepdims=True)
    federation = (n[:, None] * dists).sum(0) / n.sum()
    with np.errstate(divide="ignore", invalid="ignore"):
        kl = np.where(dists > 0, dists * np.log(dists / federation), 0.0).sum(axis=1)
    fqi = np.clip([float(m[FQI_KEY]) for m in metrics], 0.0, 1.0)
    q = FQI_SHARE * fqi + (1.0 - FQI_SHARE) * np.exp(-kl)
    return list((1.0 - blend) * n / n.sum() + blend * q / q.sum())
