"""What every client trainer shares: the private model, its optimizer, persistence, and the
exchange of the entries that the method's parameter filter lets leave the client."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ..data import ClientData, ImageFormat, batches
from ..devices import Placement, cpu_placement
from ..filters import shared_keys
from ..models import build_client_model
from ..optim import LocalSGD
from ..validation import arrays_problem


class SharedStateError(ValueError):
    """The arrays the server sent do not fit this client's shared entries."""


class SharedUpdateDiverged(FloatingPointError):
    """Local training diverged, but only in what is shared (a proxy broken by noise, say):
    everything the client keeps is finite, so it keeps this round's learning; the round sends no
    update, and the server's next arrays replace the shared entries."""


class Trainer:
    """One client's private state (model, optimizer, step count) and how it learns.

    `exchange` is the module whose state_dict the method's parameter filter (the `share` it is
    registered with, pfedes/methods/) reads: its filtered entries are what the client receives
    and sends, everything else stays here.
    Subclasses override `train_step` (and, where the method needs it, `exchange` or `evaluate`).

    The modules live on `placement.device` (the CPU unless the client's `train.device` says
    otherwise, pfedes/devices.py); `batches` moves each batch there, and training steps and
    evaluation forwards run under `placement.autocast()`. What crosses the wire does not depend
    on it: `shared_state` returns CPU tensors, and `load_shared` copies the server's CPU arrays
    onto the device. They are built on the CPU from the seed, then moved, so a model starts
    from the same weights on every device.
    A method whose shared entries form a whole model sets `has_global_model` (on the class, or
    on the instance where its settings decide it); the server then reports that model's accuracy
    on the unified test set (`global_predict`).
    """

    has_global_model = False
    shares_feature_extractor = False  # methods that share one set `shared_features` (proxy diagnostics)
    requires_same_architecture = False  # homogeneous-model methods set this

    def __init__(self, cfg: dict[str, Any], arch: str, num_classes: int, seed: int,
                 placement: Placement | None = None, image: ImageFormat | None = None) -> None:
        """`image`: the input's channels, size and statistics (ClientData.image_format; the
        default is 3 x 32 x 32, unstandardised)."""
        from ..methods import method_of

        self.cfg = cfg
        self.arch = arch
        self.placement = placement or cpu_placement()
        self.device = self.placement.device
        self.image = image or ImageFormat()
        method = method_of(cfg)
        # The method's typed settings (methods/), checked: a subclass reads self.settings.KEY.
        self.settings = method.settings_from(cfg)
        # The models are initialised from `seed` on a fork of torch's global generator, which
        # this constructor leaves as it found it (training draws from explicit generators).
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model_cfg = cfg["model"]
            self.model = build_client_model(arch, num_classes, model_cfg["proxy_dim"],
                                            model_cfg["feature_dim"], self.image.channels, self.image.size)
            self.exchange = nn.ModuleDict(dict(self.model.named_children()))
            # Method modules that never leave the client (a personal model): persisted with the
            # trainer, switched between train and eval mode with the model, never filtered.
            self.private = nn.ModuleDict()
            # Names of private modules that hold a copy of the server's arrays (replaced each round).
            self.server_copies: set[str] = set()
            self.build_extra_modules()
        for module in (self.model, self.exchange, self.private):
            module.to(self.device)
        self.share_spec = list(method.share)
        self._shared_keys = shared_keys(self.exchange, self.share_spec)
        self.optimizer = self.local_sgd(self.trainable_parameters())
        self.steps = 0
        # What compressed uploads left unsent (pfedes/compression.py, error feedback): private.
        self.upload_residual: dict[str, torch.Tensor] = {}

    def local_sgd(self, params) -> torch.optim.SGD:
        """The local optimiser every method uses (train.lr, momentum, weight_decay): torch's SGD,
        without its torch._dynamo import (pfedes/optim.py)."""
        train = self.cfg["train"]
        return LocalSGD(params, lr=train["lr"], momentum=train["momentum"], weight_decay=train["weight_decay"])

    # -- hooks for subclasses -------------------------------------------------------------
    def build_extra_modules(self) -> None:
        """Add method-specific modules to `self.exchange` (e.g. the proxy extractor)."""

    def trainable_parameters(self):
        return self.model.parameters()

    def begin_round(self) -> None:
        """Called after the shared entries are loaded and before the first local step."""

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        """One local step on one batch; returns per-batch metrics (averaged over the round)."""
        logits = self.model(x)
        loss = F.cross_entropy(logits, y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {"train_loss": loss.item()}

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of the personal model (F_k + H_k)."""
        return self.model(x)

    # -- shared entries ------------------------------------------------------------------
    @property
    def shared_keys(self) -> list[str]:
        return self._shared_keys

    def shared_state(self) -> dict[str, torch.Tensor]:
        """Copies of the shared entries, on the CPU whatever the device."""
        state = self.exchange.state_dict()
        return {k: state[k].detach().to("cpu", copy=True) for k in self._shared_keys}

    def load_shared(self, arrays: dict[str, torch.Tensor]) -> None:
        """Load the server's shared entries (copied onto this trainer's device); a mismatch
        raises SharedStateError naming it."""
        own = self.exchange.state_dict()
        problem = arrays_problem(arrays, {k: own[k] for k in self._shared_keys}, dtypes=False, finite=False)
        if problem:
            raise SharedStateError(f"server arrays do not fit this client's shared entries: {problem}")
        self.exchange.load_state_dict(arrays, strict=False)

    # -- one round -------------------------------------------------------------------------
    def batches(self, x_uint8: torch.Tensor, labels: torch.Tensor, batch_size: int,
                generator: torch.Generator | None, train: bool, do_augment: bool):
        """data.batches (drawn and augmented on the CPU, so the same batches on every device),
        each moved to this trainer's device."""
        for x, y in batches(x_uint8, labels, batch_size, generator, train=train, do_augment=do_augment,
                            fmt=self.image):
            yield x.to(self.device), y.to(self.device)

    def fit(self, data: ClientData, generator: torch.Generator) -> dict[str, float]:
        self.model.train()
        self.private.train()
        self.begin_round()
        metrics = self.train_epochs(data, generator, int(self.cfg["train"]["local_epochs"]))
        if not all(math.isfinite(v) for v in metrics.values()):
            if self.private_state_is_finite():
                raise SharedUpdateDiverged(f"local training diverged in the shared entries only (the private "
                                           f"state is finite and kept): {metrics}")
            raise FloatingPointError(f"local training diverged: {metrics}")
        return metrics

    def private_state_is_finite(self) -> bool:
        """Whether every floating-point tensor the client keeps (its state but the shared entries
        and the copies of them in `server_copies`, which the server's next arrays replace; and the
        optimizer's state) is finite."""
        shared = set(self._shared_keys)
        kept = [v for k, v in self.exchange.state_dict().items() if k not in shared]
        kept += [v for k, v in self.private.state_dict().items() if k.split(".", 1)[0] not in self.server_copies]
        kept += [v for state in self.optimizer.state_dict()["state"].values() for v in state.values()
                 if isinstance(v, torch.Tensor)]
        return all(bool(t.isfinite().all()) for t in kept if t.is_floating_point())

    def train_epochs(self, data: ClientData, generator: torch.Generator, epochs: int) -> dict[str, float]:
        """`epochs` passes over the local train split, one `train_step` per batch; the mean
        of each per-batch metric. A method with training phases overrides this."""
        train = self.cfg["train"]
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        for _ in range(epochs):
            for x, y in self.batches(data.x_train, data.y_train, train["batch_size"], generator,
                                     train=True, do_augment=train["augment"]):
                with self.placement.autocast():
                    step_metrics = self.train_step(x, y)
                for key, value in step_metrics.items():
                    sums[key] = sums.get(key, 0.0) + value
                    counts[key] = counts.get(key, 0) + 1
                self.steps += 1
        return {k: v / counts[k] for k, v in sums.items()}

    def evaluate(self, data: ClientData) -> dict[str, float]:
        """Personalized accuracy: the personal model on the client's own held-out split."""
        return self.accuracy(data.x_test, data.y_test, self.predict)

    def shared_features(self, x: torch.Tensor) -> torch.Tensor:
        """Features of the shared extractor (methods with `shares_feature_extractor`)."""
        raise NotImplementedError

    def global_predict(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of the global model after `load_shared` (methods with `has_global_model`)."""
        return self.predict(x)

    @torch.no_grad()
    def accuracy(self, x_uint8: torch.Tensor, labels: torch.Tensor, predict) -> dict[str, float]:
        self.exchange.eval()
        self.private.eval()
        correct, loss_sum = 0, 0.0
        for x, y in self.batches(x_uint8, labels, 256, None, train=False, do_augment=False):
            with self.placement.autocast():
                logits = predict(x).float()
            loss_sum += F.cross_entropy(logits, y, reduction="sum").item()
            correct += (logits.argmax(1) == y).sum().item()
        n = max(len(labels), 1)
        return {"accuracy": correct / n, "loss": loss_sum / n}

    # -- persistence -----------------------------------------------------------------------
    # state_dict holds tensors on the trainer's device; StateStore loads a saved state onto the
    # CPU (map_location), and load_state_dict copies it onto this trainer's device (the
    # optimizer's state follows its parameters), so a state saved on a GPU host resumes on a
    # CPU and the other way round.
    def state_dict(self) -> dict[str, Any]:
        return {"arch": self.arch, "exchange": self.exchange.state_dict(),
                "private": self.private.state_dict(),
                "optimizer": self.optimizer.state_dict(), "steps": self.steps,
                "upload_residual": self.upload_residual}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("arch") != self.arch:
            raise ValueError(f"saved client state is for architecture {state.get('arch')!r}, "
                             f"not {self.arch!r}")
        self.exchange.load_state_dict(state["exchange"])
        if "private" in state:
            self.private.load_state_dict(state["private"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps = int(state["steps"])
        self.upload_residual = dict(state.get("upload_residual", {}))

    # -- server side -----------------------------------------------------------------------
    @classmethod
    def initial_shared(cls, cfg: dict[str, Any], arch: str, num_classes: int,
                       image: ImageFormat | None = None) -> dict[str, torch.Tensor]:
        """The initial shared entries the server starts from (seeded by `cfg['seed']`)."""
        return cls(cfg, arch, num_classes, seed=int(cfg["seed"]), image=image).shared_state()
