"""Leakage report: a gradient-inversion attack, in the server's position, on what each method
shares (issue 16, section 3).

The server knows the shared state it sent (the global state before the round) and the payload a
client sends back after the round; it subtracts the two and looks for images whose gradient
matches that update (Geiping et al., "Inverting Gradients": cosine distance between the dummy
images' gradient and the observed update, plus a total-variation prior, signed Adam, a few
restarts, the restart with the lowest matching cost kept). The payload comes from the project's
own trainer and `train_round`, so what is attacked is exactly what the method's parameter filter
lets leave the client:

- FedAvg: the whole model (one architecture, the phone's CNN3);
- pFedES (default preset): the shared proxy E_proxy and its classifier C; the proxy branch's
  loss is the logit-adjusted CE(C(E_proxy(x)) + log pi_k, y), with pi_k the client's private
  label distribution: the attacker does not know it and optimises it as 10 free numbers;
- pFedES with local DP: the same payload, its update clipped and given Gaussian noise on the
  client with Flower's `compute_clip_model_update` and `add_gaussian_noise_inplace` (what
  `flwr.clientapp.mod.LocalDpMod` does), at each `--noise` multiplier;
- pFedES paper form: not attacked; the row says why (`PAPER_FORM_REASON`).

Cases:

- `one_step` (the attacker's best case): a fresh client (empty momentum buffer) takes one local
  SGD step on a batch of B images, no augmentation; then the update is exactly -lr (g + wd w),
  and the attacker recovers g from it with the optimiser's lr and weight decay. Labels: for a
  batch of 1 they are inferred from the classifier bias's gradient (iDLG), else given.
- `local_epoch` (realistic): the method's real round (`train_round`: its epochs, its extra
  passes, augmentation, momentum) on the client's whole train split; the update is attacked as
  one pseudo-gradient of `--epoch-dummies` images with labels drawn in the client's label
  proportions (given to the attacker), and each reconstruction is scored against its best
  matching training image (or that image flipped).

Scores: PSNR and SSIM (torchmetrics) of each reconstruction against its true image, matched
over the batch by the Hungarian method on PSNR; `psnr_flat` / `ssim_flat` score a flat image of
the mean colour the same way (what knowing nothing gives).

    python benchmarks/leakage.py                # the full report (32 attacks of 1,000 iterations)
    python benchmarks/leakage.py --quick        # a smoke run on the embedded sample

Writes benchmarks/results/leakage/leakage.json, leakage.csv and reconstructions.png.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, default_data_path, experiment, print_table  # noqa: E402

OUT = RESULTS / "leakage"
PAPER_FORM_REASON = (
    "The paper form shares only the generator G (443 parameters), and G's update is the gradient "
    "of CE(F_k(G(x)), y) with F_k the client's private model: the map from images to that update "
    "runs through F_k, which never leaves the client, so the server cannot compute the dummy "
    "images' gradient to match it. (Even given F_k, 443 numbers summed over a batch constrain "
    "far less than the 3,072 pixels of one image.)")


# -- the methods: what a client sends, and the attacker's model of the client's loss -------------
@dataclass
class Method:
    name: str
    overrides: list[str]
    # the loss whose gradient w.r.t. the shared parameters the client's step follows, as the
    # attacker writes it: (exchange modules, x, y, free attacker variables) -> scalar
    loss: Callable[[nn.ModuleDict, torch.Tensor, torch.Tensor, list[torch.Tensor]], torch.Tensor]
    bias_key: str  # the shared classifier's bias (iDLG's label inference)
    free_variables: Callable[[int], list[torch.Tensor]] = lambda num_classes: []
    noise_multiplier: float = 0.0  # > 0: local DP on the update (clipping + Gaussian noise)


def _fedavg_loss(net, x, y, free):
    return F.cross_entropy(net["head"](net["backbone"](x)), y)


def _pfedes_loss(net, x, y, free):
    proxy = net["proxy"]
    return F.cross_entropy(proxy.classify(proxy(x)) + free[0], y)  # free[0]: the unknown log pi_k


def _free_log_prior(num_classes: int) -> list[torch.Tensor]:
    return [torch.zeros(num_classes, requires_grad=True)]


def methods(noise: list[float]) -> list[Method]:
    base = [Method("fedavg", ["strategy=fedavg"], _fedavg_loss, "head.bias"),
            Method("pfedes", ["strategy=pfedes"], _pfedes_loss, "proxy.classifier.bias", _free_log_prior)]
    dp = [Method(f"pfedes+ldp{sigma:g}", ["strategy=pfedes"], _pfedes_loss, "proxy.classifier.bias",
                 _free_log_prior, noise_multiplier=sigma) for sigma in noise]
    return base + dp


def make_cfg(method: Method, data_path: str, seed: int, num_clients: int, samples: int,
             extra: list[str] = ()) -> dict:
    """The method's experiment on one architecture (the phone), as `pfedes-sim` would compose it."""
    return experiment([*method.overrides, "clients.devices=[phone]", *extra], **{
        "data.path": data_path, "seed": seed, "num_clients": num_clients,
        "data.samples_per_client": samples})


