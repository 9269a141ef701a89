"""Dynamic client selection (pfedes/selection.py): power-of-choice by recent loss, the round's
device mix kept, untrusted losses clipped, and Flower's uniform sampling otherwise."""

import random

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord

from conftest import make_cfg, train_reply
from pfedes.config import ConfigError, experiment_config
from pfedes.selection import MAX_LOSS, ClientHistory, power_of_choice
from pfedes.strategies.pfedes import PFedES


def history(losses, devices):
    h = ClientHistory()
    for node, (loss, device) in enumerate(zip(losses, devices)):
        h.remember(node, loss, device)
    return h


def test_power_of_choice_keeps_the_highest_losses_in_turn_from_each_device():
    h = history([5.0, 4.0, 3.0, 0.5, 0.4, 0.3], ["phone", "phone", "phone", "gpu-host", "gpu-host", "gpu-host"])
    chosen = power_of_choice(list(range(6)), 4, candidates=2, history=h, rng=random.Random(0))
    # all six are candidates (2 x 4 > 6): two phones and two gpu-hosts, the highest-loss of each
    assert chosen == [0, 1, 3, 4]


def test_a_node_never_heard_from_is_tried_first_and_candidates_bound_the_draw():
    h = history([9.0, 9.0, 9.0], [None] * 3)  # nodes 0-2 known (profile unknown), 3-9 never heard from
    chosen = power_of_choice(list(range(10)), 2, candidates=1, history=h, rng=random.Random(1))
    assert len(chosen) == 2
    everyone = power_of_choice(list(range(10)), 3, candidates=10, history=h, rng=random.Random(1))
    assert not set(everyone) & {0, 1, 2}  # unknown loss ranks above any known one


def test_a_reported_loss_is_untrusted():
    h = ClientHistory()
    for node, loss in enumerate([float("nan"), -1.0, None, "high", 1e9, 2.0]):
        h.remember(node, loss, "phone")
    assert h.loss == {4: MAX_LOSS, 5: 2.0}


def test_the_server_keeps_a_few_bytes_per_node():
    import pickle

    def pickled(history):
        return len(pickle.dumps(history.state_dict(), protocol=2))  # torch.save's protocol

    h, rng = ClientHistory(), random.Random(0)
    for i in range(1000):  # Flower's node ids are 64-bit; each reply brings its own device string
        h.remember(rng.getrandbits(64), rng.random(), "".join(["phone", "gateway", "gpu-host"][i % 3]))
    assert (pickled(h) - pickled(ClientHistory())) / 1000 <= 32  # id twice (10 + 10), loss (9), device
    restored = ClientHistory()  # (one string per profile); as small after a resume
    restored.load_state_dict(pickle.loads(pickle.dumps(h.state_dict())))
    assert pickled(restored) == pickled(h)


class Grid:
    def get_node_ids(self):
        return list(range(1, 11))


@pytest.fixture(autouse=True)
def task_identity():
    """Messages need a run, as on a SuperLink."""
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1


def test_the_strategy_sends_to_the_selected_nodes_and_remembers_their_replies():
    s = PFedES(make_cfg("num_clients=10", "fraction_train=0.3", "selection.mode=power_of_choice",
                        "selection.candidates=3", "aggregation.norm_threshold=0"))
    start = ArrayRecord({"w": Array(np.zeros(2, np.float32))})
    first = [m.metadata.dst_node_id for m in s.configure_train(1, start, ConfigRecord(), Grid())]
    assert len(first) == 3
    replies = [train_reply(n, {"w": np.ones(2, np.float32)}, 1, train_loss=float(n)) for n in first]
    s.aggregate_train(1, replies)
    assert s.history.loss == {n: float(n) for n in first}
    restored = PFedES(make_cfg("num_clients=10", "fraction_train=0.3", "selection.mode=power_of_choice"))
    restored.load_common_state_dict(s.common_state_dict())
    assert restored.history.loss == s.history.loss


def test_uniform_selection_is_flowers_sampling():
    s = PFedES(make_cfg("num_clients=10", "fraction_train=0.5"))
    start = ArrayRecord({"w": Array(np.zeros(2, np.float32))})
    assert len(list(s.configure_train(1, start, ConfigRecord(), Grid()))) == 5


@pytest.mark.parametrize("mode", ["uniform", "power_of_choice"])
def test_a_quarantined_node_is_not_sampled_under_partial_participation_but_trains_when_everyone_does(mode):
    start = ArrayRecord({"w": Array(np.zeros(2, np.float32))})
    s = PFedES(make_cfg("num_clients=10", "fraction_train=0.5", f"selection.mode={mode}"))
    s.direction_strikes.quarantined = {1, 2, 3, 4, 5, 6, 7}
    for server_round in range(1, 6):
        sent = [m.metadata.dst_node_id for m in s.configure_train(server_round, start, ConfigRecord(), Grid())]
        assert sorted(sent) == [8, 9, 10]  # 5 places, 3 nodes not quarantined
    everyone = PFedES(make_cfg("num_clients=10", "fraction_train=1.0", f"selection.mode={mode}"))
    everyone.direction_strikes.quarantined = {1, 2}
    assert len(list(everyone.configure_train(1, start, ConfigRecord(), Grid()))) == 10


@pytest.mark.parametrize("override, message", [
    ("selection.mode=greedy", "selection.mode 'greedy' is unknown"),
    ("selection.candidates=0", "selection.candidates must be an integer >= 1, got 0"),
])
def test_a_bad_selection_setting_is_one_line(override, message):
    with pytest.raises(ConfigError, match=message):
        experiment_config([override])
