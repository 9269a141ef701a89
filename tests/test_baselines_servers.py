"""Server side of the classic baselines: aggregation on hand-computed numbers, per preset."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord

from conftest import make_cfg, train_reply
from pfedes.methods import method_of
from pfedes.strategies.cfl import ClusteredFL, bipartition, cosine_similarities, should_split

OLD = {"w": np.array([[0.0, 4.0]], dtype=np.float32), "b": np.array([1.0], dtype=np.float32)}
REPLIES = [({"w": np.array([[2.0, 0.0]], np.float32), "b": np.array([3.0], np.float32)}, 1),
           ({"w": np.array([[6.0, 8.0]], np.float32), "b": np.array([7.0], np.float32)}, 3)]
# weighted average: w = (1*[2,0] + 3*[6,8]) / 4 = [5, 6]; b = (1*3 + 3*7) / 4 = 6
AVERAGE = {"w": [[5.0, 6.0]], "b": [6.0]}
FEDAVG_SERVER = ["fedavg", "fedprox", "fedbn", "fedper", "fedrep", "apfl", "perfedavg", "lora", "ditto"]


def strategy(name, *overrides):
    cfg = make_cfg(f"strategy={name}", "num_clients=2", *overrides)
    s = method_of(cfg).strategy(cfg)
    s.current = {k: v.copy() for k, v in OLD.items()}
    return s


def aggregate(s, replies=REPLIES, nodes=(11, 12)):
    arrays, _ = s.aggregate_train(1, [train_reply(n, a, w, train_loss=1.0) for n, (a, w) in zip(nodes, replies)])
    return {k: v.numpy() for k, v in arrays.items()}


@pytest.mark.parametrize("name", FEDAVG_SERVER)
def test_fedavg_style_servers_take_the_sample_weighted_average(name):
    new = aggregate(strategy(name))
    for k, v in AVERAGE.items():
        np.testing.assert_allclose(new[k], v)


@pytest.mark.parametrize("name, sends", [("fedavg", True), ("fedbn", True), ("fedper", True), ("fedrep", True),
                                         ("lora", True), ("perfedavg", True), ("apfl", True),
                                         ("ditto", False), ("pfedme", False), ("cfl", True)])
def test_evaluation_carries_the_global_entries_only_where_the_evaluated_model_is_built_from_them(name, sends):
    assert method_of(make_cfg(f"strategy={name}")).strategy.send_arrays_to_evaluate is sends


@pytest.mark.parametrize("beta, expected_w, expected_b", [
    (1.0, [[5.0, 6.0]], [6.0]),            # plain average
    (0.5, [[2.5, 5.0]], [3.5]),            # 0.5 * old + 0.5 * average
    (2.0, [[10.0, 8.0]], [11.0]),          # -old + 2 * average (the paper's beta > 1)
])
def test_pfedme_server_mixes_old_and_average_with_beta(beta, expected_w, expected_b):
    new = aggregate(strategy("pfedme", f"strategy.beta={beta}"))
    np.testing.assert_allclose(new["w"], expected_w)
    np.testing.assert_allclose(new["b"], expected_b)


def test_pfedme_rejects_a_beta_outside_its_range():
    with pytest.raises(ValueError, match="strategy.beta"):
        strategy("pfedme", "strategy.beta=0")


# -- CFL ------------------------------------------------------------------------------------
def test_cfl_criterion_on_hand_computed_norms():
    opposed = [np.array([1.0, 0.0]), np.array([-1.0, 0.0])]
    # weighted mean (1:1) = 0 < eps1, max norm 1 > eps2: split
    assert should_split(opposed, [1, 1], eps1=0.4, eps2=0.5)
    # weighted 3:1: mean = [0.5, 0], norm 0.5 >= eps1: the cluster is not at a stationary point
    assert not should_split(opposed, [3, 1], eps1=0.4, eps2=0.5)
    # every client is near its own stationary point (max norm 1 <= eps2): no split
    assert not should_split(opposed, [1, 1], eps1=0.4, eps2=1.0)
    aligned = [np.array([1.0, 0.0]), np.array([0.8, 0.6])]
    assert not should_split(aligned, [1, 1], eps1=0.4, eps2=0.5)  # mean norm ~0.95


def test_bipartition_keeps_similar_updates_together():
    updates = [np.array([1.0, 0.1]), np.array([-1.0, 0.0]), np.array([1.0, -0.1]), np.array([-0.9, 0.2])]
    sim = cosine_similarities(updates)
    np.testing.assert_allclose(np.diag(sim), 1.0)
    assert sorted([sorted(g) for g in bipartition(sim)]) == [[0, 2], [1, 3]]


def cfl(*overrides):
    s = ClusteredFL(make_cfg("strategy=cfl", "num_clients=4", "strategy.eps1=0.4", "strategy.eps2=0.5",
                             "strategy.min_split_size=3", "strategy.split_after=0", *overrides))
    s.current = {"w": np.zeros(2, np.float32)}
    s.clusters = [{"members": {1, 2, 3, 4}, "arrays": {"w": np.zeros(2, np.float32)}}]
    return s


def reply(node, w, n=1):
    return train_reply(node, {"w": np.asarray(w, np.float32)}, n, train_loss=1.0)


def test_cfl_splits_a_cluster_when_the_criterion_says_so_and_averages_each_half():
    s = cfl()
    out, _ = s.aggregate_train(1, [reply(1, [1.0, 0.1]), reply(2, [-1.0, 0.0], 2), reply(3, [1.0, -0.1]),
                                   reply(4, [-0.9, 0.2])])
    # weighted mean update = ([1,.1] + 2*[-1,0] + [1,-.1] + [-.9,.2]) / 5 = [-0.18, 0.04]: norm 0.18 < 0.4;
    # max norm ~1.005 > 0.5: split into {1, 3} and {2, 4}
    assert [c["members"] for c in s.clusters] == [{1, 3}, {2, 4}]
    np.testing.assert_allclose(s.clusters[0]["arrays"]["w"], [1.0, 0.0])                       # (1*[1,.1] + 1*[1,-.1]) / 2
    np.testing.assert_allclose(s.clusters[1]["arrays"]["w"], [(-2.0 - 0.9) / 3, 0.2 / 3], rtol=1e-6)  # (2*[-1,0] + [-.9,.2]) / 3
    np.testing.assert_allclose(out["w"].numpy(), s.clusters[0]["arrays"]["w"])
    server = s.round_stats["server"]  # recorded in metrics.jsonl as server_metrics
    assert server["clusters"] == 2
    np.testing.assert_allclose(server["mean_update_norm"], [np.hypot(0.18, 0.04)], rtol=1e-5)
    np.testing.assert_allclose(server["max_update_norm"], [np.hypot(1.0, 0.1)], rtol=1e-5)


def test_cfl_does_not_split_when_updates_agree_and_then_equals_fedavg():
    s = cfl()
    s.aggregate_train(1, [reply(1, [1.0, 0.0]), reply(2, [0.8, 0.6], 3), reply(3, [1.0, 0.2]), reply(4, [0.9, 0.1])])
    assert len(s.clusters) == 1
    np.testing.assert_allclose(s.clusters[0]["arrays"]["w"], [(1 + 2.4 + 1 + 0.9) / 6, (1.8 + 0.2 + 0.1) / 6],
                               rtol=1e-6)


def test_cfl_does_not_split_a_cluster_smaller_than_min_split_size():
    s = cfl("strategy.min_split_size=5")
    s.aggregate_train(1, [reply(1, [1.0, 0.0]), reply(2, [-1.0, 0.0]), reply(3, [1.0, 0.0]), reply(4, [-1.0, 0.0])])
    assert len(s.clusters) == 1


def test_cfl_waits_split_after_rounds_counted_across_a_resume():
    opposed = [reply(1, [1.0, 0.1]), reply(2, [-1.0, 0.0], 2), reply(3, [1.0, -0.1]), reply(4, [-0.9, 0.2])]
    s = cfl("strategy.split_after=20")
    s.aggregate_train(20, opposed)  # the criterion holds (previous test), but 20 rounds are not yet done
    assert len(s.clusters) == 1
    resumed = cfl("strategy.split_after=20")
    resumed.round_offset = 20  # a run resumed after round 20: its first round is round 21
    resumed.aggregate_train(1, opposed)
    assert len(resumed.clusters) == 2


def test_cfl_sends_each_node_its_own_cluster_model_and_checkpoints_the_clusters():
    class Grid:
        def get_node_ids(self):
            return [1, 2, 3, 4]

    s = cfl()
    s.clusters = [{"members": {1, 3}, "arrays": {"w": np.array([1.0, 1.0], np.float32)}},
                  {"members": {2, 4}, "arrays": {"w": np.array([2.0, 2.0], np.float32)}}]
    start = ArrayRecord({"w": Array(np.zeros(2, np.float32))})
    for configure in (s.configure_train, s.configure_evaluate):
        sent = {m.metadata.dst_node_id: m.content["arrays"]["w"].numpy() for m in configure(1, start, ConfigRecord(), Grid())}
        assert set(sent) == {1, 2, 3, 4}
        for node in (1, 3):
            np.testing.assert_array_equal(sent[node], [1.0, 1.0])
        for node in (2, 4):
            np.testing.assert_array_equal(sent[node], [2.0, 2.0])
    restored = cfl()
    restored.load_state_dict(s.state_dict())
    assert [c["members"] for c in restored.clusters] == [{1, 3}, {2, 4}]