# -- the client's side: the payload the project's trainer really sends ------------------------
def image_of(cfg: dict):
    """The input format (channels, size, normalisation statistics) of the run's data."""
    from pfedes.data import DataSource, image_format

    return image_format(DataSource.from_cfg(cfg["data"]))


def make_trainer(cfg: dict, partition_id: int = 0):
    """The client's trainer, as the ClientApp builds it; past pFedES's warm-up (a client in a
    later round: during its first `warmup_steps` steps the proxy is not trained at all)."""
    from pfedes.client_round import build_trainer
    from pfedes.models import resolve_architecture

    arch = resolve_architecture(cfg["clients"]["devices"][0], cfg["model"]["profiles"])
    trainer = build_trainer(cfg, arch, 10, partition_id, image=image_of(cfg))
    trainer.steps = int(cfg["strategy"].get("warmup_steps", 0))
    return trainer


def global_state(cfg: dict) -> dict[str, torch.Tensor]:
    """What the server sends in round 1 (the ServerApp's `initial_shared`)."""
    from pfedes.methods import method_of
    from pfedes.models import resolve_architecture

    arch = resolve_architecture(cfg["clients"]["devices"][0], cfg["model"]["profiles"])
    return method_of(cfg).trainer.initial_shared(cfg, arch, 10, image_of(cfg))


def client_payload(cfg: dict, sent: dict[str, torch.Tensor], data, partition_id: int = 0,
                   server_round: int = 1):
    """(the arrays the client sends, its trainer) after one round of `train_round` on `data`."""
    from pfedes.client_round import train_round

    trainer = make_trainer(cfg, partition_id)
    payload, _ = train_round(trainer, {k: v.clone() for k, v in sent.items()}, data, cfg,
                             partition_id, server_round)
    return payload, trainer


def one_step_payload(cfg: dict, sent: dict[str, torch.Tensor], data, partition_id: int = 0):
    """(the arrays the client sends, its trainer) after one `train_step` on all of `data`, no
    augmentation: what `train_round` does with one batch (tests/test_leakage.py checks they
    agree), but also for a batch of one image, which the round refuses because pFedES's
    diagnostics (a standard deviation over the batch) are NaN for it."""
    import warnings

    from pfedes.data import to_input

    trainer = make_trainer(cfg, partition_id)
    trainer.load_shared({k: v.clone() for k, v in sent.items()})
    trainer.model.train()
    trainer.private.train()
    trainer.begin_round()
    if "label_prior" in trainer.private:  # pFedES fits log pi_k at the start of the round
        trainer.private["label_prior"].fit_to(data.y_train)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"std\(\): degrees of freedom")
        trainer.train_step(to_input(data.x_train, trainer.image), data.y_train)
    trainer.steps += 1
    return trainer.shared_state(), trainer


def shared_optimizer(trainer, keys: list[str]) -> torch.optim.Optimizer:
    """The optimiser that stepped the shared parameters (its lr and weight decay turn the
    one-step update back into the gradient)."""
    named = dict(trainer.exchange.named_parameters())
    wanted = {id(named[k]) for k in keys if k in named}
    for value in vars(trainer).values():
        if isinstance(value, torch.optim.Optimizer):
            held = {id(p) for group in value.param_groups for p in group["params"]}
            if wanted <= held:
                return value
    raise ValueError("no single optimiser steps all the shared parameters")


