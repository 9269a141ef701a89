"""One client's work in one round, without Flower: what the ClientApp runs for each message and
what the plain benchmark loop (benchmarks/plain_loop.py) calls directly, so both do the same work."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .contribution import client_report
from .data import ClientData, DataSource, ImageFormat, load_client_data
from .devices import Placement, placement_for


def load_node_data(cfg: dict[str, Any], data_path: str, partition_id: int, num_partitions: int,
                   cache_dir: Path | None = None) -> ClientData:
    data_cfg = cfg["data"]
    return load_client_data(DataSource.from_cfg(data_cfg, data_path), data_cfg["partition"], num_partitions,
                            partition_id, int(cfg["seed"]), int(data_cfg["classes_per_client"]),
                            float(data_cfg["alpha"]), int(data_cfg["samples_per_client"]),
                            float(data_cfg["test_fraction"]), cache_dir,
                            float(data_cfg.get("val_fraction", 0.0)))


def build_trainer(cfg: dict[str, Any], arch: str, num_classes: int, partition_id: int,
                  *, placement: Placement | None = None, image: ImageFormat | None = None):
    """A fresh trainer for images of `image`'s format (ClientData.image_format); its private
    model's initialisation depends on (seed, partition) only, so every method starts each client
    from the same private model, on any device. `placement`: where it trains (default: cfg's
    train.device resolved on this machine, `devices.placement_for`)."""
    from .methods import method_of

    return method_of(cfg).trainer(cfg, arch, num_classes, seed=int(cfg["seed"]) * 100_003 + partition_id,
                                  placement=placement or placement_for(cfg), image=image)


def train_round(trainer, arrays: dict[str, torch.Tensor], data: ClientData, cfg: dict[str, Any],
                partition_id: int, server_round: int) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """Load the shared entries, train locally, return (entries to send, metrics)."""
    trainer.load_shared(arrays)
    generator = torch.Generator().manual_seed(int(cfg["seed"]) * 1_000_003 + partition_id * 1009
                                              + server_round)
    metrics = trainer.fit(data, generator)
    metrics["num-examples"] = data.num_train
    weighting = (cfg.get("aggregation") or {}).get("weighting")  # what the server weighs this reply by
    if weighting == "val_score":
        metrics["val_score"] = trainer.accuracy(data.x_val, data.y_val, trainer.predict)["accuracy"]
    elif weighting == "quality":
        metrics.update(client_report(trainer, data.x_train, data.y_train, data.num_classes))
    return trainer.shared_state(), metrics


def evaluate_round(trainer, arrays: dict[str, torch.Tensor], data: ClientData) -> dict[str, float]:
    if arrays:
        trainer.load_shared(arrays)
    metrics = trainer.evaluate(data)
    if data.y_val is not None and len(data.y_val):
        metrics["val_accuracy"] = trainer.accuracy(data.x_val, data.y_val, trainer.predict)["accuracy"]
    metrics["num-examples"] = len(data.y_test)
    return metrics
