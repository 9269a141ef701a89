"""Clustered FL on the server (Sattler, Mueller and Samek, 2020): a model per cluster of
clients, and recursive bi-partitioning of a cluster when its clients' updates disagree.

Each round every client receives its cluster's model; a cluster's new model is the sample-
weighted average of its members' replies. With the members' updates dW_i (reply minus the
model sent), after `split_after` rounds, a cluster of at least `min_split_size` replying clients is split in two when

    ||sum_i w_i dW_i / sum_i w_i|| < eps1   (the cluster as a whole is near a stationary point)
    max_i ||dW_i||                 > eps2   (but some clients are not),

into the two groups that minimise the largest cosine similarity of updates across them
(complete-linkage agglomeration of the pairwise similarities down to two groups); each new
cluster's model is the weighted average of its members' replies. Members that did not reply
in the splitting round stay with the first group.

Clusters are kept by node id; a node the server has not seen joins the first cluster. (A
resumed simulation assigns new node ids, so its nodes all restart in the first cluster.)
The arrays the strategy hands back to Flower (checkpointed, and sent to an unknown node) are
the first cluster's model; all clusters are in `state_dict()`.
"""

from __future__ import annotations

from collections.abc import Iterable
from logging import INFO
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from ..robust import flat_update
from .base import PersonalizedStrategy


def cosine_similarities(updates: list[np.ndarray]) -> np.ndarray:
    stacked = np.stack(updates)
    norms = np.linalg.norm(stacked, axis=1, keepdims=True)
    unit = stacked / np.where(norms > 0, norms, 1.0)
    return unit @ unit.T


def update_norms(updates: list[np.ndarray], weights: list[float]) -> tuple[float, float]:
    """(norm of the weighted mean update, largest norm of one update): what the criterion reads."""
    w = np.asarray(weights, dtype=np.float64)
    mean_norm = float(np.linalg.norm(np.tensordot(w / w.sum(), np.stack(updates), axes=1)))
    return mean_norm, max(float(np.linalg.norm(u)) for u in updates)


def criterion_holds(mean_norm: float, max_norm: float, eps1: float, eps2: float) -> bool:
    """The CFL criterion: the weighted mean update is small while some update is large."""
    return mean_norm < eps1 and max_norm > eps2


def should_split(updates: list[np.ndarray], weights: list[float], eps1: float, eps2: float) -> bool:
    return criterion_holds(*update_norms(updates, weights), eps1, eps2)


def bipartition(similarity: np.ndarray) -> tuple[list[int], list[int]]:
    """Complete-linkage agglomeration on the dissimilarity -similarity, down to two groups: the
    merge order keeps the most similar clients together, so the largest similarity across the
    two groups is as small as this procedure can make it."""
    groups = [[i] for i in range(len(similarity))]
    while len(groups) > 2:
        best, pair = np.inf, (0, 1)
        for a in range(len(groups)):
            for b in range(a + 1, len(groups)):
                linkage = max(-similarity[i, j] for i in groups[a] for j in groups[b])
                if linkage < best:
                    best, pair = linkage, (a, b)
        a, b = pair
        groups[a] = sorted(groups[a] + groups.pop(b))
    return groups[0], groups[1]