def local_dp(payload: dict[str, torch.Tensor], sent: dict[str, torch.Tensor], clipping_norm: float,
             noise_multiplier: float, seed: int) -> dict[str, torch.Tensor]:
    """The payload after local DP as Flower's LocalDpMod applies it: the update clipped to
    `clipping_norm` (compute_clip_model_update), then Gaussian noise of standard deviation
    noise_multiplier * clipping_norm on every entry (add_gaussian_noise_inplace)."""
    from flwr.supercore.differential_privacy import add_gaussian_noise_inplace, compute_clip_model_update

    keys = list(payload)
    arrays = [payload[k].numpy().astype(np.float64) for k in keys]
    compute_clip_model_update(arrays, [sent[k].numpy().astype(np.float64) for k in keys], clipping_norm)
    np.random.seed(seed)  # Flower draws from numpy's global generator; seeded here to repeat the benchmark
    add_gaussian_noise_inplace(arrays, noise_multiplier * clipping_norm)
    return {k: torch.from_numpy(a).to(payload[k].dtype) for k, a in zip(keys, arrays)}


def localdp_epsilon(noise_multiplier: float, delta: float = 1e-5) -> float:
    """The per-release epsilon LocalDpMod would be configured with for this noise (its formula
    std = sensitivity * sqrt(2 ln(1.25 / delta)) / epsilon, sensitivity = the clipping norm)."""
    return math.sqrt(2 * math.log(1.25 / delta)) / noise_multiplier


def update_norm(payload, sent) -> float:
    return math.sqrt(sum(float(((payload[k] - sent[k]).double() ** 2).sum()) for k in payload))


# -- the server's side: the attack -------------------------------------------------------------
class Attacker:
    """The server's copy of the shared network at the global state, and the client's loss."""

    def __init__(self, cfg: dict, method: Method, sent: dict[str, torch.Tensor]) -> None:
        from pfedes.methods import method_of
        from pfedes.models import resolve_architecture

        arch = resolve_architecture(cfg["clients"]["devices"][0], cfg["model"]["profiles"])
        # a trainer of the method only for its shared modules: the private ones are never used
        shell = method_of(cfg).trainer(cfg, arch, 10, seed=987_654, image=image_of(cfg))
        shell.load_shared(sent)
        self.net = shell.exchange.train()
        named = dict(self.net.named_parameters())
        self.keys = [k for k in shell.shared_keys if k in named]  # buffers carry no gradient
        self.params = [named[k] for k in self.keys]
        self.method = method
        from pfedes.models.proxy import InputNorm

        # a network that standardises each image sees no per-image brightness or contrast
        self.scale_invariant = any(isinstance(m, InputNorm) for m in self.net.modules())

    def gradient(self, x, y, free, create_graph=False) -> list[torch.Tensor]:
        loss = self.method.loss(self.net, x, y, free)
        return list(torch.autograd.grad(loss, self.params, create_graph=create_graph))

    def target(self, payload, sent, optimizer: torch.optim.Optimizer | None) -> list[torch.Tensor]:
        """The observed pseudo-gradient. With `optimizer` (one step from an empty momentum
        buffer) exactly the gradient: -(update) / lr - weight_decay * w; else -(update)."""
        out = []
        for k in self.keys:
            delta = (payload[k] - sent[k]).float()
            if optimizer is None:
                out.append(-delta)
            else:
                group = optimizer.param_groups[0]
                out.append(-delta / group["lr"] - group["weight_decay"] * sent[k].float())
        return out


def infer_label(attacker: Attacker, target: list[torch.Tensor]) -> int:
    """iDLG: with one image, the classifier bias's gradient p - onehot(y) is negative only at y."""
    return int(target[attacker.keys.index(attacker.method.bias_key)].argmin())


def total_variation(x: torch.Tensor) -> torch.Tensor:
    return (x[:, :, 1:, :] - x[:, :, :-1, :]).abs().mean() + (x[:, :, :, 1:] - x[:, :, :, :-1]).abs().mean()


def cosine_cost(grads: list[torch.Tensor], target: list[torch.Tensor]) -> torch.Tensor:
    dot = sum((g * t).sum() for g, t in zip(grads, target))
    gn = torch.sqrt(sum((g * g).sum() for g in grads))
    tn = torch.sqrt(sum((t * t).sum() for t in target))
    return 1 - dot / (gn * tn + 1e-12)


def _stats(fmt) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.tensor(fmt.mean).view(1, -1, 1, 1), torch.tensor(fmt.std).view(1, -1, 1, 1))


