"""The server side of the model-heterogeneous baselines, on hand-computed numbers: per-class
averaging weighted by class counts (FedProto, FD), the global head's SGD update (FedGH), the
weighted average of G, heads and memes (pFedES paper form, LG-FedAvg, FML); reply validation;
bytes counted from what travels."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord

from conftest import make_cfg, train_reply
from pfedes.strategies.fd import FD
from pfedes.strategies.fedgh import FedGH
from pfedes.strategies.fedproto import FedProto
from pfedes.strategies.fml import FML
from pfedes.strategies.lgfedavg import LGFedAvg
from pfedes.strategies.pfedes_paper import PFedESPaper

NUM_CLASSES = 10  # the embedded CIFAR-10 sample


def counts(**by_class):
    out = np.zeros(NUM_CLASSES, np.int64)
    for label, n in by_class.items():
        out[int(label[1:])] = n
    return out


def payload(means: dict[int, list[float]], class_counts: np.ndarray) -> dict[str, np.ndarray]:
    out = {f"class.{c}": np.asarray(v, np.float32) for c, v in means.items()}
    out["counts"] = class_counts
    return out


def result(strategy, replies):
    arrays, metrics = strategy.aggregate_train(1, replies)
    return (None if arrays is None else {k: v.numpy() for k, v in arrays.items()}), metrics


def fedproto(d=2):
    return FedProto(make_cfg("strategy=fedproto", f"model.proxy_dim={d}", "num_clients=3"))


# -- FedProto / FD: per-class averages weighted by class counts --------------------------------

def test_fedproto_averages_each_class_weighted_by_its_counts():
    replies = [
        train_reply(1, payload({0: [1.0, 2.0], 3: [0.0, -4.0]}, counts(c0=1, c3=2)), 3, train_loss=1.0),
        train_reply(2, payload({0: [4.0, 8.0]}, counts(c0=3)), 3, train_loss=2.0),
        train_reply(3, payload({3: [3.0, 2.0], 7: [5.0, 5.0]}, counts(c3=6, c7=1)), 7, train_loss=4.0),
    ]
    new, metrics = result(fedproto(), replies)
    # class 0: (1*[1,2] + 3*[4,8]) / 4 = [3.25, 6.5]; class 3: (2*[0,-4] + 6*[3,2]) / 8 = [2.25, 0.5]
    # class 7: only client 3: [5, 5]
    assert set(new) == {"class.0", "class.3", "class.7", "counts"}
    np.testing.assert_allclose(new["class.0"], [3.25, 6.5])
    np.testing.assert_allclose(new["class.3"], [2.25, 0.5])
    np.testing.assert_allclose(new["class.7"], [5.0, 5.0])
    np.testing.assert_array_equal(new["counts"], counts(c0=4, c3=8, c7=1))
    assert new["class.0"].dtype == np.float32 and new["counts"].dtype == np.int64
    assert metrics["train_loss"] == pytest.approx((3 * 1.0 + 3 * 2.0 + 7 * 4.0) / 13)


def test_fd_averages_per_class_logits_weighted_by_class_counts():
    strategy = FD(make_cfg("strategy=fd", "num_clients=2"))
    assert strategy.payload_dim == NUM_CLASSES
    a, b = np.arange(10, dtype=np.float32), np.full(10, 10.0, np.float32)
    replies = [train_reply(1, payload({2: a}, counts(c2=3)), 3),
               train_reply(2, payload({2: b, 5: a}, counts(c2=1, c5=4)), 5)]
    new, _ = result(strategy, replies)
    # class 2: (3*[0..9] + 1*[10]*10) / 4 = [2.5, 3.25, 4, ..., 9.25]; class 5: [0..9]
    np.testing.assert_allclose(new["class.2"], (3 * a + b) / 4)
    np.testing.assert_allclose(new["class.2"][:3], [2.5, 3.25, 4.0])
    np.testing.assert_allclose(new["class.5"], a)
    np.testing.assert_array_equal(new["counts"], counts(c2=4, c5=4))


GOOD_A = payload({0: [1.0, 1.0]}, counts(c0=2))
GOOD_B = payload({0: [3.0, 5.0], 1: [1.0, 0.0]}, counts(c0=6, c1=1))


@pytest.mark.parametrize("bad", [
    payload({0: [np.nan, 1.0]}, counts(c0=1)),                         # NaN
    payload({0: [np.inf, 1.0]}, counts(c0=1)),                         # Inf
    payload({0: [1.0, 2.0, 3.0]}, counts(c0=1)),                       # wrong dimension
    payload({0: [1.0, 2.0]}, counts(c0=1, c4=2)),                      # counted class without a vector
    payload({0: [1.0, 2.0], 5: [0.0, 0.0]}, counts(c0=1)),             # vector of an uncounted class
    payload({0: [1.0, 2.0]}, -counts(c0=1)),                           # negative count
    payload({}, counts()),                                              # no class at all
    {"class.0": np.ones(2, np.float32)},                                # no counts
    {"class.0": np.ones(2, np.float32), "counts": np.ones(3, np.int64)},  # counts of 3 classes
    {"class.0": np.ones(2, np.float64), "counts": counts(c0=1)},       # dtype
    {"head.weight": np.zeros((10, 2), np.float32)},                     # weights instead
])
def test_bad_payloads_are_dropped_with_the_node_named_and_the_round_goes_on(bad, caplog):
    clean, _ = result(fedproto(), [train_reply(1, GOOD_A, 2), train_reply(2, GOOD_B, 7)])
    s = fedproto()
    with_bad, _ = result(s, [train_reply(1, GOOD_A, 2), train_reply(99, bad, 100), train_reply(2, GOOD_B, 7)])
    assert set(with_bad) == set(clean)
    for k in clean:
        np.testing.assert_array_equal(with_bad[k], clean[k])
    np.testing.assert_allclose(clean["class.0"], [2.5, 4.0])  # (2*[1,1] + 6*[3,5]) / 8
    assert s.round_stats["clients_dropped"] == 1 and s.round_stats["clients_trained"] == 2
    assert "node 99" in caplog.text


def test_a_payload_without_a_positive_weight_is_dropped():
    s = fedproto()
    new, _ = result(s, [train_reply(1, GOOD_A, 2), train_reply(2, GOOD_B, 0)])
    assert s.round_stats["clients_dropped"] == 1
    np.testing.assert_array_equal(new["counts"], counts(c0=2))


def test_a_round_with_only_bad_payloads_keeps_the_previous_state(caplog):
    new, _ = result(fedproto(), [train_reply(4, payload({0: [np.nan, 0.0]}, counts(c0=1)), 1)])
    assert new is None  # Strategy.start then keeps the previous arrays
    assert "node 4" in caplog.text


# -- FedGH: the global head's update --------------------------------------------------------------

def test_fedgh_trains_the_global_head_on_the_uploaded_prototypes():
    s = FedGH(make_cfg("strategy=fedgh", "model.proxy_dim=2", "strategy.server_lr=0.1",
                       "strategy.server_epochs=1", "num_clients=2"))
    s.current = {"head.weight": np.zeros((NUM_CLASSES, 2), np.float32),
                 "head.bias": np.zeros(NUM_CLASSES, np.float32)}
    # One (prototype, class) pair per client and class; counts do not weight the pairs.
    replies = [train_reply(1, payload({0: [1.0, 0.0]}, counts(c0=5)), 5),
               train_reply(2, payload({1: [0.0, 2.0]}, counts(c1=1)), 1)]
    new, _ = result(s, replies)
    # W = b = 0: softmax is 0.1 for every class. grad = mean over pairs of (softmax - onehot) p^T:
    # pair (p=[1,0], y=0): row 0 [-0.9, 0], other rows [0.1, 0]
    # pair (p=[0,2], y=1): row 1 [0, -1.8], other rows [0, 0.2]
    # mean: row 0 [-0.45, 0.1], row 1 [0.05, -0.9], rows 2-9 [0.05, 0.1]
    # bias grad: rows 0, 1 (-0.9 + 0.1) / 2 = -0.4; rows 2-9 0.1. One SGD step at lr 0.1: -0.1 * grad.
    expected_w = np.tile([-0.005, -0.01], (NUM_CLASSES, 1))
    expected_w[0] = [0.045, -0.01]
    expected_w[1] = [-0.005, 0.09]
    expected_b = np.full(NUM_CLASSES, -0.01)
    expected_b[:2] = 0.04
    assert set(new) == {"head.weight", "head.bias"}
    np.testing.assert_allclose(new["head.weight"], expected_w, atol=1e-6)
    np.testing.assert_allclose(new["head.bias"], expected_b, atol=1e-6)
    assert new["head.weight"].dtype == np.float32


def test_fedgh_drops_a_bad_prototype_and_trains_on_the_rest(caplog):
    cfg = ("strategy=fedgh", "model.proxy_dim=2", "strategy.server_epochs=3", "num_clients=2")
    head = {"head.weight": np.full((NUM_CLASSES, 2), 0.5, np.float32), "head.bias": np.zeros(NUM_CLASSES, np.float32)}
    outs = []
    for replies in ([train_reply(1, GOOD_B, 7)],
                    [train_reply(1, GOOD_B, 7), train_reply(8, payload({0: [np.nan, 1.0]}, counts(c0=1)), 1)]):
        s = FedGH(make_cfg(*cfg))
        s.current = {k: v.copy() for k, v in head.items()}
        outs.append(result(s, replies)[0])
    for k in head:
        np.testing.assert_array_equal(outs[0][k], outs[1][k])
        assert not np.array_equal(outs[0][k], head[k])
    assert "node 8" in caplog.text


def test_fedgh_rejects_a_bad_server_setting():
    with pytest.raises(ValueError, match="server_epochs"):
        FedGH(make_cfg("strategy=fedgh", "strategy.server_epochs=0"))


# -- weight-sharing methods: G, heads, memes ----------------------------------------------------

@pytest.mark.parametrize("name, cls, key", [
    ("pfedes_paper", PFedESPaper, "proxy.body.0.weight"),
    ("lgfedavg", LGFedAvg, "head.weight"),
    ("fml", FML, "proxy.1.weight"),
])
def test_shared_weights_are_the_sample_weighted_average(name, cls, key):
    # server momentum 0 makes the step the plain average (LG-FedAvg's preset uses 0.95)
    s = cls(make_cfg(f"strategy={name}", "num_clients=3", "strategy.server_momentum=0"))
    shape = (2, 3)
    s.current = {key: np.zeros(shape, np.float32)}
    replies = [train_reply(1, {key: np.full(shape, 1.0, np.float32)}, 1),
               train_reply(2, {key: np.full(shape, 5.0, np.float32)}, 3),
               train_reply(3, {key: np.full(shape, 2.0, np.float32)}, 4)]
    new, _ = result(s, replies)
    # (1*1 + 3*5 + 4*2) / 8 = 3
    np.testing.assert_allclose(new[key], np.full(shape, 3.0))


def test_pfedes_paper_generator_average_on_its_real_entries():
    from pfedes.trainers.pfedes_paper import PFedESPaperTrainer

    cfg = make_cfg("strategy=pfedes_paper", "num_clients=2")
    g = {k: v.numpy() for k, v in PFedESPaperTrainer.initial_shared(cfg, "cnn3", NUM_CLASSES).items()}
    assert sum(v.size for v in g.values()) == 443
    s = PFedESPaper(cfg)
    s.current = g
    new, _ = result(s, [train_reply(1, {k: v + 2.0 for k, v in g.items()}, 1),
                        train_reply(2, {k: v - 2.0 for k, v in g.items()}, 3)])
    for k, v in g.items():  # (1*(v+2) + 3*(v-2)) / 4 = v - 1
        np.testing.assert_allclose(new[k], v - 1.0, atol=1e-6)


# -- bytes, counted from what travels -----------------------------------------------------------

class FakeGrid:
    def __init__(self, nodes):
        self.nodes = nodes

    def get_node_ids(self):
        return list(self.nodes)


def nbytes(arrays: dict[str, np.ndarray]) -> int:
    return sum(len(Array(v).data) for v in arrays.values())


def test_bytes_up_and_down_per_client_are_those_of_the_payloads_sent():
    s = fedproto()
    sent = {k: Array(v) for k, v in GOOD_B.items()}
    messages = list(s.configure_train(1, ArrayRecord(sent), ConfigRecord(), FakeGrid([1, 2, 3])))
    assert len(messages) == 3
    assert s.round_stats["bytes_down"] == 3 * nbytes(GOOD_B)
    eval_messages = list(s.configure_evaluate(1, ArrayRecord(sent), ConfigRecord(), FakeGrid([1, 2, 3])))
    assert len(eval_messages) == 3 and s.round_stats["bytes_down"] == 3 * nbytes(GOOD_B)  # nothing sent
    result(s, [train_reply(1, GOOD_A, 2), train_reply(2, GOOD_B, 7)])
    assert s.round_stats["bytes_up"] == nbytes(GOOD_A) + nbytes(GOOD_B)
    assert nbytes(GOOD_A) < nbytes(GOOD_B)  # a payload grows with the classes present


def test_lgfedavg_sends_the_head_to_evaluation_and_counts_it():
    s = LGFedAvg(make_cfg("strategy=lgfedavg", "num_clients=2"))
    head = {"head.weight": np.zeros((NUM_CLASSES, 4), np.float32), "head.bias": np.zeros(NUM_CLASSES, np.float32)}
    record = ArrayRecord({k: Array(v) for k, v in head.items()})
    messages = list(s.configure_evaluate(1, record, ConfigRecord(), FakeGrid([1, 2])))
    assert all(set(m.content.array_records["arrays"]) == set(head) for m in messages)
    assert s.round_stats["bytes_down"] == 2 * nbytes(head)
