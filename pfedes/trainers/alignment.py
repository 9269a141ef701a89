"""The losses that tie a client's projected features to the shared proxy's, and the terms that
keep either from collapsing to a constant map.

- `align_loss(a, b, kind)`: mse, cosine (negative mean cosine), or infonce: row i of `a` must pick
  row i of `b` among all rows of `b` (the other samples of the batch are the negatives), a
  cross-entropy over cosine similarities divided by the temperature.
- `variance_hinge(z)`: mean over dimensions of relu(1 - sqrt(var + 1e-4)) (VICReg's variance
  term): zero once every dimension's std across the batch reaches 1.
- `covariance_penalty(z)`: sum of the squared off-diagonal entries of the covariance of the
  centred features (divided by batch - 1), divided by the number of dimensions (VICReg's).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

ALIGN_KINDS = ("mse", "cosine", "infonce")


def align_loss(a: torch.Tensor, b: torch.Tensor, kind: str, temperature: float = 0.1) -> torch.Tensor:
    if kind == "mse":
        return F.mse_loss(a, b)
    if kind == "cosine":
        return -F.cosine_similarity(a, b, dim=1).mean()
    if kind == "infonce":
        logits = F.normalize(a, dim=1) @ F.normalize(b, dim=1).T / temperature
        return F.cross_entropy(logits, torch.arange(len(a), device=a.device))
    raise ValueError(f"strategy.align '{kind}' is unknown: expected one of {list(ALIGN_KINDS)}")


def variance_hinge(z: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    std = torch.sqrt(z.var(dim=0) + eps)
    return F.relu(1.0 - std).mean()


def covariance_penalty(z: torch.Tensor) -> torch.Tensor:
    n, d = z.shape
    centred = z - z.mean(dim=0)
    cov = centred.T @ centred / max(n - 1, 1)
    off_diagonal = cov - torch.diag(torch.diagonal(cov))
    return off_diagonal.pow(2).sum() / d


def anti_collapse(z: torch.Tensor, variance_weight: float, covariance_weight: float) -> torch.Tensor:
    """variance_weight * variance_hinge + covariance_weight * covariance_penalty (0 when both are 0)."""
    loss = z.new_zeros(())
    if variance_weight:
        loss = loss + variance_weight * variance_hinge(z)
    if covariance_weight:
        loss = loss + covariance_weight * covariance_penalty(z)
    return loss
