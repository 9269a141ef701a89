"""The ServerApp: compose the experiment from conf/ (Flower's run config overrides it), start
the method's strategy with its initial shared entries, log every round, and checkpoint the
shared state after every round so that `resume=true` continues where a stopped server left off."""

from __future__ import annotations

import hashlib
import json
import uuid
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from .client_state import atomic_torch_save, state_digest
from .config import ConfigError, client_settings, experiment_config, overrides_from_run_config, with_later_settings
from .data import (DataError, DataSource, check_data, class_names_of, classes_in_no_partition, image_format,
                   load_unified_test, num_classes_of)
from .grid import PromptGrid
from .methods import method_of
from .flower_log import quiet_flower
from .models import resolve_architecture
from .privacy import Privacy
from .robust import Robustness
from .strategies.base import CLASSES_KEY
from .proxy_monitor import ProxyMonitor
from .recording import RunRecorder

app = ServerApp()
CHECKPOINT = "server_checkpoint.pt"
# Keys that may differ between a run and its resumption.
RESUME_FREE_KEYS = ("num_rounds", "resume", "run_token", "logging")


@app.main()
def main(grid: Grid, context: Context) -> None:
    """`flwr run`'s ServerApp: the experiment from Flower's run config, then `serve`."""
    try:
        cfg = experiment_config(overrides_from_run_config(dict(context.run_config)))
    except ConfigError as exc:
        log(ERROR, "pfedes ServerApp: %s", exc)
        raise
    serve(grid, cfg)


def serve(grid: Grid, cfg: dict[str, Any]) -> dict[str, Any]:
    """What every pfedes ServerApp does, `flwr run`'s and pfedes-sim's: check the method's
    settings, run the experiment on the grid (replies collected promptly, Flower's notices kept
    off the console), return its summary. A bad setting is one ERROR line, then raised (Flower
    marks the run failed)."""
    try:
        check_method_settings(cfg)
        if not Path(cfg["out_dir"]).expanduser().is_absolute():  # the SuperLink's directory, not the user's
            log(WARNING, "[pfedes] out_dir '%s' is relative: results go to %s (the ServerApp's working "
                "directory); pass an absolute out_dir to choose", cfg["out_dir"], prepare(cfg)["out_dir"])
        with quiet_flower():
            return run_experiment(PromptGrid(grid), cfg)
    except (ConfigError, DataError) as exc:
        log(ERROR, "pfedes ServerApp: %s", exc)
        raise


def prepare(cfg: dict[str, Any]) -> dict[str, Any]:
    """Fix paths that clients read (absolute out_dir, client_state_dir) into the config."""
    cfg = dict(cfg)
    out_dir = Path(cfg["out_dir"]).expanduser().resolve()
    cfg["out_dir"] = str(out_dir)
    cfg.setdefault("client_state_dir", str(out_dir / "client_state"))
    return cfg


def check_method_settings(cfg: dict[str, Any]) -> None:
    """Check the method's typed settings (pfedes/methods/: a negative weight, an unknown fusion
    raise ConfigError naming the key), then build its trainer once for each architecture in
    clients.devices, as a client would, for what only a built model can tell (a LoRA base
    checkpoint that does not fit), before any client starts. The data settings that need the
    data's class count are checked here too, and the data itself (`data.check_data`)."""
    method = method_of(cfg)
    method.settings_from(cfg)  # config.validate checked them already, unless cfg was built otherwise
    trainer_cls = method.trainer
    if not method.strategy.averages_arrays:
        name = cfg["strategy"]["name"]
        if Privacy.from_cfg(cfg).enabled:
            raise ConfigError(f"privacy: strategy '{name}' shares per-class means, not arrays it averages; "
                              "the DP mechanism does not apply to it (privacy.noise_multiplier=0)")
        if Robustness.from_cfg(cfg).weighting != "samples":
            raise ConfigError(f"aggregation.weighting: strategy '{name}' averages per class by sample counts; "
                              "only aggregation.weighting=samples applies to it")
    if Robustness.from_cfg(cfg).weighting == "quality" and not trainer_cls.shares_feature_extractor:
        raise ConfigError(f"aggregation.weighting=quality: strategy '{cfg['strategy']['name']}' shares no feature "
                          "extractor to measure feature quality in (pfedes and fml do)")
    source = DataSource.from_cfg(cfg["data"])
    check_data(source, int(cfg["num_clients"]))
    num_classes, image = num_classes_of(source), image_format(source)
    per_client = int(cfg["data"]["classes_per_client"])
    if cfg["data"]["partition"] == "pathological" and not 1 <= per_client <= num_classes:
        raise ConfigError(f"data.classes_per_client must be in [1, {num_classes}] (the data's classes), "
                          f"got {per_client}")
    for device in dict.fromkeys(cfg["clients"]["devices"]):
        try:
            trainer_cls(cfg, resolve_architecture(device, cfg["model"]["profiles"]), num_classes, seed=0,
                        image=image)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


