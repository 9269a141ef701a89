"""Compressed downlink (compression.downlink, pfedes/compression.py): the server quantizes the
arrays its messages carry, once per round, the client decodes them; the server's own arrays stay
as they are, and the change a client uploads is measured from what it decoded."""

import json

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict

from conftest import make_cfg, train_reply
from pfedes.client_app import decode_downlink
from pfedes.compression import Codec, EncodingError
from pfedes.config import client_settings
from pfedes.strategies.base import arrays_nbytes
from pfedes.strategies.cfl import ClusteredFL
from pfedes.strategies.fedavg import FedAvg
from pfedes.strategies.fedproto import FedProto
from pfedes.strategies.pfedes import PFedES

rng = np.random.default_rng(1)
GLOBAL = {"w": rng.normal(size=(64, 288)).astype(np.float32), "b": rng.normal(size=64).astype(np.float32),
          "steps": np.array(7, np.int64)}
MODES = ("fp16", "int8", "int8_channel")


@pytest.fixture(autouse=True)
def task_identity():
    """Flower's Message needs a run id, as in a ServerApp."""
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1


class FakeGrid:
    def __init__(self, nodes):
        self.nodes = nodes

    def get_node_ids(self):
        return list(self.nodes)


def record(arrays):
    return ArrayRecord({k: Array(v) for k, v in arrays.items()})


def experiment(cfg):
    """The config record a pfedes ServerApp sends with every message."""
    return ConfigRecord({"experiment": json.dumps(client_settings(cfg), sort_keys=True)})


def strategy(cls, *overrides, nodes=3):
    name = {FedAvg: "fedavg", PFedES: "pfedes", ClusteredFL: "cfl"}[cls]
    return cls(make_cfg(f"strategy={name}", f"num_clients={nodes}", "fraction_train=1.0", "fraction_evaluate=1.0",
                        *overrides))


def train_messages(s, arrays=GLOBAL, nodes=3):
    return list(s.configure_train(1, record(arrays), experiment(s.cfg), FakeGrid(range(1, nodes + 1))))


def client_receives(msg):
    """What the ClientApp's handler gets of a message, after the downlink mod (on its own copy,
    as a client deserialises it: the server's messages share one record)."""
    msg = Message(content=RecordDict(dict(msg.content.items())), dst_node_id=msg.metadata.dst_node_id,
                  message_type=msg.metadata.message_type)
    seen = {}

    def handler(m, _context):
        seen.update({k: a.numpy() for k, a in m.content.array_records["arrays"].items()})
        return m

    decode_downlink(msg, None, handler)
    return seen


@pytest.mark.parametrize("mode", MODES)
def test_each_mode_round_trips_within_its_quantization_error(mode):
    codec = Codec.downlink_from_cfg(make_cfg(f"compression.downlink={mode}"))
    encoded, _ = codec.encode(GLOBAL, {}, {})
    decoded = codec.decode(encoded, {})
    assert encoded["steps"] is GLOBAL["steps"] and decoded["steps"] is GLOBAL["steps"]  # a counter travels as it is
    for key in ("w", "b"):
        value, err = GLOBAL[key], np.abs(decoded[key] - GLOBAL[key])
        assert decoded[key].dtype == np.float32 and decoded[key].shape == value.shape
        if mode == "fp16":
            assert err.max() <= 1e-3 * np.abs(value).max()
        else:  # half a step: (max - min) / 255 / 2, per tensor or per first-axis slice
            rows = value.reshape(len(value) if mode == "int8_channel" and value.ndim > 1 else 1, -1)
            step = (rows.max(1) - rows.min(1)) / 255
            assert (err.reshape(len(step), -1) <= step[:, None] / 2 + 1e-6).all()


def test_none_sends_the_arrays_as_today():
    s = strategy(FedAvg)
    sent = record(GLOBAL)
    messages = list(s.configure_train(1, sent, experiment(s.cfg), FakeGrid([1, 2, 3])))
    for msg in messages:
        assert msg.content.array_records["arrays"] is sent
        assert client_receives(msg).keys() == GLOBAL.keys()
    assert s.round_stats["bytes_down"] == 3 * arrays_nbytes(sent)
    assert not s.downlink.active and not s.downlink_copies


