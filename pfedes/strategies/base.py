"""What every pfedes server strategy shares with FedAvg, plus what FedAvg lacks:

- with `compression.downlink`, the arrays a message carries are quantized, once per round for every
  message carrying them (the server's own arrays stay as they are); compressed replies are
  decoded against what the client decoded, and a reply that trained the sent arrays is moved
  onto the server's own (pfedes/compression.py); then every reply is validated one by
  one (missing or extra keys, shape, dtype, NaN/Inf, weight); a bad reply is dropped with a
  warning naming the node and the reason, and the round goes on;
- a reply whose update norm is an outlier of the round is dropped, and the rest are combined by
  the aggregation rule (pfedes/robust.py; default the weighted average); strategies with server
  momentum compose strategies/momentum.py over it;
- per-round statistics (per-client accuracy by device, bytes sent and received) for the run log.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg
from flwr.serverapp.strategy.strategy_utils import sample_nodes

from ..compression import Codec, EncodingError, onto_server_arrays
from ..config import ConfigError
from ..contribution import report_problem as quality_report_problem
from ..privacy import Privacy, epsilon_after
from ..robust import SCORE_KEY, DirectionStrikes, Robustness, flat_update
from ..selection import ClientHistory, Selection, power_of_choice
from ..validation import arrays_problem

WEIGHT_KEY = "num-examples"
METRICS_KEY = "metrics"  # the MetricRecord of a train or evaluate reply
EVAL_IN_TRAIN_KEY = "evaluation"  # its personal-model figures when evaluate_in_train=true
CLASSES_KEY = "classes"  # in a message's config: the run's class count and names, as JSON


def arrays_nbytes(record: ArrayRecord | None) -> int:
    """Bytes of array payload in an ArrayRecord (what travels, serialised)."""
    return 0 if record is None else sum(len(a.data) for a in record.values())


def reply_problem(msg: Message, expected: dict[str, np.ndarray]) -> str | None:
    """Why a train reply cannot be aggregated, or None if it can."""
    if msg.has_error():
        return f"client error: {msg.error.reason}"
    content = msg.content
    metric_names = set(content.metric_records)
    if len(content.array_records) != 1 or METRICS_KEY not in metric_names \
            or metric_names - {METRICS_KEY, EVAL_IN_TRAIN_KEY}:
        return (f"expected one ArrayRecord and the MetricRecord '{METRICS_KEY}' (and optionally "
                f"'{EVAL_IN_TRAIN_KEY}'), got {len(content.array_records)} ArrayRecord(s) and "
                f"MetricRecord(s) {sorted(metric_names)}")
    metrics = content.metric_records[METRICS_KEY]
    weight = metrics.get(WEIGHT_KEY)
    if not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight <= 0:
        return f"'{WEIGHT_KEY}' is {weight!r}, not a positive number"
    arrays = next(iter(content.array_records.values()))
    return arrays_problem({k: a.numpy() for k, a in arrays.items()}, expected)


def reply_order(msg: Message) -> tuple[int, int]:
    """Sort key: the client's partition id (when it reports one), then its node id."""
    info = msg.content.config_records.get("info")
    partition = int(info["partition-id"]) if info is not None and "partition-id" in info else -1
    return partition, msg.metadata.src_node_id


def reply_label(msg: Message) -> str:
    """The client's partition id, or its node id where it reports none."""
    partition, node = reply_order(msg)
    return str(partition if partition >= 0 else node)


def weighted_metrics(records: list[dict[str, float]], weights: list[float]) -> dict[str, float]:
    """The weighted mean of each scalar metric every record has (lists, such as a label
    distribution, are reports for the server, not figures to average)."""
    keys = {k for k in set.intersection(*(set(r) for r in records)) - {WEIGHT_KEY}
            if all(isinstance(r[k], (int, float)) for r in records)}
    total = float(sum(weights))
    return {k: sum(r[k] * w for r, w in zip(records, weights)) / total for k in sorted(keys)}


