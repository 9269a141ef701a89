"""E_proxy: the one small feature extractor that every client shares."""

import torch
from torch import nn
from torch.nn import functional as F

PROXY_NORMS = ("none", "group", "batch")


class InputNorm(nn.Module):
    """Standardises each input over (C, H, W), so [0, 1] and [0, 255] inputs look the same."""

    def forward(self, x):
        return F.layer_norm(x, x.shape[1:])


def _norm_layer(kind: str, channels: int) -> nn.Module:
    if kind == "group":
        return nn.GroupNorm(max(1, channels // 8), channels)  # per sample: no statistics to average
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    return nn.Identity()


class ProxyExtractor(nn.Module):
    """Input normalisation, three conv layers (w-2w-4w channels, `width` w = 16 by default),
    global pooling, linear map to d.

    `norm` puts a normalisation after each conv (`group`: GroupNorm, per sample, so nothing
    client-specific is averaged; `batch`: BatchNorm, whose running statistics are shared too).
    `pool` is the side of the grid the last feature map is average-pooled to before the linear
    map (1: global pooling, the seed form; 2 keeps a coarse layout, at 4x the map's parameters).
    `num_classes` > 0 adds a classifier on the d features (`classifier`) that travels with the
    proxy: the supervised signal that lets every client's labels reach the shared network.
    The key names of the plain form (norm none, no classifier) are the seed form's. Any input
    size works (the last pooling is adaptive); `in_channels` is the images' channel count.
    """

    def __init__(self, proxy_dim: int = 128, norm: str = "none", num_classes: int = 0, pool: int = 1,
                 width: int = 16, in_channels: int = 3) -> None:
        super().__init__()
        if norm not in PROXY_NORMS:
            raise ValueError(f"strategy.proxy_norm '{norm}' is unknown: expected one of {list(PROXY_NORMS)}")
        if width < 1:
            raise ValueError(f"strategy.proxy_width must be >= 1, got {width}")
        self.norm = InputNorm()
        layers: list[nn.Module] = []
        c_in = in_channels
        for i, c_out in enumerate((width, 2 * width, 4 * width)):
            layers += [nn.Conv2d(c_in, c_out, 3, padding=1, bias=norm == "none")]
            if norm != "none":
                layers.append(_norm_layer(norm, c_out))
            layers.append(nn.ReLU(inplace=True))
            if i < 2:
                layers.append(nn.MaxPool2d(2))
            c_in = c_out
        if pool < 1:
            raise ValueError(f"strategy.proxy_pool must be >= 1, got {pool}")
        self.body = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(pool), nn.Flatten())
        self.out = nn.Linear(c_in * pool * pool, proxy_dim)
        self.classifier = nn.Linear(proxy_dim, num_classes) if num_classes > 0 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The d-dimensional proxy features e_proxy."""
        return self.out(self.body(self.norm(x)))

    def classify(self, features: torch.Tensor) -> torch.Tensor:
        """Logits of the shared classifier on proxy features."""
        if self.classifier is None:
            raise RuntimeError("this proxy has no classifier (strategy.proxy_ce_weight is 0)")
        return self.classifier(features)
