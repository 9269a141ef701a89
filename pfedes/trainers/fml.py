"""FML (federated mutual learning) client update: a private model and a small shared model
("meme") teach each other on the client's data; only the meme is averaged.

The meme is the proxy-sized network E_proxy + a linear classifier (the same traffic budget as
pFedES). Per batch, with p = softmax(private logits), q = softmax(meme logits):
  private: alpha * CE(private, y) + (1 - alpha) * KL(q.detach() || p)
  meme:    beta  * CE(meme, y)    + (1 - beta)  * KL(p.detach() || q)
Both step on every batch with the experiment's lr. The meme sits in the exchange as `proxy`, so
the `proxy-only` filter shares it. The personal model (evaluation) is the private one; the
meme, a whole model, is the global model (its accuracy on the unified test set is reported).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ..models import ProxyExtractor
from .base import Trainer


def mutual_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """KL(softmax(teacher) || softmax(student)), the teacher held fixed."""
    return F.kl_div(F.log_softmax(student_logits, dim=1), F.softmax(teacher_logits.detach(), dim=1),
                    reduction="batchmean")


class FMLTrainer(Trainer):
    has_global_model = True
    shares_feature_extractor = True  # the meme's E_proxy: the server's proxy diagnostics apply

    def build_extra_modules(self) -> None:
        d = int(self.cfg["model"]["proxy_dim"])
        self.meme = nn.Sequential(ProxyExtractor(d, in_channels=self.image.channels), nn.Linear(d, self.model.head.out_features))
        self.exchange["proxy"] = self.meme
        self.alpha, self.beta = self.settings.alpha, self.settings.beta  # in [0, 1]: methods/fml.py

    def begin_round(self) -> None:
        # The meme is replaced by the server's each round: its optimizer starts fresh too.
        self.meme_optimizer = self.local_sgd(self.meme.parameters())
        self.meme.train()

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        private_logits = self.model(x)
        meme_logits = self.meme(x)
        private_ce = F.cross_entropy(private_logits, y)
        meme_ce = F.cross_entropy(meme_logits, y)
        private_loss = self.alpha * private_ce + (1 - self.alpha) * mutual_kl(private_logits, meme_logits)
        meme_loss = self.beta * meme_ce + (1 - self.beta) * mutual_kl(meme_logits, private_logits)
        self.optimizer.zero_grad()
        self.meme_optimizer.zero_grad()
        (private_loss + meme_loss).backward()  # the detached teachers keep the two graphs apart
        self.optimizer.step()
        self.meme_optimizer.step()
        return {"train_loss": private_ce.item(), "meme_loss": meme_ce.item()}

    def global_predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.meme(x)

    def shared_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.meme[0](x)