def _box(fmt) -> tuple[torch.Tensor, torch.Tensor]:
    """Pixels 0 and 1 in the model's input space."""
    mean, std = _stats(fmt)
    return (0 - mean) / std, (1 - mean) / std


def invert(grad_fn: Callable, target: list[torch.Tensor], labels: torch.Tensor, shape: tuple[int, ...],
           free_init: Callable[[], list[torch.Tensor]] = list, iterations: int = 500, restarts: int = 2,
           tv: float = 1e-2, lr: float = 0.1, seed: int = 0, renorm: tuple[float, float] | None = None,
           box: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, float]:
    """Dummy images (in the model's input space) whose gradient `grad_fn(x, y, free)` matches
    `target` (cosine distance + tv * total variation), by signed Adam with the step size cut
    tenfold at 3/8, 5/8 and 7/8 of the iterations; the best of `restarts` by matching cost.
    `renorm` (mean, std): each image is put back to that per-image mean and std after every
    step (for a network that standardises its input, so the images' scale stays pinned);
    `box` (low, high): the range of valid inputs."""
    best, best_cost = None, math.inf
    generator = torch.Generator().manual_seed(seed)
    for _ in range(restarts):
        x = torch.randn(shape, generator=generator).requires_grad_(True)
        free = free_init()
        optimizer = torch.optim.Adam([x, *free], lr=lr)
        milestones = [int(iterations * f) for f in (3 / 8, 5 / 8, 7 / 8)]
        schedule = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones, gamma=0.1)
        for _ in range(iterations):
            match = cosine_cost(grad_fn(x, labels, free, create_graph=True), target)
            cost = match + tv * total_variation(x)
            grads = torch.autograd.grad(cost, [x, *free])
            for var, g in zip([x, *free], grads):
                var.grad = g.sign() if var is x else g
            optimizer.step()
            schedule.step()
            with torch.no_grad():
                _project(x, renorm, box)
        final = float(cosine_cost(grad_fn(x.detach(), labels, free, create_graph=False), target))
        if final < best_cost:
            best, best_cost = x.detach().clone(), final
    return best, best_cost


def _project(x: torch.Tensor, renorm, box) -> None:
    if renorm is not None:
        flat = x.view(len(x), -1)
        flat.sub_(flat.mean(1, keepdim=True)).div_(flat.std(1, keepdim=True) + 1e-6)
        flat.mul_(renorm[1]).add_(renorm[0])
    if box is not None:
        x.copy_(torch.maximum(torch.minimum(x, box[1]), box[0]))


# -- scoring ---------------------------------------------------------------------------------
def to_pixels(x: torch.Tensor, fmt) -> torch.Tensor:
    """Model input -> [0, 1] pixels (inverse of pfedes.data.to_input)."""
    mean, std = _stats(fmt)
    return (x * std + mean).clamp(0, 1)


def score(recon: torch.Tensor, truth: torch.Tensor, flips: bool = False) -> dict[str, Any]:
    """PSNR and SSIM (torchmetrics, data range 1) of each reconstruction against the true image it
    is matched to; matching by the Hungarian method on PSNR, each true image used at most once
    (with `flips`, an image may be matched as itself or mirrored, whichever is closer)."""
    from scipy.optimize import linear_sum_assignment
    from torchmetrics.functional.image import peak_signal_noise_ratio, structural_similarity_index_measure

    recon, truth = recon.float(), truth.float()
    views = [truth, truth.flip(3)] if flips else [truth]
    psnr = torch.stack([torch.stack([
        peak_signal_noise_ratio(r.expand_as(v), v, data_range=1.0, reduction="none", dim=(1, 2, 3))
        for r in recon]) for v in views])  # views x recon x truth
    best_psnr, view = psnr.max(0)
    rows, cols = linear_sum_assignment(-best_psnr.nan_to_num(posinf=1e3).numpy())  # identical: inf
    matched = torch.stack([views[int(view[r, c])][c] for r, c in zip(rows, cols)])
    ssim = structural_similarity_index_measure(recon[rows], matched, data_range=1.0, reduction="none")
    return {"psnr": best_psnr[rows, cols], "ssim": ssim, "order": torch.as_tensor(rows),
            "truth_index": torch.as_tensor(cols), "matched": matched}


