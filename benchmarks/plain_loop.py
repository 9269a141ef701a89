"""The same federated work as a Flower run, in one process with no Flower: every round each
client runs `client_round.train_round` and the server applies the same aggregation
(`robust.weighted_average` + `apply_momentum`). Used to measure Flower's overhead and to
check that the Flower path computes exactly the same thing."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from pfedes.client_round import build_trainer, evaluate_round, load_node_data, train_round
from pfedes.config import for_device
from pfedes.data import DataSource, image_format, num_classes_of
from pfedes.devices import check_simulation_devices
from pfedes.methods import method_of
from pfedes.models import resolve_architecture
from pfedes.robust import weighted_average
from pfedes.strategies.base import PersonalizedStrategy
from pfedes.strategies.momentum import ServerMomentum, apply_momentum


def run_plain(cfg: dict[str, Any], threads: int | None = None, progress: bool = False) -> dict[str, Any]:
    """Run cfg's experiment with every client sampled every round; returns the final shared
    arrays and one record per round (acc_mean, acc_worst, seconds). `progress`: print one line
    per round."""
    method = method_of(cfg)
    strategy_cls = method.strategy
    if strategy_cls.aggregate_arrays not in (PersonalizedStrategy.aggregate_arrays, ServerMomentum.aggregate_arrays):
        raise ValueError(f"the plain loop runs methods with the base aggregation, not {strategy_cls.__name__}")
    if float(cfg["fraction_train"]) != 1.0:
        raise ValueError("the plain loop samples every client: set fraction_train=1.0")
    if threads:
        torch.set_num_threads(threads)
    t_start = time.perf_counter()
    trainer_cls = method.trainer
    source = DataSource.from_cfg(cfg["data"])
    num_classes, image = num_classes_of(source), image_format(source)
    devices, profiles = cfg["clients"]["devices"], cfg["model"]["profiles"]
    n = int(cfg["num_clients"])
    arch = [resolve_architecture(devices[p % len(devices)], profiles) for p in range(n)]
    current = {k: v.numpy() for k, v in trainer_cls.initial_shared(cfg, arch[0], num_classes, image).items()}
    beta = getattr(method.settings_from(cfg), "server_momentum", 0.0)
    placements = check_simulation_devices(cfg)  # each profile's device as the simulation would give it
    trainers: dict[int, Any] = {}
    rounds = []
    t_last = time.perf_counter()
    for server_round in range(1, int(cfg["num_rounds"]) + 1):
        sent = {k: torch.from_numpy(v.copy()) for k, v in current.items()}
        replies, weights = [], []
        for p in range(n):
            data = load_node_data(cfg, cfg["data"]["path"], p, n)
            profile = devices[p % len(devices)]
            own = for_device(cfg, profile)  # the profile's train.by_device values
            trainer = trainers.get(p) or trainers.setdefault(
                p, build_trainer(own, arch[p], data.num_classes, p, placement=placements[profile],
                                  image=data.image_format))
            shared, metrics = train_round(trainer, dict(sent), data, own, p, server_round)
            replies.append({k: v.numpy() for k, v in shared.items()})
            weights.append(float(metrics["num-examples"]))
        if current:
            current = apply_momentum(current, weighted_average(replies, weights), beta)
        evaluated = {k: torch.from_numpy(v.copy()) for k, v in current.items()} \
            if strategy_cls.send_arrays_to_evaluate else {}
        evals = [evaluate_round(trainers[p], dict(evaluated), load_node_data(cfg, cfg["data"]["path"], p, n))
                 for p in range(n)]
        accs = [e["accuracy"] for e in evals]
        now = time.perf_counter()
        rounds.append({"round": server_round, "acc_mean": float(np.mean(accs)),
                       "val_acc_mean": float(np.mean([e["val_accuracy"] for e in evals]))
                       if "val_accuracy" in evals[0] else None,
                       "acc_worst": float(np.min(accs)), "seconds": now - t_last,
                       "eval_means": {k: float(np.mean([e[k] for e in evals])) for k in evals[0]
                                      if k != "num-examples"}})
        t_last = now
        if progress:
            r = rounds[-1]
            val = "" if r["val_acc_mean"] is None else f"  val_acc_mean {r['val_acc_mean']:.3f}"
            print(f"[plain] round {server_round}/{cfg['num_rounds']}  acc_mean {r['acc_mean']:.3f}{val}  "
                  f"{r['seconds']:.1f}s", flush=True)
    return {"arrays": current, "rounds": rounds, "seconds_total": time.perf_counter() - t_start}