def warn_of_classes_in_no_client(cfg: dict[str, Any]) -> None:
    """One warning when the pathological partition leaves classes out of every client's data."""
    data = cfg["data"]
    if data["partition"] != "pathological" or int(cfg["num_clients"]) == 1:
        return
    missing = classes_in_no_partition(DataSource.from_cfg(data), data["partition"], int(cfg["num_clients"]),
                                      int(cfg["seed"]), int(data["classes_per_client"]), float(data["alpha"]))
    if missing:
        log(WARNING, "[pfedes] classes %s are in no client's data (%d clients x data.classes_per_client %d): "
            "the personal accuracies cover the other classes only; more clients or classes per client "
            "cover them", missing, int(cfg["num_clients"]), int(data["classes_per_client"]))


def config_fingerprint(cfg: dict[str, Any]) -> str:
    fixed = {k: v for k, v in cfg.items() if k not in RESUME_FREE_KEYS}
    return hashlib.sha256(json.dumps(fixed, sort_keys=True).encode()).hexdigest()[:16]


def save_checkpoint(path: Path, server_round: int, arrays: ArrayRecord, strategy, rounds: list,
                    cfg: dict[str, Any]) -> None:
    atomic_torch_save({"round": server_round,
                       "arrays": {k: v.numpy() for k, v in arrays.items()},
                       "strategy": strategy.state_dict(), "rounds": rounds,
                       "fingerprint": config_fingerprint(cfg), "run_token": cfg["run_token"],
                       "config": cfg, "common": strategy.common_state_dict()}, path)