def flat_images(like: torch.Tensor, colour: torch.Tensor) -> torch.Tensor:
    return colour.view(1, 3, 1, 1).expand_as(like).clone()


# -- one row ---------------------------------------------------------------------------------
def input_stats(data_path: str) -> tuple[torch.Tensor, float, float]:
    """Public statistics of the data set (its test split): the mean colour in pixels, and the
    mean per-image mean and standard deviation in the model's input space."""
    from pfedes.data import image_format, load_unified_test, to_input

    x, _ = load_unified_test(data_path, 500)
    pixels = x.float() / 255
    inputs = to_input(x, image_format(data_path)).view(len(x), -1)
    return pixels.mean((0, 2, 3)), float(inputs.mean(1).mean()), float(inputs.std(1).mean())


def one_step_batch(data, batch: int, seed: int):
    """B distinct training images of the client (seeded), as `ClientData` for one local step."""
    from pfedes.data import ClientData

    rows = torch.randperm(data.num_train, generator=torch.Generator().manual_seed(seed))[:batch]
    return ClientData(x_train=data.x_train[rows], y_train=data.y_train[rows], x_test=data.x_test,
                      y_test=data.y_test, num_classes=data.num_classes)


def attack_row(method: Method, case: str, batch: int, seed: int, args, stats) -> dict[str, Any]:
    """Train the client, take its payload, (local DP), attack, score."""
    from pfedes.client_round import load_node_data
    from pfedes.data import to_input

    colour, in_mean, in_std = stats
    extra = []
    if case == "one_step":
        # the whole batch in one step (the config wants batch_size >= 2; one image is still one batch)
        extra = [f"train.batch_size={max(batch, 2)}", "train.augment=false", "train.local_epochs=1"]
        if "pfedes" in method.overrides[0]:
            extra.append("strategy.proxy_epochs=0")  # one step: the joint step only
    cfg = make_cfg(method, args.data, seed, args.clients, args.samples, extra)
    data = load_node_data(cfg, args.data, 0, args.clients)
    sent = global_state(cfg)
    if case == "one_step":
        round_data = one_step_batch(data, batch, seed)
        payload, trainer = one_step_payload(cfg, sent, round_data)
    else:
        payload, trainer = client_payload(cfg, sent, data)
    assert list(payload) == trainer.shared_keys
    clean_norm = update_norm(payload, sent)
    row: dict[str, Any] = {"method": method.name, "case": case, "seed": seed,
                           "shared_entries": sum(v.numel() for v in payload.values()),
                           "update_norm": clean_norm}
    if method.noise_multiplier:
        clip = clean_norm if args.clip == "update" else float(args.clip)
        payload = local_dp(payload, sent, clip, method.noise_multiplier, seed)
        noise_norm = method.noise_multiplier * clip * math.sqrt(row["shared_entries"])
        row.update(noise_multiplier=method.noise_multiplier, clipping_norm=clip,
                   localdp_epsilon=localdp_epsilon(method.noise_multiplier),
                   noise_to_update=noise_norm / min(clip, clean_norm))
    attacker = Attacker(cfg, method, sent)
    optimizer = shared_optimizer(trainer, attacker.keys) if case == "one_step" else None
    target = attacker.target(payload, sent, optimizer)
    if case == "one_step":
        truth_x, labels = round_data.x_train, round_data.y_train
        if batch == 1:
            guess = infer_label(attacker, target)
            row["labels"] = f"inferred (iDLG), {'right' if guess == int(labels[0]) else 'wrong'}"
            labels = torch.tensor([guess])
        else:
            row["labels"] = "given"
        dummies = batch
    else:
        truth_x = data.x_train
        counts = torch.bincount(data.y_train, minlength=10).double()
        share = counts / counts.sum() * args.epoch_dummies  # the client's label proportions
        whole = share.floor().long()
        for c in torch.argsort(share - whole, descending=True)[: args.epoch_dummies - int(whole.sum())]:
            whole[c] += 1
        labels = torch.repeat_interleave(torch.arange(10), whole)
        row["labels"] = "drawn in the client's label proportions (given)"
        dummies = args.epoch_dummies
    start = time.perf_counter()
    x, cost = invert(attacker.gradient, target, labels, (dummies, 3, 32, 32),
                     lambda: method.free_variables(10), args.iterations, args.restarts, args.tv,
                     args.attack_lr, seed, (in_mean, in_std) if attacker.scale_invariant else None,
                     _box(image_of(cfg)))
    recon = to_pixels(x, image_of(cfg))
    truth = to_pixels(to_input(truth_x, image_of(cfg)), image_of(cfg))
    flips = case == "local_epoch"
    s = score(recon, truth, flips)
    flat = score(flat_images(recon, colour), truth, flips)
    row.update(batch=batch if case == "one_step" else f"{dummies} of {data.num_train}",
               images=int(len(s["psnr"])), matching_cost=cost,
               psnr=float(s["psnr"].mean()), ssim=float(s["ssim"].mean()),
               psnr_flat=float(flat["psnr"].mean()), ssim_flat=float(flat["ssim"].mean()),
               psnr_each=[round(float(v), 2) for v in s["psnr"]],
               ssim_each=[round(float(v), 4) for v in s["ssim"]],
               attack_seconds=time.perf_counter() - start,
               local_steps=trainer.steps - int(cfg["strategy"].get("warmup_steps", 0)))
    row["_images"] = (recon[s["order"]], s["matched"])
    return row