class ClusteredFL(PersonalizedStrategy):
    send_arrays_to_evaluate = True
    one_consensus = False  # the clusters' updates oppose each other: that is what splits them

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__(cfg)
        s = self.settings  # eps1, eps2 > 0, min_split_size >= 2: methods/cfl.py
        self.eps1, self.eps2, self.min_split_size = s.eps1, s.eps2, s.min_split_size
        self.split_after = s.split_after
        self.clusters: list[dict[str, Any]] = []  # {"members": set of node ids, "arrays": {key: array}}

    # -- which cluster a node is in ----------------------------------------------------
    def cluster_index(self, node_id: int) -> int:
        for index, cluster in enumerate(self.clusters):
            if node_id in cluster["members"]:
                return index
        self.clusters[0]["members"].add(node_id)
        return 0

    def _per_node(self, messages: list[Message]) -> list[Message]:
        """The same messages, each carrying its destination's cluster model (its downlink copy:
        encoded once per cluster and round)."""
        out = []
        for msg in messages:
            arrays = self.clusters[self.cluster_index(msg.metadata.dst_node_id)]["arrays"]
            record = self.downlink_copy(arrays)[0] if self.downlink.active \
                else ArrayRecord({k: Array(v) for k, v in arrays.items()})
            content = RecordDict({self.arrayrecord_key: record,
                                  self.configrecord_key: msg.content[self.configrecord_key]})
            out.append(Message(content=content, dst_node_id=msg.metadata.dst_node_id,
                               message_type=msg.metadata.message_type))
        return out

    def sent_to(self, node_id: int) -> dict[str, np.ndarray]:
        return self.clusters[self.cluster_index(node_id)]["arrays"] if self.clusters else self.current

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        messages = list(super().configure_train(server_round, arrays, config, grid))
        if not self.clusters:
            self.clusters = [{"members": set(), "arrays": dict(self.current)}]
        return self._per_node(messages)  # every cluster model has the shape counted above

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        messages = list(super().configure_evaluate(server_round, arrays, config, grid))
        return self._per_node(messages) if self.clusters else messages

    # -- aggregation ----------------------------------------------------------------------
    def aggregate_arrays(self, server_round: int, replies: list[Message],
                         arrays: list[dict[str, np.ndarray]], weights: list[float]) -> dict[str, np.ndarray]:
        if not self.current:
            return {}
        by_cluster: dict[int, list[int]] = {}
        for i, msg in enumerate(replies):
            by_cluster.setdefault(self.cluster_index(msg.metadata.src_node_id), []).append(i)
        new_clusters: list[dict[str, Any]] = []
        norms: dict[str, list[float]] = {"mean_update_norm": [], "max_update_norm": []}
        for index, cluster in enumerate(self.clusters):
            members = by_cluster.get(index, [])
            if not members:
                new_clusters.append(cluster)
                continue
            updates = [flat_update(arrays[i], cluster["arrays"]) for i in members]
            w = [weights[i] for i in members]
            mean_norm, max_norm = update_norms(updates, w)
            norms["mean_update_norm"].append(mean_norm)
            norms["max_update_norm"].append(max_norm)
            if (self.absolute_round(server_round) > self.split_after and len(members) >= self.min_split_size
                    and criterion_holds(mean_norm, max_norm, self.eps1, self.eps2)):
                first, second = bipartition(cosine_similarities(updates))
                nodes = [replies[i].metadata.src_node_id for i in members]
                group2 = {nodes[j] for j in second}
                log(INFO, "round %d: CFL splits cluster %d into %s and %s", server_round, index,
                    sorted(nodes[j] for j in first), sorted(group2))
                for group, node_set in ((first, cluster["members"] - group2), (second, group2)):
                    new_clusters.append({"members": set(node_set), "arrays": self.combine(
                        [replies[members[j]] for j in group], [arrays[members[j]] for j in group],
                        [w[j] for j in group])})
            else:
                new_clusters.append({"members": cluster["members"],
                                     "arrays": self.combine([replies[i] for i in members],
                                                            [arrays[i] for i in members], w)})
        self.clusters = new_clusters
        # in metrics.jsonl: how many clusters, and per replying cluster what the criterion read
        self.round_stats["server"] = {"clusters": len(self.clusters), **norms}
        return self.clusters[0]["arrays"]

    # -- checkpoint -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"clusters": [{"members": sorted(c["members"]), "arrays": c["arrays"]} for c in self.clusters]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.clusters = [{"members": set(c["members"]), "arrays": dict(c["arrays"])}
                         for c in state.get("clusters", [])]