def test_bytes_down_shrink_by_the_encoding_and_count_what_travels():
    down = {}
    for mode in ("none", *MODES):
        s = strategy(FedAvg, f"compression.downlink={mode}")
        messages = train_messages(s)
        sent = messages[0].content.array_records["arrays"]
        assert all(m.content.array_records["arrays"] is sent for m in messages)  # encoded once
        list(s.configure_evaluate(1, record(GLOBAL), experiment(s.cfg), FakeGrid([1, 2, 3])))
        assert s.round_stats["bytes_down"] == 2 * 3 * arrays_nbytes(sent)  # train and evaluate
        down[mode] = s.round_stats["bytes_down"]
        if mode != "none":
            assert sent["w|v"].numpy().dtype == (np.float16 if mode == "fp16" else np.uint8)
    assert down["fp16"] <= 0.51 * down["none"]
    assert down["int8"] <= 0.26 * down["none"] and down["int8_channel"] <= 0.27 * down["none"]


@pytest.mark.parametrize("cls, overrides", [(FedAvg, ()), (PFedES, ("strategy.server_momentum=0.5",))])
def test_the_server_arrays_stay_unquantized(cls, overrides):
    """Clients that do not train send back what they received: the server's arrays come out
    exactly as they went in (momentum included), not as their int8 copy."""
    s = strategy(cls, "compression.downlink=int8", *overrides)
    start = {k: v.copy() for k, v in GLOBAL.items()}
    messages = train_messages(s, start)
    received = client_receives(messages[0])
    assert np.abs(received["w"] - GLOBAL["w"]).max() > 1e-3  # the copy is quantized ...
    for key, value in GLOBAL.items():  # ... the server's arrays are not
        np.testing.assert_array_equal(s.current[key], value)
    arrays, _ = s.aggregate_train(1, [train_reply(n, received, 10, train_loss=1.0) for n in (1, 2, 3)])
    for key, value in GLOBAL.items():
        np.testing.assert_array_equal(arrays[key].numpy(), value)


def test_a_delta_upload_is_measured_from_what_the_client_decoded():
    """int8 downlink, fp16 delta upload: the change the server adds to its arrays is the client's
    change up to the upload's fp16 error, far below the int8 step of the downlink."""
    s = strategy(FedAvg, "compression.downlink=int8", "compression.delta=true", "compression.quantize=fp16", nodes=2)
    replies, changes = [], []
    for msg in train_messages(s, nodes=2):
        node = msg.metadata.dst_node_id
        received = client_receives(msg)
        for key in ("w", "b"):  # the server's reference is exactly what the client decoded
            np.testing.assert_array_equal(s.received_by(node)[key], received[key])
        trained = {k: (v + 0.01 * node * rng.normal(size=v.shape)).astype(np.float32) if v.dtype.kind == "f" else v
                   for k, v in received.items()}
        encoded, _ = s.codec.encode(trained, received, {})
        replies.append(train_reply(node, encoded, 10, train_loss=1.0))
        changes.append({k: trained[k] - received[k] for k in ("w", "b")})
    arrays, _ = s.aggregate_train(1, replies)  # decodes each reply in place
    step = (GLOBAL["w"].max() - GLOBAL["w"].min()) / 255
    for reply, change in zip(replies, changes):
        decoded = {k: a.numpy() for k, a in reply.content.array_records["arrays"].items()}
        for key in ("w", "b"):
            err = np.abs((decoded[key] - GLOBAL[key]) - change[key]).max()
            assert err <= 1e-3 * np.abs(change[key]).max() + 1e-6 < step / 20
    np.testing.assert_allclose(arrays["w"].numpy(), GLOBAL["w"] + (changes[0]["w"] + changes[1]["w"]) / 2, atol=1e-4)


def test_cluster_models_are_encoded_once_each_and_decoded_against_their_own_copy():
    s = strategy(ClusteredFL, "compression.downlink=int8", "compression.delta=true", nodes=2)
    train_messages(s, nodes=2)
    other = {k: (v + 5.0 if v.dtype.kind == "f" else v) for k, v in GLOBAL.items()}
    s.clusters = [{"members": {1}, "arrays": dict(GLOBAL)}, {"members": {2}, "arrays": other}]
    messages = s._per_node(train_messages(s, nodes=2))
    assert len(s.downlink_copies) == 3  # the round's arrays, then one per cluster
    for msg in messages:
        node = msg.metadata.dst_node_id
        received = client_receives(msg)
        np.testing.assert_array_equal(received["w"], s.received_by(node)["w"])
        assert np.abs(received["w"] - s.sent_to(node)["w"]).max() < 0.05