# -- the report ------------------------------------------------------------------------------
def summarise(rows: list[dict]) -> list[dict]:
    """One line per method x case x batch (means over seeds and images)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["case"], str(r["batch"])), []).append(r)
    table = []
    for (method, case, batch), rs in groups.items():
        psnr = [v for r in rs for v in r["psnr_each"]]
        ssim = [v for r in rs for v in r["ssim_each"]]
        line = {"method": method, "case": case, "batch": batch, "seeds": len(rs), "images": len(psnr),
                "psnr": float(np.mean(psnr)), "psnr_std": float(np.std(psnr)),
                "ssim": float(np.mean(ssim)), "ssim_std": float(np.std(ssim)),
                "psnr_flat": float(np.mean([r["psnr_flat"] for r in rs])),
                "ssim_flat": float(np.mean([r["ssim_flat"] for r in rs])),
                "shared_entries": rs[0]["shared_entries"], "labels": rs[0]["labels"]}
        for key in ("noise_multiplier", "localdp_epsilon", "noise_to_update"):
            if key in rs[0]:
                line[key] = float(np.mean([r[key] for r in rs]))
        table.append(line)
    return table


def grid(rows: list[dict], path: Path, title: str) -> None:
    """True against reconstructed images, seed 0: per case and batch, a row of true images and a
    row per method (one_step); reconstructions over their best matches (local_epoch)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seed0 = [r for r in rows if r["seed"] == min(x["seed"] for x in rows)]
    lines: list[tuple[str, torch.Tensor]] = []
    for case in ("one_step", "local_epoch"):
        for batch in sorted({r["batch"] for r in seed0 if r["case"] == case}, key=str, reverse=True):
            these = [r for r in seed0 if r["case"] == case and r["batch"] == batch]
            if case == "one_step":
                # true images in a fixed order; each method's reconstructions put in that order
                truth = these[0]["_images"][1]
                lines.append((f"one step, B={batch}: true", truth))
                for r in these:
                    recon, matched = r["_images"]
                    order = [int(torch.argmin(((matched - t) ** 2).flatten(1).sum(1))) for t in truth]
                    lines.append((f"{r['method']} ({r['psnr']:.1f} dB)", recon[order]))
            else:
                for r in these:
                    recon, matched = r["_images"]
                    lines.append((f"epoch: {r['method']} ({r['psnr']:.1f} dB)", recon))
                    lines.append(("  best-matching training image", matched))
    columns = max(len(images) for _, images in lines)
    fig, axes = plt.subplots(len(lines), columns + 1, figsize=(1.0 * columns + 3.2, 1.0 * len(lines) + 0.6),
                             gridspec_kw={"width_ratios": [3.2] + [1] * columns}, squeeze=False)
    for i, (label, images) in enumerate(lines):
        axes[i][0].text(1.0, 0.5, label, ha="right", va="center", fontsize=8)
        for j in range(columns + 1):
            axes[i][j].axis("off")
        for j, image in enumerate(images):
            axes[i][j + 1].imshow(image.permute(1, 2, 0).numpy(), interpolation="nearest")
    fig.suptitle("\n".join(textwrap.wrap(title, 60 + 12 * columns)), fontsize=7)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / len(lines)))  # room for the title
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=None, help="data path (default: the shared CIFAR-10 copy, else embedded)")
    parser.add_argument("--clients", type=int, default=10, help="partitions; the client attacked is partition 0")
    parser.add_argument("--samples", type=int, default=300, help="data.samples_per_client (80%% train)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 8], help="one_step batch sizes")
    parser.add_argument("--epoch-dummies", type=int, default=8, help="local_epoch: images reconstructed")
    parser.add_argument("--noise", type=float, nargs="*", default=[0.01, 0.1],
                        help="local-DP noise multipliers (std = multiplier x clipping norm)")
    parser.add_argument("--clip", default="update",
                        help="local-DP clipping norm; 'update': the update's own norm (clipping that "
                             "binds without shrinking it: the attacker's best case at a given noise)")
    parser.add_argument("--methods", nargs="+", default=None, help="subset of method names")
    parser.add_argument("--cases", nargs="+", default=["one_step", "local_epoch"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--restarts", type=int, default=1,
                        help="random starts per attack, the lowest matching cost kept "
                             "(the default budget goes to a second seed instead)")
    parser.add_argument("--tv", type=float, default=1e-2, help="weight of the total-variation prior")
    parser.add_argument("--attack-lr", type=float, default=0.1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: embedded sample, 3 clients, 2 methods, few iterations")
    args = parser.parse_args(argv)
    if args.quick:
        args.data = args.data or "embedded"
        args.clients, args.samples, args.iterations, args.restarts = 3, 120, 30, 1
        args.batches, args.noise, args.epoch_dummies, args.seeds = [1, 2], [0.1], 2, [0]
    args.data = args.data or default_data_path()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    chosen = methods(args.noise)
    if args.methods:
        chosen = [m for m in chosen if m.name in args.methods]
    stats = input_stats(args.data)
    plan = [(m, case, b, s) for s in args.seeds for case in args.cases for m in chosen
            for b in (args.batches if case == "one_step" else [args.epoch_dummies])]
    rows = []
    start = time.perf_counter()
    command = " ".join(["python", "benchmarks/leakage.py", *(sys.argv[1:] if argv is None else argv)])
    for i, (method, case, batch, seed) in enumerate(plan, 1):
        row = attack_row(method, case, batch, seed, args, stats)
        rows.append(row)
        result = write_outputs(out, command, args, rows, start, complete=i == len(plan))
        print(f"[{i}/{len(plan)} {time.perf_counter() - start:5.0f}s] {method.name:16s} {case:11s} "
              f"B={row['batch']!s:9s} seed {seed}: PSNR {row['psnr']:5.2f} dB (flat {row['psnr_flat']:5.2f}) "
              f"SSIM {row['ssim']:.3f} (flat {row['ssim_flat']:.3f})  cost {row['matching_cost']:.3f}  "
              f"{row['attack_seconds']:.0f}s", flush=True)
    print_table(result["table"], ["method", "case", "batch", "seeds", "images", "psnr", "ssim", "psnr_flat",
                                  "ssim_flat", "shared_entries", "noise_to_update"])
    print(f"wrote {out / 'leakage.json'}, {out / 'leakage.csv'}, {out / 'reconstructions.png'}")
    return result


def write_outputs(out: Path, command: str, args, rows: list[dict], start: float, complete: bool) -> dict:
    """The JSON, CSV and PNG of the rows so far (after every row: a run stopped early keeps
    what it measured; `complete` says whether it is the whole plan)."""
    table = summarise(rows)
    settings = {k: v for k, v in vars(args).items() if k not in ("out",)}
    result = {"command": command, "complete": complete, "settings": settings, "table": table,
              "not_attacked": [{"method": "pfedes_paper", "reason": PAPER_FORM_REASON}],
              "rows": [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows],
              "seconds": time.perf_counter() - start}
    (out / "leakage.json").write_text(json.dumps(
        {"benchmark": "leakage", "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
         "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, **result}, indent=2))
    with open(out / "leakage.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in table for k in r)))
        writer.writeheader()
        writer.writerows(table)
    grid(rows, out / "reconstructions.png",
         f"Gradient inversion of one client's payload in the server's position (seed {min(args.seeds)}; "
         f"PSNR: mean over the row). {command}")
    return result


if __name__ == "__main__":
    main()
