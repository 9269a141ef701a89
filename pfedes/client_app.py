"""The ClientApp: one device. It builds its own architecture from its device profile, loads its
local data, restores its private state, runs the method's trainer, and replies with only the
entries that the method's parameter filter shares. With compression.downlink, the arrays a
message carries are decoded first (`decode_downlink`), before anything reads them. With
privacy.mode=local, the train reply's update is clipped and noised on the device by Flower's
LocalDpMod (pfedes/privacy.py `local_dp_mod`, chosen per message from the run's settings), before
it leaves the ClientApp.

Node config (deployment: `flower-supernode --node-config "..."`; simulation sets the last two):
  device         phone | gateway | gpu-host, or an architecture name (default: clients.devices
                 cycled over partition-id)
  data-path      a data path as data.path takes it: a directory of Parquet files or an image
                 folder, or a hub dataset name (default: the experiment's data.path); it may hold
                 some of the run's classes only: the models are built for the run's (the server
                 sends them), its labels matched to them (data.align_classes)
  state-dir      where the private state is saved (default: <out_dir>/client_state)
  partition-id   this node's partition when several nodes share one dataset
  num-partitions number of such partitions (default: num_clients; 1 = use the whole dataset)

The torch device it trains on is its profile's train.device (train.by_device.<profile>.device),
resolved on this node at each message (pfedes/devices.py).
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from logging import ERROR
from pathlib import Path
from typing import Any

import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from flwr.common.logger import log

from . import tracing
from .client_round import build_trainer, evaluate_round, load_node_data, train_round
from .client_state import StateStore
from .compression import Codec, EncodingError
from .config import for_device
from .data import DataError, align_classes
from .devices import DeviceError, placement_for
from .image_data import is_hub_name
from .models import resolve_architecture
from .privacy import local_dp_mod
from .strategies.base import CLASSES_KEY, EVAL_IN_TRAIN_KEY, METRICS_KEY
from .trainers.base import SharedUpdateDiverged

app = ClientApp()
STORE = StateStore()
VERSION_KEY = "pfedes"
NODE_KEYS = ("device", "data-path", "state-dir", "partition-id", "num-partitions")


class NodeConfigError(ValueError):
    """A node-config key with a value this client cannot use; the message names the key."""


@dataclass(frozen=True)
class Node:
    device: str
    arch: str
    data_path: str
    state_file: Path
    partition_id: int
    num_partitions: int


@functools.lru_cache(maxsize=4)
def parse_experiment(text: str) -> dict[str, Any]:
    return json.loads(text)


def resolve_node(cfg: dict[str, Any], node_config: dict[str, Any], node_id: int) -> Node:
    unknown = sorted(set(node_config) - set(NODE_KEYS))
    if unknown:
        raise NodeConfigError(f"node-config key(s) {unknown} are unknown: expected some of {list(NODE_KEYS)}")
    try:
        partition_id = int(node_config.get("partition-id", 0))
        num_partitions = int(node_config.get("num-partitions", cfg["num_clients"]))
    except (TypeError, ValueError):
        raise NodeConfigError("node-config 'partition-id' and 'num-partitions' must be integers") from None
    if "partition-id" not in node_config and "device" in node_config:
        num_partitions = int(node_config.get("num-partitions", 1))  # a device with its own data
    devices = cfg["clients"]["devices"]
    device = str(node_config.get("device", devices[partition_id % len(devices)]))
    try:
        arch = resolve_architecture(device, cfg["model"]["profiles"])
    except ValueError as exc:
        raise NodeConfigError(f"node-config 'device': {exc}") from None
    data_path = str(node_config.get("data-path", cfg["data"]["path"]))
    if "data-path" in node_config and data_path != "embedded" and not Path(data_path).is_dir() \
            and not is_hub_name(data_path):
        raise NodeConfigError(f"node-config 'data-path' '{data_path}' is not a directory nor a hub dataset name")
    state_dir = Path(str(node_config.get("state-dir", cfg["client_state_dir"]))).expanduser()
    if "partition-id" not in node_config and "state-dir" not in node_config:
        partition_id_for_file = node_id
    else:
        partition_id_for_file = partition_id
    return Node(device, arch, data_path, state_dir / f"{cfg['strategy']['name']}-p{partition_id_for_file}.pt",
                partition_id, num_partitions)


@functools.lru_cache(maxsize=1)
def set_threads(threads: int) -> None:
    torch.set_num_threads(max(1, threads))


def threads_for(cfg: dict[str, Any]) -> int:
    if cfg["train"]["torch_threads"]:
        return int(cfg["train"]["torch_threads"])
    per_client = int(cfg["simulation"]["num_cpus_per_client"])
    return per_client if per_client > 0 else (os.cpu_count() or 1)


def _setup(msg: Message, context: Context):
    config = msg.content.config_records.get("config", ConfigRecord())
    if "experiment" not in config:
        raise ValueError("the message carries no 'experiment' config: is the ServerApp a pfedes one?")
    cfg = parse_experiment(str(config["experiment"]))
    node = resolve_node(cfg, dict(context.node_config), context.node_id)
    cfg = for_device(cfg, node.device)  # its profile's own training settings (train.by_device)
    placement = placement_for(cfg, node.device)  # train.device on this node: DeviceError if it has none
    set_threads(threads_for(cfg))
    data = load_node_data(cfg, node.data_path, node.partition_id, node.num_partitions, node.state_file.parent)
    if CLASSES_KEY in config:  # the run's classes, for a device whose own data holds only some of them
        run_classes = parse_experiment(str(config[CLASSES_KEY]))
        data = align_classes(data, int(run_classes["num_classes"]), run_classes["class_names"],
                             f"node-config 'data-path' '{node.data_path}'")
    known = context.state.config_records.get(VERSION_KEY)
    version = int(known["version"]) if known is not None else None
    trainer, version = STORE.get(node.state_file, version,
                                 lambda: build_trainer(cfg, node.arch, data.num_classes, node.partition_id,
                                                       placement=placement, image=data.image_format),
                                 cfg.get("run_token", ""))
    return cfg, node, data, trainer, version


def _setup_errors_as_replies(handler):
    """A node-config, device or data error ends this ClientApp with one log line that names the
    key, and with an error reply: the server drops it with a warning and the round goes on
    without it (a node without the device its train.device names fails, not the server)."""

    @functools.wraps(handler)
    def wrapper(msg: Message, context: Context) -> Message:
        try:
            return handler(msg, context)
        except (NodeConfigError, DeviceError, DataError) as exc:
            log(ERROR, "pfedes ClientApp: %s", exc)
            return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=str(exc)), reply_to=msg)

    return wrapper


def _trace(message_type: str, node: Node, server_round: int, entered: tuple[float, float],
           set_up: tuple[float, float]) -> None:
    """One line of the opt-in timing trace (pfedes.tracing): process start, handler entry,
    set-up done (data, model, private state), work done, by the wall clock and by the process's
    CPU time (`tracing.clock`). Nothing is read or written when off."""
    if not tracing.enabled():
        return
    done = tracing.clock()
    tracing.record("clientapp", message=message_type, device=node.device, round=server_round,
                   process_start=tracing.process_start_time(), entered=entered[0], set_up=set_up[0], done=done[0],
                   cpu={"entered": entered[1], "set_up": set_up[1], "done": done[1]})


def _info(node: Node) -> ConfigRecord:
    return ConfigRecord({"device": node.device, "arch": node.arch, "partition-id": node.partition_id})


def encode_upload(codec: Codec, trainer, shared: dict[str, torch.Tensor], received: ArrayRecord) -> ArrayRecord:
    """The train reply's arrays: the shared entries, encoded by the run's compression (the
    residual of error feedback stays with the trainer's private state)."""
    if not codec.active:
        return ArrayRecord(shared)
    residual = {k: v.numpy() for k, v in trainer.upload_residual.items()}
    encoded, residual = codec.encode({k: v.detach().cpu().numpy() for k, v in shared.items()},
                                     {k: a.numpy() for k, a in received.items()}, residual)
    trainer.upload_residual = {k: torch.from_numpy(v) for k, v in residual.items()}
    return ArrayRecord({k: Array(v) for k, v in encoded.items()})


def decode_downlink(msg: Message, context: Context, call_next) -> Message:
    """The first mod of every handler: the message's arrays decoded from compression.downlink's
    quantization, so that the model loads, a compressed upload measures its change from, and
    LocalDpMod clips against what the server meant to send. A malformed encoding raises
    EncodingError naming the entry and what is wrong."""
    config = msg.content.config_records.get("config")
    if config is None or "experiment" not in config:
        return call_next(msg, context)
    downlink = Codec.downlink_from_cfg(parse_experiment(str(config["experiment"])))
    if not downlink.active:
        return call_next(msg, context)
    for name, record in list(msg.content.array_records.items()):
        try:
            decoded = downlink.decode({k: a.numpy() for k, a in record.items()}, {})
        except EncodingError as exc:
            raise EncodingError(f"the server's '{name}' does not follow compression.downlink="
                                f"{downlink.quantize}: {exc}") from None
        msg.content[name] = ArrayRecord({k: Array(v) for k, v in decoded.items()})
    return call_next(msg, context)


@app.train(mods=[decode_downlink, local_dp_mod])  # then Flower's LocalDpMod when privacy.mode is local
@_setup_errors_as_replies
def train(msg: Message, context: Context) -> Message:
    entered = tracing.clock()
    cfg, node, data, trainer, version = _setup(msg, context)
    set_up = tracing.clock()
    arrays = msg.content.array_records.get("arrays", ArrayRecord())
    server_round = int(msg.content["config"].get("server-round", 0))
    try:
        shared, metrics = train_round(trainer, arrays.to_torch_state_dict(), data, cfg,
                                      node.partition_id, server_round)
    except SharedUpdateDiverged:  # what the client keeps is sound: save it; no update is sent
        version += 1
        STORE.save(node.state_file, trainer, version, cfg.get("run_token", ""))
        context.state[VERSION_KEY] = ConfigRecord({"version": version})
        raise
    except Exception:  # the live trainer is half-updated (diverged, say): the next message reloads
        STORE.forget(node.state_file, cfg.get("run_token", ""))
        raise
    reply_arrays = encode_upload(Codec.from_cfg(cfg), trainer, shared, arrays)
    version += 1
    STORE.save(node.state_file, trainer, version, cfg.get("run_token", ""))
    context.state[VERSION_KEY] = ConfigRecord({"version": version})
    content = RecordDict({"arrays": reply_arrays, METRICS_KEY: MetricRecord(metrics),
                          "info": _info(node)})
    if cfg.get("evaluate_in_train"):  # the personal model as the evaluate round would see it
        content[EVAL_IN_TRAIN_KEY] = MetricRecord(evaluate_round(trainer, {}, data))
    _trace("train", node, server_round, entered, set_up)
    return Message(content=content, reply_to=msg)


@app.evaluate(mods=[decode_downlink])
@_setup_errors_as_replies
def evaluate(msg: Message, context: Context) -> Message:
    entered = tracing.clock()
    _, node, data, trainer, _ = _setup(msg, context)
    set_up = tracing.clock()
    arrays = msg.content.array_records.get("arrays", ArrayRecord())
    metrics = evaluate_round(trainer, arrays.to_torch_state_dict(), data)
    content = RecordDict({METRICS_KEY: MetricRecord(metrics), "info": _info(node)})
    _trace("evaluate", node, int(msg.content["config"].get("server-round", 0)), entered, set_up)
    return Message(content=content, reply_to=msg)