def test_class_means_are_not_moved_onto_the_server_arrays():
    """A FedProto client's prototypes are its own, not the sent ones trained further."""
    s = FedProto(make_cfg("strategy=fedproto", "num_clients=2", "compression.downlink=int8"))
    dim = int(s.cfg["model"]["proxy_dim"])
    sent = {"counts": np.array([3] + [0] * (s.num_classes - 1), np.int64),
            "class.0": rng.normal(size=dim).astype(np.float32)}
    train_messages(s, sent, nodes=2)
    local = {"counts": sent["counts"], "class.0": rng.normal(size=dim).astype(np.float32)}
    reply = train_reply(1, local, 3)
    assert s.decode_reply(reply) is None
    np.testing.assert_array_equal(reply.content.array_records["arrays"]["class.0"].numpy(), local["class.0"])


def test_a_malformed_downlink_is_a_clear_error_on_the_client():
    s = strategy(FedAvg, "compression.downlink=int8")
    msg = train_messages(s)[0]
    encoded = {k: a.numpy() for k, a in msg.content.array_records["arrays"].items()}
    encoded["w|q"] = np.array([[0.0], [0.0]], np.float32)
    bad = Message(content=RecordDict({"arrays": record(encoded), "config": experiment(s.cfg)}),
                  dst_node_id=1, message_type="train")
    with pytest.raises(EncodingError, match=r"'arrays' does not follow compression.downlink=int8: 'w\|q'"):
        client_receives(bad)


def test_the_client_app_trains_from_the_decoded_arrays_and_local_dp_clips_against_them(tmp_path, monkeypatch):
    """The real ClientApp (without Ray), its training replaced by an update of 10 per entry: it
    trains from what it decoded, and LocalDpMod, after the downlink mod, clips the update to C
    against those same arrays."""
    from flwr.app import Context

    from pfedes import client_app
    from pfedes.methods import method_of
    from pfedes.models import resolve_architecture
    from pfedes.server_app import prepare

    loaded = {}

    def trained(trainer, arrays, *args):
        loaded.update({k: v.numpy().copy() for k, v in arrays.items()})
        return {k: v + 10.0 if v.is_floating_point() else v for k, v in arrays.items()}, {"num-examples": 5}

    monkeypatch.setattr(client_app, "train_round", trained)
    cfg = prepare(make_cfg("strategy=fedavg", "num_clients=3", "compression.downlink=int8", "privacy.mode=local",
                           "privacy.noise_multiplier=1e-9", "privacy.clipping_norm=2.0", f"out_dir={tmp_path}"))
    cfg["run_token"] = "downlink"
    arch = resolve_architecture("phone", cfg["model"]["profiles"])
    initial = {k: v.numpy() for k, v in method_of(cfg).trainer.initial_shared(cfg, arch, 10).items()}
    s = FedAvg(cfg)
    msg = train_messages(s, initial)[0]
    context = Context(run_id=1, node_id=1, node_config={"partition-id": 0, "num-partitions": 3},
                      state=RecordDict(), run_config={})
    reply = client_app.app(msg, context)
    assert not reply.has_error()
    received = s.received_by(msg.metadata.dst_node_id)
    assert loaded.keys() == received.keys() == initial.keys()
    for key, value in received.items():
        np.testing.assert_array_equal(loaded[key], value)
    arrays = {k: a.numpy() for k, a in reply.content["arrays"].items()}
    norm = float(np.sqrt(sum(((arrays[k] - v) ** 2).sum() for k, v in received.items() if v.dtype.kind == "f")))
    assert norm == pytest.approx(2.0, rel=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("method, extra", [("pfedes", ["strategy.warmup_steps=0"]),
                                           ("fedavg", ["clients.devices=[phone]"])])  # one architecture
def test_an_int8_downlink_simulation_sends_fewer_bytes_and_drops_no_client(tmp_path, method, extra):
    from pfedes.sim import simulate

    common = ["num_clients=3", "num_rounds=2", "data.samples_per_client=150", f"strategy={method}", *extra]
    down = {}
    for mode in ("none", "int8"):
        out = tmp_path / mode
        simulate(make_cfg(*common, f"compression.downlink={mode}", f"out_dir={out}"))
        rounds = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert all(r["clients_trained"] == 3 and r["clients_dropped"] == 0 for r in rounds)
        down[mode] = rounds[-1]["bytes_down_per_client"]
    assert down["int8"] < 0.3 * down["none"], down