class PersonalizedStrategy(FedAvg):
    """FedAvg's sampling and messages; decoded, validated, robust aggregation; round stats.

    Subclasses say what differs: server momentum (composing `momentum.ServerMomentum`), whether
    evaluation needs the shared arrays (`send_arrays_to_evaluate`), and, where a method needs it,
    `aggregate_arrays`.
    """

    send_arrays_to_evaluate = False
    replies_start_from_sent = True  # a reply's arrays are the sent ones trained further (not, e.g., class means)
    averages_arrays = True  # the shared arrays go through `combine` (weighting, robust rules, privacy)
    one_consensus = True  # every reply's update aims at one consensus (aggregation.min_cosine applies)
    num_classes: int | None = None  # the data's classes, set by the ServerApp (checks quality reports)

    def __init__(self, cfg: dict[str, Any]) -> None:
        from ..methods import method_of  # methods/ registers the strategies: imported when used

        # The method's typed settings (checked, ConfigError naming the key): subclasses read them.
        self.settings = method_of(cfg).settings_from(cfg)
        min_available = int(cfg.get("min_available_clients") or cfg["num_clients"])
        fraction_train, fraction_evaluate = float(cfg["fraction_train"]), float(cfg["fraction_evaluate"])
        self.evaluate_in_train = bool(cfg.get("evaluate_in_train", False))
        if self.evaluate_in_train and self.send_arrays_to_evaluate:
            raise ConfigError(f"evaluate_in_train=true: strategy '{cfg['strategy']['name']}' evaluates the "
                              "newly aggregated arrays, which a train reply cannot; keep evaluate_in_train=false")
        # FedAvg sizes a sample from the nodes connected *now*, then waits for min_available:
        # with only one node up at round 1 it would sample one of them. The minimum sample is
        # therefore the fraction of the nodes the round waits for.
        super().__init__(
            fraction_train=fraction_train,
            fraction_evaluate=0.0 if self.evaluate_in_train else fraction_evaluate,  # 0: no evaluate round
            min_train_nodes=max(1, int(fraction_train * min_available)),
            min_evaluate_nodes=max(1, int(fraction_evaluate * min_available)),
            min_available_nodes=min_available,
        )
        if self.evaluate_in_train:
            log(INFO, "[pfedes] evaluate_in_train: each client evaluates its personal model right after "
                "training and sends the figures with its train reply; there is no evaluate round")
        self.cfg = cfg
        self.codec = Codec.from_cfg(cfg)
        self.downlink = Codec.downlink_from_cfg(cfg)
        self.downlink_copies: dict[int, tuple[dict[str, np.ndarray], ArrayRecord, dict[str, np.ndarray]]] = {}
        self.robust = Robustness.from_cfg(cfg)
        self.privacy = Privacy.from_cfg(cfg)
        self.dp_releases: list[int] = []  # replies averaged in each private round (the accountant's input)
        self.selection = Selection.from_cfg(cfg)
        self.history = ClientHistory()
        self.direction_strikes = DirectionStrikes(self.robust.direction_strikes, self.robust.strike_share)
        self.selection_rng = random.Random(int(cfg.get("seed", 0)))
        self.current: dict[str, np.ndarray] = {}
        self.round_offset = 0  # rounds already done before a resumed run
        self.round_stats: dict[str, Any] = {}
        self.reset_round_stats()

    def absolute_round(self, server_round: int) -> int:
        """Flower counts the rounds of this process from 1; a resumed run continues the count."""
        return server_round + self.round_offset

    # -- server-side state that a checkpoint must hold besides the shared arrays ----------
    def common_state_dict(self) -> dict[str, Any]:
        """What every strategy keeps across rounds: the privacy spent, what selection knows, the
        direction check's record of each node."""
        return {"dp_releases": list(self.dp_releases), "history": self.history.state_dict(),
                "selection_rng": self.selection_rng.getstate(), "direction_strikes": self.direction_strikes.state_dict()}

    def load_common_state_dict(self, state: dict[str, Any]) -> None:
        self.dp_releases = list(state.get("dp_releases", []))
        self.history.load_state_dict(state.get("history", {}))
        self.direction_strikes.load_state_dict(state.get("direction_strikes", {}))
        if "selection_rng" in state:
            self.selection_rng.setstate(state["selection_rng"])

    def state_dict(self) -> dict[str, Any]:
        """Extra server state of the method (per-cluster models, a global head, ...)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""

    # -- bookkeeping -----------------------------------------------------------------------
    def reset_round_stats(self) -> None:
        self.round_stats = {"bytes_up": 0, "bytes_down": 0, "clients_asked": 0, "clients_trained": 0,
                            "clients_dropped": 0, "train": {}, "eval": []}

    def pop_round_stats(self) -> dict[str, Any]:
        stats = self.round_stats
        self.reset_round_stats()
        return stats

    # -- training ---------------------------------------------------------------------------
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        server_round = self.absolute_round(server_round)
        self.current = {k: v.numpy() for k, v in arrays.items()}
        self.downlink_copies.clear()  # last round's
        sent = self.downlink_copy(self.current)[0] if self.downlink.active else arrays
        if self.fraction_train >= 1.0 or (self.selection.mode == "uniform" and not self.direction_strikes.quarantined):
            messages = list(super().configure_train(server_round, sent, config, grid))
        else:  # FedAvg's messages, to the nodes our selection picks
            nodes = self.select_nodes(grid)
            config["server-round"] = server_round
            record = RecordDict({self.arrayrecord_key: sent, self.configrecord_key: config})
            messages = list(self._construct_messages(record, nodes, MessageType.TRAIN))
            log(INFO, "configure_train: selected %d nodes by %s", len(nodes), self.selection.mode)
        self.round_stats["bytes_down"] += arrays_nbytes(sent) * len(messages)
        self.round_stats["clients_asked"] = len(messages)
        return messages

    def select_nodes(self, grid: Grid) -> list[int]:
        """The round's nodes under selection.mode (after Flower's wait for enough connected nodes),
        drawn from the nodes not quarantined: their replies would be set aside, so a place in a
        partial sample given to one would be lost (with everyone asked, they still train)."""
        connected = list(grid.get_node_ids())
        count = max(int(len(connected) * self.fraction_train), self.min_train_nodes)
        _, connected = sample_nodes(grid, self.min_available_nodes, count)
        eligible = [n for n in connected if n not in self.direction_strikes.quarantined]
        count = min(count, len(eligible))
        if self.selection.mode == "uniform":
            return self.selection_rng.sample(eligible, count)
        return power_of_choice(eligible, count, self.selection.candidates, self.history, self.selection_rng)

    def sent_to(self, node_id: int) -> dict[str, np.ndarray]:
        """The server's arrays that this round's train message carried to `node_id` (one model for
        all here), before any downlink quantization."""
        return self.current

    def downlink_copy(self, arrays: dict[str, np.ndarray]) -> tuple[ArrayRecord, dict[str, np.ndarray]]:
        """(what a message carrying `arrays` holds under compression.downlink, what its client has
        after decoding it), encoded once per round for every message carrying the same arrays."""
        key = id(arrays)  # the copy holds `arrays`, so the id stays theirs until the next round
        if key not in self.downlink_copies:
            encoded, _ = self.downlink.encode(arrays, {}, {})
            self.downlink_copies[key] = (arrays, ArrayRecord({k: Array(v) for k, v in encoded.items()}),
                                         self.downlink.decode(encoded, {}))
        _, record, received = self.downlink_copies[key]
        return record, received

    def received_by(self, node_id: int) -> dict[str, np.ndarray]:
        """The arrays `node_id` trained from this round: what its client decoded of the message."""
        sent = self.sent_to(node_id)
        return self.downlink_copy(sent)[1] if self.downlink.active else sent

    def decode_reply(self, msg: Message) -> str | None:
        """Replace a reply's arrays by what the client meant to send, on the server's own arrays:
        a compressed upload is decoded against what the client received (a change is measured from
        that); with a quantized downlink, a reply that trained the sent arrays is moved onto the
        server's unquantized ones (`onto_server_arrays`). Why it cannot be decoded, or None."""
        rebase = self.downlink.active and self.replies_start_from_sent
        if not self.codec.active and not rebase:
            return None
        node = msg.metadata.src_node_id
        received = self.received_by(node)
        for name, record in list(msg.content.array_records.items()):
            arrays = {k: a.numpy() for k, a in record.items()}
            if self.codec.active:
                try:
                    arrays = self.codec.decode(arrays, received)
                except EncodingError as exc:
                    return f"bad encoding: {exc}"
            if rebase:
                arrays = onto_server_arrays(arrays, received, self.sent_to(node))
            msg.content[name] = ArrayRecord({k: Array(v) for k, v in arrays.items()})
        return None

    def reply_problem(self, msg: Message) -> str | None:
        """Why a train reply cannot be aggregated (None if it can); methods whose replies are
        not the shared entries override this."""
        return reply_problem(msg, self.current) or self.score_problem(msg)

    def score_problem(self, msg: Message) -> str | None:
        """With val_score or quality weighting: why the reply's reported score is unusable, or None."""
        if self.robust.weighting == "samples" or msg.has_error():
            return None
        if self.robust.weighting == "quality":
            return quality_report_problem(msg.content.metric_records[METRICS_KEY], self.num_classes)
        score = msg.content.metric_records[METRICS_KEY].get(SCORE_KEY)
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
            return f"'{SCORE_KEY}' is {score!r}, not a finite number (aggregation.weighting=val_score)"
        return None

    def accepted_replies(self, server_round: int, replies: Iterable[Message]) -> list[Message]:
        """Count the bytes received, drop bad replies with a warning naming the node and the
        reason, and order the rest by client (so arrival order cannot change the aggregate)."""
        good: list[Message] = []
        for msg in replies:
            problem = None
            if not msg.has_error():
                for record in msg.content.array_records.values():
                    self.round_stats["bytes_up"] += arrays_nbytes(record)
                if self.evaluate_in_train:  # its personal model is fine even if its arrays are not
                    self.record_evaluation(server_round, msg, EVAL_IN_TRAIN_KEY)
                problem = self.decode_reply(msg)
            problem = problem or self.reply_problem(msg)
            if problem:
                self.round_stats["clients_dropped"] += 1
                log(WARNING, "round %d: dropped the reply of node %d: %s", server_round,
                    msg.metadata.src_node_id, problem)
                continue
            good.append(msg)
        good = self.without_anomalies(server_round, good)
        for msg in good:  # what selection remembers of a node (its loss is clipped there)
            info = msg.content.config_records.get("info", ConfigRecord())
            self.history.remember(msg.metadata.src_node_id, msg.content.metric_records[METRICS_KEY].get("train_loss"),
                                  info.get("device"))
        good.sort(key=reply_order)
        self.round_stats["clients_trained"] = len(good)
        if not good:
            log(WARNING, "round %d: no usable train reply; the shared state is unchanged", server_round)
        return good

    def without_anomalies(self, server_round: int, replies: list[Message]) -> list[Message]:
        """Drop the replies whose update norm is an outlier of the round (aggregation.norm_threshold),
        then those whose update points away from the others' median (aggregation.min_cosine,
        direction_spread)."""
        if self.privacy.central:  # which replies count must not depend on them beyond the clipping
            return replies
        updates = [flat_update({k: a.numpy() for k, a in next(iter(m.content.array_records.values())).items()},
                               self.sent_to(m.metadata.src_node_id)) for m in replies]
        norms = [float(np.linalg.norm(u)) for u in updates]
        outliers, median = self.robust.norm_outliers(norms)
        for i in outliers:
            log(WARNING, "round %d: dropped the reply of node %d: update norm %.4g is above %g x the round's "
                "median %.4g (aggregation.norm_threshold)", server_round, replies[i].metadata.src_node_id,
                norms[i], self.robust.norm_threshold, median)
        kept = [i for i in range(len(replies)) if i not in set(outliers)]
        quarantined = [i for i in kept if replies[i].metadata.src_node_id in self.direction_strikes.quarantined]
        outliers += quarantined
        kept = [i for i in kept if i not in set(quarantined)]
        if self.robust.checks_direction and self.replies_start_from_sent and self.one_consensus:
            away, cosines, floor = self.robust.direction_outliers([updates[i] for i in kept])
            finite = [c for c in cosines if math.isfinite(c)]
            if finite:
                self.round_stats["update_cosine_min"] = min(finite)
                self.round_stats["update_cosines"] = {reply_label(replies[i]): round(c, 4)
                                                      for i, c in zip(kept, cosines) if math.isfinite(c)}
                self.round_stats["update_cosine_floor"] = floor
            for j in away:
                log(WARNING, "round %d: dropped the reply of node %d: its update's cosine with the round's "
                    "median update is %.3f, below %.3f (aggregation.min_cosine, direction_spread)", server_round,
                    replies[kept[j]].metadata.src_node_id, cosines[j], floor)
            outliers += [kept[j] for j in away]
            for j, (cosine, struck) in enumerate(zip(cosines, self.robust.strikes(cosines, away))):
                node = replies[kept[j]].metadata.src_node_id
                if math.isfinite(cosine) and self.direction_strikes.record(node, struck):
                    log(WARNING, "round %d: node %d is quarantined for the rest of the run: the direction "
                        "check counted %d of its %d rounds against it (aggregation.direction_strikes, "
                        "strike_spread)", server_round,
                        node, self.direction_strikes.strikes[node], self.direction_strikes.checked[node])
        self.round_stats["clients_dropped"] += len(outliers)
        return [m for i, m in enumerate(replies) if i not in set(outliers)]

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        server_round = self.absolute_round(server_round)
        replies = list(replies)
        good = self.accepted_replies(server_round, replies)
        if self.privacy.local:  # every client asked to train released a noisy reply, used or not
            self.account_release(max(1, len(replies)))
        if not good:
            return None, None
        metrics = [dict(m.content.metric_records[METRICS_KEY]) for m in good]
        samples = [float(m[WEIGHT_KEY]) for m in metrics]
        self.round_stats["train"] = weighted_metrics(metrics, samples)
        weights = self.robust.reply_weights(metrics, samples)
        arrays = [{k: a.numpy() for k, a in next(iter(m.content.array_records.values())).items()}
                  for m in good]
        new = self.aggregate_arrays(server_round, good, arrays, weights)
        if self.privacy.central and new:
            self.account_release(len(good))
        return (ArrayRecord({k: Array(v) for k, v in new.items()}),
                MetricRecord(self.round_stats["train"]))

    def account_release(self, size: int) -> None:
        """One more Gaussian release (of `size` replies) for the accountant, and the epsilon spent
        so far in the round's record. Central: the noisy mean, client-level. Local: each client's
        noisy reply; one release per round bounds the client that takes part in every round."""
        self.dp_releases.append(min(size, int(self.cfg["num_clients"])))
        self.round_stats["server"] = {**self.round_stats.get("server", {}), "dp_epsilon": epsilon_after(
            self.privacy.noise_multiplier, self.dp_releases, int(self.cfg["num_clients"]), self.privacy.delta)}

    def aggregate_arrays(self, server_round: int, replies: list[Message],
                         arrays: list[dict[str, np.ndarray]], weights: list[float]) -> dict[str, np.ndarray]:
        """The accepted replies combined by the aggregation rule (default: the weighted average);
        a strategy with server momentum composes `momentum.ServerMomentum` over it."""
        if not self.current:
            return {}
        return self.combine(replies, arrays, weights)

    def combine(self, replies: list[Message], arrays: list[dict[str, np.ndarray]],
                weights: list[float]) -> dict[str, np.ndarray]:
        """The aggregation rule over these replies' arrays (two-tier when aggregation.groups is set)."""
        if self.privacy.central:  # clipped updates, equal weights, then the mechanism's noise
            clipped = [self.privacy.clip(a, self.sent_to(m.metadata.src_node_id)) for m, a in zip(replies, arrays)]
            largest = max(self.privacy.clip_norm_for(a) for a in arrays)  # the sensitivity: the largest C_i
            return self.privacy.add_noise(self.robust.combine(clipped, [1.0] * len(clipped)), len(clipped), largest)
        groups = None
        if self.robust.groups != "none":
            infos = [m.content.config_records.get("info", ConfigRecord()) for m in replies]
            groups = [str(info.get(self.robust.groups, "?")) for info in infos]
        return self.robust.combine(arrays, weights, groups)

    # -- evaluation -------------------------------------------------------------------------
    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        server_round = self.absolute_round(server_round)
        sent = arrays if self.send_arrays_to_evaluate else ArrayRecord()
        if self.downlink.active and self.send_arrays_to_evaluate:
            sent = self.downlink_copy({k: v.numpy() for k, v in arrays.items()})[0]
        messages = list(super().configure_evaluate(server_round, sent, config, grid))
        self.round_stats["bytes_down"] += arrays_nbytes(sent) * len(messages)
        return messages

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        server_round = self.absolute_round(server_round)
        if not self.evaluate_in_train:  # else the train replies brought the figures already
            self.round_stats["eval"] = []
        for msg in replies:
            if msg.has_error():
                log(WARNING, "round %d: evaluation failed on node %d: %s", server_round,
                    msg.metadata.src_node_id, msg.error.reason)
                continue
            self.record_evaluation(server_round, msg, METRICS_KEY)
        results = self.round_stats["eval"]
        results.sort(key=lambda r: (r["partition"], r["node"]))  # figures independent of arrival order
        if not results:
            return None
        accs = [r["accuracy"] for r in results]
        return MetricRecord({"acc_mean": float(np.mean(accs)), "acc_worst": float(np.min(accs))})

    def record_evaluation(self, server_round: int, msg: Message, record: str) -> None:
        """Add one client's personal-model figures (MetricRecord `record` of its reply) to the round."""
        metrics = msg.content.metric_records.get(record)
        info = msg.content.config_records.get("info", ConfigRecord())
        if metrics is None or "accuracy" not in metrics:
            log(WARNING, "round %d: node %d sent no accuracy", server_round, msg.metadata.src_node_id)
            return
        self.round_stats["eval"].append({"node": msg.metadata.src_node_id,
                                         "partition": int(info.get("partition-id", -1)),
                                         "device": str(info.get("device", "?")),
                                         "accuracy": float(metrics["accuracy"]),
                                         "loss": float(metrics.get("loss", float("nan"))),
                                         "val_accuracy": float(metrics.get("val_accuracy", float("nan"))),
                                         "num-examples": int(metrics.get(WEIGHT_KEY, 0))})


