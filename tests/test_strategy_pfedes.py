"""The server side of pFedES: weighted proxy average, server momentum, reply validation."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord

from conftest import make_cfg, train_reply
from pfedes.strategies.pfedes import PFedES

OLD = {"w": np.array([[0.0, 4.0]], dtype=np.float32), "b": np.array([1.0], dtype=np.float32)}


def strategy(beta=0.5):
    s = PFedES(make_cfg(f"strategy.server_momentum={beta}", "num_clients=3"))
    s.current = {k: v.copy() for k, v in OLD.items()}
    return s


def agg(s, replies):
    arrays, metrics = s.aggregate_train(1, replies)
    return {k: v.numpy() for k, v in arrays.items()}, metrics


def test_weighted_average_then_momentum_on_hand_computed_numbers():
    replies = [
        train_reply(11, {"w": np.array([[2.0, 0.0]], np.float32), "b": np.array([3.0], np.float32)}, 1,
                    train_loss=1.0, align_loss=0.5),
        train_reply(12, {"w": np.array([[6.0, 8.0]], np.float32), "b": np.array([7.0], np.float32)}, 3,
                    train_loss=2.0, align_loss=1.5),
    ]
    new, metrics = agg(strategy(0.5), replies)
    # weighted average: w = (1*[2,0] + 3*[6,8]) / 4 = [5, 6]; b = (3 + 21) / 4 = 6
    # momentum 0.5: w = 0.5*[0,4] + 0.5*[5,6] = [2.5, 5]; b = 0.5*1 + 0.5*6 = 3.5
    np.testing.assert_allclose(new["w"], [[2.5, 5.0]])
    np.testing.assert_allclose(new["b"], [3.5])
    assert metrics["train_loss"] == pytest.approx((1 * 1.0 + 3 * 2.0) / 4)
    assert metrics["align_loss"] == pytest.approx((1 * 0.5 + 3 * 1.5) / 4)
    # beta = 0 is the plain weighted average
    new0, _ = agg(strategy(0.0), replies)
    np.testing.assert_allclose(new0["w"], [[5.0, 6.0]])


def good(node, scale=1.0, n=2):
    return train_reply(node, {k: v + scale for k, v in OLD.items()}, n, train_loss=1.0)


@pytest.mark.parametrize("bad", [
    {"w": np.array([[np.nan, 1.0]], np.float32), "b": np.array([1.0], np.float32)},   # NaN
    {"w": np.array([[np.inf, 1.0]], np.float32), "b": np.array([1.0], np.float32)},   # Inf
    {"w": np.zeros((2, 2), np.float32), "b": np.array([1.0], np.float32)},            # shape
    {"w": np.zeros((1, 2), np.float64), "b": np.array([1.0], np.float32)},            # dtype
    {"w": np.zeros((1, 2), np.float32), "b": np.array([1.0], np.float32),
     "private.head": np.zeros(3, np.float32)},                                          # extra key
    {"w": np.zeros((1, 2), np.float32)},                                                # missing key
])
def test_bad_replies_are_dropped_and_the_aggregate_equals_the_one_without_them(bad, caplog):
    clean, _ = agg(strategy(), [good(1, 1.0), good(2, 3.0, n=6)])
    s = strategy()
    with_bad, _ = agg(s, [good(1, 1.0), train_reply(99, bad, 1000), good(2, 3.0, n=6)])
    for k in clean:
        np.testing.assert_array_equal(with_bad[k], clean[k])
    assert s.round_stats["clients_dropped"] == 1 and s.round_stats["clients_trained"] == 2
    assert "node 99" in caplog.text


def test_a_round_with_only_bad_replies_keeps_the_proxy():
    s = strategy()
    arrays, _ = s.aggregate_train(1, [train_reply(5, {"w": np.zeros(3, np.float32)}, 1)])
    assert arrays is None  # Strategy.start keeps the previous arrays


def test_a_reply_without_a_positive_weight_is_dropped():
    s = strategy()
    arrays, _ = s.aggregate_train(1, [good(1), train_reply(2, dict(OLD), 0)])
    assert s.round_stats["clients_dropped"] == 1 and arrays is not None


def test_bytes_are_counted_from_what_travels():
    s = strategy()
    replies = [good(1), good(2)]
    s.aggregate_train(1, replies)
    expected = sum(len(Array(v).data) for v in OLD.values()) * 2
    assert s.round_stats["bytes_up"] == expected
    assert ArrayRecord({k: Array(v) for k, v in OLD.items()}).count_bytes() > 0


def test_a_round_that_starts_while_nodes_connect_still_samples_every_expected_node(monkeypatch):
    """FedAvg sizes the sample from the nodes up *now*; with 1 of 3 up it would train only one."""
    monkeypatch.setattr("flwr.serverapp.strategy.strategy_utils.sleep", lambda _: None)

    class ConnectingGrid:
        def __init__(self):
            self.calls = 0

        def get_node_ids(self):
            self.calls += 1
            return [1, 2, 3] if self.calls > 1 else [1]

    s = PFedES(make_cfg("num_clients=3"))
    start = ArrayRecord({k: Array(v) for k, v in OLD.items()})
    for configure in (s.configure_train, s.configure_evaluate):
        sent = configure(1, start, ConfigRecord(), ConnectingGrid())
        assert sorted(m.metadata.dst_node_id for m in sent) == [1, 2, 3]


def test_with_evaluate_in_train_the_train_replies_carry_the_round_evaluation():
    from flwr.app import MetricRecord

    from pfedes.config import ConfigError
    from pfedes.strategies.fedavg import FedAvg

    s = PFedES(make_cfg("num_clients=3", "evaluate_in_train=true"))
    s.current = {k: v.copy() for k, v in OLD.items()}
    replies = []
    for node, acc in ((11, 0.5), (12, 0.75), (13, 1.0)):
        reply = train_reply(node, OLD, 4, train_loss=1.0)
        reply.content["evaluation"] = MetricRecord({"accuracy": acc, "loss": 0.1, "num-examples": 2})
        replies.append(reply)
    replies[2].content["other"] = MetricRecord({"x": 1.0})  # an unknown record: dropped, still evaluated
    agg(s, replies)
    assert s.round_stats["clients_dropped"] == 1
    assert sorted(r["accuracy"] for r in s.round_stats["eval"]) == [0.5, 0.75, 1.0]
    assert s.fraction_evaluate == 0.0  # no evaluate round: Flower sends no evaluate message
    metrics = s.aggregate_evaluate(1, [])
    assert metrics["acc_mean"] == pytest.approx(0.75) and metrics["acc_worst"] == pytest.approx(0.5)
    with pytest.raises(ConfigError, match="evaluate_in_train"):
        FedAvg(make_cfg("strategy=fedavg", "num_clients=3", "evaluate_in_train=true"))


def test_the_round_evaluation_does_not_depend_on_reply_order():
    from conftest import make_reply
    from flwr.app import ConfigRecord, MetricRecord, RecordDict

    def reply(node, partition, acc):
        return make_reply(node, RecordDict({"metrics": MetricRecord({"accuracy": acc, "num-examples": 3}),
                                            "info": ConfigRecord({"partition-id": partition})}), "evaluate")

    replies = [reply(11, 2, 0.1), reply(12, 0, 0.7), reply(13, 1, 0.3)]
    s, t = PFedES(make_cfg("num_clients=3")), PFedES(make_cfg("num_clients=3"))
    assert s.aggregate_evaluate(1, replies)["acc_mean"] == t.aggregate_evaluate(1, replies[::-1])["acc_mean"]
    assert [r["partition"] for r in s.round_stats["eval"]] == [r["partition"] for r in t.round_stats["eval"]] == [0, 1, 2]


def test_server_momentum_is_a_piece_pfedes_composes_not_the_base_of_every_strategy():
    from pfedes.strategies import PersonalizedStrategy, ServerMomentum
    from pfedes.strategies.fedavg import FedAvg

    assert issubclass(PFedES, ServerMomentum) and not issubclass(FedAvg, ServerMomentum)
    assert not hasattr(PersonalizedStrategy(make_cfg("strategy=fedavg")), "server_momentum")
    with pytest.raises(ValueError, match=r"strategy.server_momentum 1.5 is outside \[0, 1\)"):
        strategy(1.5)
