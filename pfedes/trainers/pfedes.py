"""pFedES client update: align the private features with the shared proxy extractor.

Per batch: z = F_k(x), logits = H_k(z), e_local = P_k(z), e_proxy = E_proxy(x) without gradient;
loss = CE(logits, y) + lam * align(e_local, e_proxy) steps F_k, H_k, P_k. Then E_proxy takes one
step toward e_local.detach() with its own optimizer at proxy_lr_scale * lr. During the first
`warmup_steps` local steps F_k is frozen (only P_k and H_k train) and E_proxy is left alone,
since an untrained P_k would only pull the proxy toward noise.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from ..models import ProxyExtractor
from .base import Trainer


def align_loss(a: torch.Tensor, b: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "mse":
        return F.mse_loss(a, b)
    if kind == "cosine":
        return -F.cosine_similarity(a, b, dim=1).mean()
    raise ValueError(f"strategy.align '{kind}' is unknown: expected mse or cosine")


class PFedESTrainer(Trainer):
    def build_extra_modules(self) -> None:
        self.proxy = ProxyExtractor(self.cfg["model"]["proxy_dim"])
        self.exchange["proxy"] = self.proxy
        s = self.cfg["strategy"]
        self.lam, self.align, self.warmup_steps = float(s["lam"]), s["align"], int(s["warmup_steps"])
        align_loss(torch.zeros(1, 1), torch.zeros(1, 1), self.align)  # reject a bad kind early

    def begin_round(self) -> None:
        # The proxy is replaced by the server's each round: its optimizer starts fresh too.
        train = self.cfg["train"]
        self.proxy_optimizer = torch.optim.SGD(
            self.proxy.parameters(), lr=train["lr"] * float(self.cfg["strategy"]["proxy_lr_scale"]),
            momentum=train["momentum"])
        self.proxy.train()

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        warm = self.steps < self.warmup_steps
        # Step 1-3: the private model, with the proxy's output as a fixed target.
        with torch.set_grad_enabled(not warm):
            z = self.model.backbone(x)
        logits = self.model.head(z)
        e_local = self.model.projection(z)
        with torch.no_grad():
            e_proxy = self.proxy(x)
        ce = F.cross_entropy(logits, y)
        alignment = align_loss(e_local, e_proxy, self.align)
        loss = ce + self.lam * alignment
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        metrics = {"train_loss": ce.item(), "align_loss": alignment.item()}
        # Step 4: the proxy, with the private projection as a fixed target.
        if not warm:
            proxy_loss = align_loss(self.proxy(x), e_local.detach(), self.align)
            self.proxy_optimizer.zero_grad()
            proxy_loss.backward()
            self.proxy_optimizer.step()
            metrics["proxy_loss"] = proxy_loss.item()
        return metrics