def checkpoint_config(checkpoint: dict[str, Any], path: Path, cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The configuration that wrote a checkpoint: stored in it, or (a checkpoint from before it
    was) the summary.json beside it, when its fingerprint proves it the same; else None."""
    if "config" in checkpoint:
        return checkpoint["config"]
    try:
        saved = json.loads((path.parent / "summary.json").read_text())["config"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    saved = dict(saved, **{k: cfg[k] for k in ("out_dir", "client_state_dir") if k in cfg})  # shown relative there
    return saved if config_fingerprint(saved) == checkpoint["fingerprint"] else None


def load_checkpoint(path: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint at `path` if the run that wrote it had cfg's configuration (but for
    RESUME_FREE_KEYS, and for settings added to conf/ since, at their defaults)."""
    if not path.is_file():
        raise ConfigError(f"resume=true but there is no checkpoint at '{path}'")
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    saved = checkpoint_config(checkpoint, path, cfg) if checkpoint["fingerprint"] != config_fingerprint(cfg) else cfg
    if saved is not None and "config" not in checkpoint:  # upgraded in place: the summary goes when it resumes
        checkpoint["config"] = saved
        atomic_torch_save(checkpoint, path)
    if saved is None or config_fingerprint(with_later_settings(saved, cfg)) != config_fingerprint(cfg):
        raise ConfigError(f"resume=true but '{path}' was written by a run with another configuration "
                          f"(only {', '.join(RESUME_FREE_KEYS)} may change)")
    return checkpoint


def run_experiment(grid: Grid, cfg: dict[str, Any]) -> dict[str, Any]:
    cfg = prepare(cfg)
    out_dir = Path(cfg["out_dir"])
    method = method_of(cfg)
    strategy_cls, trainer_cls = method.strategy, method.trainer
    source = DataSource.from_cfg(cfg["data"])
    num_classes, image = num_classes_of(source), image_format(source)
    warn_of_classes_in_no_client(cfg)
    archs = [resolve_architecture(d, cfg["model"]["profiles"]) for d in cfg["clients"]["devices"]]
    if trainer_cls.requires_same_architecture and len(set(archs)) > 1:
        raise ConfigError(f"strategy '{cfg['strategy']['name']}' needs one architecture on every client, "
                          f"but clients.devices maps to {sorted(set(archs))}: set e.g. clients.devices=[phone]")
    initial = trainer_cls.initial_shared(cfg, archs[0], num_classes, image)
    strategy = strategy_cls(cfg)
    strategy.num_classes = num_classes
    checkpoint_path = out_dir / CHECKPOINT
    done, previous_rounds = 0, None
    # Clients keep their private state only within one run: a fresh run gets a new token, a
    # resumed one the checkpoint's, so a restarted client restores and a new run starts clean.
    cfg["run_token"] = uuid.uuid4().hex
    if cfg.get("resume"):
        checkpoint = load_checkpoint(checkpoint_path, cfg)
        cfg["run_token"] = checkpoint["run_token"]
        done, previous_rounds = int(checkpoint["round"]), checkpoint["rounds"]
        initial = {k: torch.from_numpy(np.asarray(v)) for k, v in checkpoint["arrays"].items()}
        strategy.load_state_dict(checkpoint["strategy"])
        strategy.load_common_state_dict(checkpoint.get("common", {}))  # privacy spent, selection's memory
        strategy.round_offset = done
        log(INFO, "[pfedes] resuming after round %d from %s (shared digest %s)", done, checkpoint_path,
            state_digest(initial))
    recorder = RunRecorder(out_dir, cfg, resume_rounds=previous_rounds)
    global_model = trainer_cls(cfg, archs[0], num_classes, seed=int(cfg["seed"]), image=image)
    if not global_model.has_global_model:
        global_model = None
    monitor = (ProxyMonitor(cfg, trainer_cls(cfg, archs[0], num_classes, seed=int(cfg["seed"]), image=image),
                            num_classes)
               if trainer_cls.shares_feature_extractor else None)
    if monitor is not None and previous_rounds:  # a resumed run keeps round 1 as the reference
        monitor.first_std = previous_rounds[0].get("proxy_std")

    def after_round(server_round: int, arrays: ArrayRecord):
        """Flower's server-side evaluation hook: global accuracy (if any), run log, checkpoint."""
        if server_round == 0:
            return None
        server_round += done
        extra = {}
        if global_model is not None and len(arrays):
            x, y = load_unified_test(source, int(cfg["data"]["unified_test_samples"]))
            global_model.load_shared(arrays.to_torch_state_dict())
            extra["global_acc"] = global_model.accuracy(x, y, global_model.global_predict)["accuracy"]
        if monitor is not None and len(arrays):
            extra.update(monitor(server_round, arrays.to_torch_state_dict()))
        recorder.record(server_round, strategy.pop_round_stats(), extra)
        save_checkpoint(checkpoint_path, server_round, arrays, strategy, recorder.rounds, cfg)
        return MetricRecord({k: float(v) for k, v in extra.items()}) if extra else None

    remaining = int(cfg["num_rounds"]) - done
    # the run's classes travel too: a device with its own data (node config data-path) holding only
    # some of them builds its models for all of them, its labels matched by name (data.align_classes)
    exp = ConfigRecord({"experiment": json.dumps(client_settings(cfg), sort_keys=True),
                        CLASSES_KEY: json.dumps({"num_classes": num_classes, "class_names": class_names_of(source)})})
    if remaining > 0:
        strategy.start(grid=grid, initial_arrays=ArrayRecord({k: Array(np.asarray(v)) for k, v in initial.items()}),
                       num_rounds=remaining, train_config=exp, evaluate_config=ConfigRecord(dict(exp)),
                       evaluate_fn=after_round)
    model_params = {}
    for device in sorted(set(cfg["clients"]["devices"])):
        arch = resolve_architecture(device, cfg["model"]["profiles"])
        model = trainer_cls(cfg, arch, num_classes, seed=0, image=image)
        model_params[device] = sum(p.numel() for p in model.model.parameters())
    return recorder.finish({
        "proxy_params": int(sum(np.asarray(v).size for v in initial.values())),
        "shared_keys": list(initial),
        "model_params_by_device": model_params,
    })
