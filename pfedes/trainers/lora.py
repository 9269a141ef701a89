"""LoRA-adapter sharing: a frozen base model (backbone + head) with LoRA adapters on its Linear
layers (and Conv2d layers with `strategy.conv: true`); only the adapters' A and B train, and
the `lora-only` filter makes them the only entries that leave the client (normalised, see
pfedes.models.lora).

The base must be the same on every client: it is built from the experiment seed (the same
initial model the other homogeneous methods start from), or loaded from
`strategy.base_checkpoint`, a server_checkpoint.pt of a run whose shared arrays hold the whole
backbone and head (e.g. a FedAvg run). BatchNorm layers of the frozen base stay in eval mode.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.nn.modules.batchnorm import _NormBase

from ..models import build_client_model
from ..models.lora import attach_lora
from .fedavg import FedAvgTrainer


def load_base_checkpoint(model: torch.nn.Module, path: str) -> None:
    """Load the backbone and head of `model` from a server checkpoint's shared arrays."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"strategy.base_checkpoint '{path}' is not a file")
    arrays = torch.load(file, map_location="cpu", weights_only=False).get("arrays", {})
    own = {k: v for k, v in model.state_dict().items() if not k.startswith("projection.")}
    missing = sorted(set(own) - set(arrays))
    if missing:
        raise ValueError(f"strategy.base_checkpoint '{path}' lacks {len(missing)} base entries "
                         f"(e.g. {missing[:3]}): it must hold the whole backbone and head")
    for k, v in own.items():
        if tuple(arrays[k].shape) != tuple(v.shape):
            raise ValueError(f"strategy.base_checkpoint '{path}': '{k}' has shape "
                             f"{tuple(arrays[k].shape)}, this model's has {tuple(v.shape)}")
    model.load_state_dict({k: torch.as_tensor(arrays[k]) for k in own}, strict=False)


class LoRATrainer(FedAvgTrainer):
    def build_extra_modules(self) -> None:
        s, model_cfg = self.settings, self.cfg["model"]  # checked: methods/lora.py
        torch.manual_seed(int(self.cfg["seed"]))  # the same base on every client
        self.model = build_client_model(self.arch, self.model.head.out_features,
                                        model_cfg["proxy_dim"], model_cfg["feature_dim"],
                                        self.image.channels, self.image.size)
        if s.base_checkpoint:
            load_base_checkpoint(self.model, s.base_checkpoint)
        del self.model.projection
        self.exchange = torch.nn.ModuleDict(dict(self.model.named_children()))
        attach_lora(self.exchange, s.rank, s.alpha, conv=s.conv)

    def trainable_parameters(self):
        return [p for p in self.exchange.parameters() if p.requires_grad]

    def begin_round(self) -> None:
        for m in self.exchange.modules():
            if isinstance(m, _NormBase):
                m.eval()  # the base is frozen, its running statistics included
