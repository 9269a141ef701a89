"""LoRA adapters as weight parametrizations: W = W0 + (alpha / r) * B @ A.

A is Gaussian (std 1/r), B is zeros, so an adapted model starts equal to its base. The adapter
is a `torch.nn.utils.parametrize` parametrization of the layer's `weight`, so every code path
that reads `layer.weight` (including nn.MultiheadAttention's out_proj and the fused
Transformer fast path) sees the adapted weight. Conv2d weights use B @ A reshaped to
(out, in, kh, kw), with A of shape (r, in * kh * kw).

Normalised factors: a LoRA module's state_dict holds `lora_A` and `lora_B` such that
lora_B @ lora_A is the weight change itself, without the alpha / r scale (the scale is folded
into B on saving and taken out on loading). Clients with different alpha therefore average
factors of the same meaning, and the `lora-only` filter ships exactly these entries.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn.utils import parametrize


class LoRA(nn.Module):
    """The parametrization: weight -> weight + scale * (B @ A).view_as(weight)."""

    def __init__(self, weight: torch.Tensor, rank: int, alpha: float) -> None:
        super().__init__()
        if rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {rank}")
        if alpha <= 0:
            raise ValueError(f"LoRA alpha must be > 0, got {alpha}")
        out_features, fan_in = weight.shape[0], math.prod(weight.shape[1:])
        self.rank, self.alpha, self.scale = rank, float(alpha), float(alpha) / rank
        self.lora_A = nn.Parameter(torch.randn(rank, fan_in) / rank)
        self.lora_B = nn.Parameter(torch.zeros(out_features, rank))
        self.register_state_dict_post_hook(_fold_scale_into_b)
        self.register_load_state_dict_pre_hook(_unfold_scale_from_b)

    def delta(self) -> torch.Tensor:
        """The weight change scale * B @ A (flattened to (out, fan_in))."""
        return self.scale * (self.lora_B @ self.lora_A)

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight + self.delta().view_as(weight)


def _fold_scale_into_b(module: LoRA, state_dict, prefix: str, local_metadata) -> None:
    key = prefix + "lora_B"
    state_dict[key] = state_dict[key] * module.scale


def _unfold_scale_from_b(module: LoRA, state_dict, prefix: str, *args) -> None:
    key = prefix + "lora_B"
    if key in state_dict:
        state_dict[key] = state_dict[key] / module.scale


def attach_lora(model: nn.Module, rank: int, alpha: float, conv: bool = False) -> list[str]:
    """Freeze every parameter of `model` and adapt its Linear (and, with `conv`, Conv2d) layers.

    Returns the names of the adapted layers. Only the adapters' A and B are trainable after it.
    """
    model.requires_grad_(False)
    kinds = (nn.Linear, nn.Conv2d) if conv else (nn.Linear,)
    targets = [(name, m) for name, m in model.named_modules()
               if isinstance(m, kinds) and not parametrize.is_parametrized(m, "weight")]
    if not targets:
        raise ValueError("the model has no layer that LoRA can adapt (Linear, or Conv2d with conv=true)")
    for _, layer in targets:
        parametrize.register_parametrization(layer, "weight", LoRA(layer.weight, rank, alpha))
    return [name for name, _ in targets]


def lora_modules(model: nn.Module) -> list[LoRA]:
    return [m for m in model.modules() if isinstance(m, LoRA)]
